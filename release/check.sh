#!/usr/bin/env bash
# Installs each release artifact as a user would, somewhere outside the
# checkout, and uses it: the wheel into a fresh virtual environment and the
# npm tarballs into an empty project with cargo, rustc, CMake and every
# compiler hidden from PATH; the C tarball unpacked and built against
# (CMake package and pkg-config) with cargo and rustc hidden. Each runs the
# smoke test of release/smoke/: CP-ABE on CIRCL's bytes (vectors/shared.kfv),
# wrap and open, and a signature made in the key process that an outside
# library verifies (pyca/cryptography, Node's crypto, the openssl command).
# Then one version everywhere, the licences inside every artifact, the
# manylinux tag, and the sizes.
#
# Usage: release/check.sh DIST_DIR   (the output of release/dist.sh;
#        environment: CARGO_TARGET_DIR for `keyfence --version`)
set -euo pipefail
# A failure inside $(...) fails the script too.
shopt -s inherit_errexit
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIST="$(cd "$1" && pwd)"
SMOKE="$ROOT/release/smoke"
VERSION="$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["workspace"]["package"]["version"])' "$ROOT/Cargo.toml")"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/keyfence-release-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "release check: $*" >&2; exit 1; }
say() { echo "release check [${SECONDS}s]: $*"; }

one() {
    local matches=("$DIST"/$1)
    [ "${#matches[@]}" = 1 ] && [ -f "${matches[0]}" ] || fail "expected one $1 in $DIST, found: ${matches[*]}"
    echo "${matches[0]}"
}
WHEEL="$(one "keyfence-$VERSION-*manylinux*_x86_64.whl")"
NPM_MAIN="$(one "keyfence-$VERSION.tgz")"
NPM_PLATFORM="$(one "keyfence-linux-x64-gnu-$VERSION.tgz")"
C_TARBALL="$(one "keyfence-$VERSION-linux-x86_64.tar.gz")"
SDIST="$(one "keyfence-$VERSION.tar.gz")"
one "keyfence-$VERSION.crate" >/dev/null
one "keyfence-policy-$VERSION.crate" >/dev/null
(cd "$DIST" && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS does not match the artifacts"

python3 "$SMOKE/vector.py" "$ROOT/vectors/shared.kfv" "$WORK/vectors"

# A PATH holding only the named programs: what a machine without a Rust
# toolchain, CMake or a compiler has.
toolchain=(cargo rustc rustup cmake ninja make cc gcc g++ c++ clang clang++ ld)
bare_path() {
    local dir="$WORK/bin-$1" tool
    shift
    mkdir -p "$dir"
    # A name is looked up on PATH; a path is linked under its own name.
    for tool in "$@"; do ln -sf "$(readlink -f "$(command -v "$tool")")" "$dir/$(basename "$tool")"; done
    for tool in "${toolchain[@]}"; do
        if PATH="$dir" command -v "$tool" >/dev/null 2>&1; then fail "$tool is still on the bare PATH $dir"; fi
    done
    echo "$dir"
}
# No path of the machine that built it in any shipped file, binaries
# included (a panic's location, an assertion's file name, debug
# information): the checkout, the target directory, Cargo's home, where the
# dependencies' sources are. `./x` builds with the maps that make them
# relative (x: build_path_maps).
no_build_paths() { # no_build_paths DIR WHAT
    local found
    found="$(grep -rla -e "$ROOT/" -e "${CARGO_TARGET_DIR:-$ROOT/target}/" -e "${CARGO_HOME:-$HOME/.cargo}/" "$1" || true)"
    if [ -n "$found" ]; then
        printf '%s\n' "$found" >&2
        fail "$2 names the build machine's paths (in the files above)"
    fi
}

# The interpreter itself, not a version manager's shim that needs a PATH.
PYTHON="$(python3 -c 'import os, sys; print(os.path.realpath(sys.executable))')"

say "the wheel: auditwheel and contents"
"$PY_VENV/bin/auditwheel" show "$WHEEL" >"$WORK/auditwheel.txt"
# (auditwheel wraps its sentences: joined before matching.)
tr -s ' \n' '  ' <"$WORK/auditwheel.txt" | grep -Eq 'consistent with the following platform tag: "manylinux_[0-9]+_[0-9]+_x86_64"' ||
    { cat "$WORK/auditwheel.txt"; fail "auditwheel reports no manylinux tag for $WHEEL"; }
wheel_files="$("$PYTHON" -m zipfile -l "$WHEEL")"
"$PYTHON" -m zipfile -e "$WHEEL" "$WORK/wheel-files"
no_build_paths "$WORK/wheel-files" "the wheel"
for f in keyfence/_core keyfence/libkeyfence.so.0 keyfence/keyfence-key-process \
         keyfence/LICENSE-APACHE keyfence/LICENSE-MIT keyfence/THIRD-PARTY-NOTICES.txt; do
    grep -q "$f" <<<"$wheel_files" || fail "the wheel lacks $f"
done

say "the wheel: a fresh venv, no toolchain on PATH"
bin="$(bare_path py "$PYTHON")"
ln -sf "$(basename "$PYTHON")" "$bin/python3"
PATH="$bin" python3 -m venv "$WORK/venv"
PATH="$WORK/venv/bin:$bin" "$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check \
    --only-binary=:all: "$WHEEL" "cryptography>=41"
mkdir -p "$WORK/py"
py_version="$(cd "$WORK/py" && env -u LD_LIBRARY_PATH -u PYTHONPATH PATH="$WORK/venv/bin:$bin" \
    "$WORK/venv/bin/python" "$SMOKE/smoke.py" "$WORK/vectors" "$WORK/py")"

say "the sdist: unpacked and built into a wheel by pip, as from source"
# Unpacked in the target directory, always at one path: cargo keys the
# workspace's crates by where they are, so a fresh directory each run would
# compile them again and leave the old build behind. The toolchain stays on
# PATH: building from source needs it. A debug build: what is checked is
# that the sdist holds all a build reads, and a debug build reuses the
# dependencies (BoringSSL among them) that the Rust tests compiled, where
# a release build would compile the core once more. The wheel is thrown away.
target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
sdist_build="$target_dir/sdist-build"
rm -rf "$sdist_build/src" "$sdist_build/wheel" && mkdir -p "$sdist_build/src"
tar -C "$sdist_build/src" -xzf "$SDIST"
sdist_root="$sdist_build/src/keyfence-$VERSION"
for f in PKG-INFO pyproject.toml workspace/Cargo.lock workspace/CMakeLists.txt \
         workspace/LICENSE-APACHE workspace/LICENSE-MIT workspace/THIRD-PARTY-NOTICES.txt; do
    [ -f "$sdist_root/$f" ] || fail "the sdist lacks $f"
done
CARGO_TARGET_DIR="$target_dir" "$PY_VENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps \
    --no-build-isolation --config-settings=build-dir="$sdist_build/cmake" --config-settings=cmake.build-type=Debug \
    -w "$sdist_build/wheel" "$sdist_root" ||
    fail "pip cannot build a wheel from the sdist"
# The same package files as the shipped wheel (auditwheel adds only its records).
package_files() { "$PYTHON" -m zipfile -l "$1" | awk '{print $1}' | grep '^keyfence/' | grep -v -e '^keyfence\.libs/' -e '/$' | sort; }
diff <(package_files "$sdist_build"/wheel/keyfence-"$VERSION"-*.whl) <(package_files "$WHEEL") ||
    fail "the wheel built from the sdist holds other files than the shipped wheel (diff above)"

say "npm: install the two tarballs into an empty project, offline, no toolchain on PATH"
bin="$(bare_path node node npm)"
mkdir -p "$WORK/node-project"
echo '{ "name": "consumer", "version": "1.0.0", "private": true }' >"$WORK/node-project/package.json"
(cd "$WORK/node-project" && env -u LD_LIBRARY_PATH PATH="$bin" npm install -q --offline --no-audit --no-fund \
    "$NPM_MAIN" "$NPM_PLATFORM" >/dev/null)
for f in keyfence/index.d.ts keyfence/LICENSE-APACHE keyfence/THIRD-PARTY-NOTICES.txt \
         keyfence-linux-x64-gnu/keyfence.linux-x64-gnu.node keyfence-linux-x64-gnu/keyfence-key-process \
         keyfence-linux-x64-gnu/LICENSE-MIT keyfence-linux-x64-gnu/THIRD-PARTY-NOTICES.txt; do
    [ -e "$WORK/node-project/node_modules/$f" ] || fail "the installed npm packages lack $f"
done
no_build_paths "$WORK/node-project/node_modules/keyfence" "the npm package"
no_build_paths "$WORK/node-project/node_modules/keyfence-linux-x64-gnu" "the npm platform package"
mkdir -p "$WORK/node"
node_version="$(cd "$WORK/node-project" && env -u LD_LIBRARY_PATH PATH="$bin" node "$SMOKE/smoke.js" "$WORK/vectors" "$WORK/node")"
# The types: a TypeScript consumer compiles against the installed package.
cp "$SMOKE/smoke.ts" "$WORK/node-project/"
(cd "$WORK/node-project" && PATH="$bin" node "$ROOT/bindings/node/node_modules/typescript/bin/tsc" --noEmit --strict \
    --module commonjs --target es2022 --esModuleInterop \
    --typeRoots "$ROOT/bindings/node/node_modules/@types" --types node smoke.ts) ||
    fail "the installed package's types do not check"

say "C: the tarball unpacked outside the checkout, built against with cargo and rustc hidden"
tar -C "$WORK" -xzf "$C_TARBALL"
prefix="$WORK/keyfence-$VERSION-linux-x86_64"
for f in include/keyfence.h lib/libkeyfence.so."$VERSION" lib/libkeyfence.a lib/keyfence-key-process \
         lib/cmake/keyfence/keyfenceConfig.cmake lib/pkgconfig/keyfence.pc \
         share/doc/keyfence/LICENSE-APACHE share/doc/keyfence/LICENSE-MIT \
         share/doc/keyfence/THIRD-PARTY-NOTICES.txt share/doc/keyfence/CHANGELOG.md \
         share/keyfence/systemd/keyfence-agent.service share/keyfence/systemd/keyfence-agent.socket \
         share/keyfence/systemd/keyfence-serve.service share/keyfence/systemd/sysusers.d/keyfence.conf; do
    [ -e "$prefix/$f" ] || fail "the C tarball lacks $f"
done
# Relocatable: no path of the machine that built it.
no_build_paths "$prefix" "the C tarball"
c_path="$(printf %s "$PATH" | tr : '\n' | grep -v -e '\.cargo/bin' -e '\.rustup' | paste -sd:)"
for tool in cargo rustc; do
    if PATH="$c_path" command -v "$tool" >/dev/null 2>&1; then fail "$tool is on the C consumer's PATH"; fi
done
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$WORK/c-key.pem" 2>/dev/null
openssl pkey -in "$WORK/c-key.pem" -pubout -out "$WORK/c-pub.pem"
printf 'release smoke test' >"$WORK/c-data"
mkdir -p "$WORK/c" "$WORK/c-pc"
(
    export PATH="$c_path"
    unset LD_LIBRARY_PATH CARGO_TARGET_DIR
    cmake -S "$SMOKE/c" -B "$WORK/c-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
        -DKEYFENCE_EXPECTED_VERSION="$VERSION" >/dev/null
    cmake --build "$WORK/c-build" >/dev/null
    # pkg-config, with the RUNPATH the user sets when linking by hand.
    cc -std=c99 -Wall -Wextra -Werror "$SMOKE/c/smoke.c" \
        $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs keyfence) \
        -Wl,-rpath,"$prefix/lib" -o "$WORK/c-pc/smoke"
)
c_version="$(cd "$WORK/c" && env -u LD_LIBRARY_PATH PATH="$c_path" \
    "$WORK/c-build/smoke" "$prefix" "$WORK/vectors" "$WORK/c" "$WORK/c-key.pem" "$WORK/c-sig")"
openssl dgst -sha256 -verify "$WORK/c-pub.pem" -signature "$WORK/c-sig" "$WORK/c-data" >/dev/null ||
    fail "openssl refuses the C smoke test's signature"
(cd "$WORK/c-pc" && env -u LD_LIBRARY_PATH PATH="$c_path" \
    "$WORK/c-pc/smoke" "$prefix" "$WORK/vectors" "$WORK/c-pc" "$WORK/c-key.pem" "$WORK/c-pc-sig" >/dev/null)
openssl dgst -sha256 -verify "$WORK/c-pub.pem" -signature "$WORK/c-pc-sig" "$WORK/c-data" >/dev/null ||
    fail "openssl refuses the pkg-config smoke test's signature"

say "one version: $VERSION"
check_version() { [ "$2" = "$VERSION" ] || fail "$1 says $2, the workspace $VERSION"; }
check_version "keyfence.__version__ (wheel)" "$py_version"
check_version "the wheel's metadata" "$("$WORK/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("keyfence"))')"
check_version "kf.version() (npm)" "$node_version"
for p in keyfence keyfence-linux-x64-gnu; do
    check_version "node_modules/$p/package.json" \
        "$(node -p "require('$WORK/node-project/node_modules/$p/package.json').version")"
done
check_version "the platform package named by optionalDependencies" \
    "$(node -p "require('$WORK/node-project/node_modules/keyfence/package.json').optionalDependencies['keyfence-linux-x64-gnu']")"
check_version "keyfence_version() (C tarball)" "$c_version"
check_version "keyfence.pc" "$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --modversion keyfence)"
cli="${CARGO_TARGET_DIR:-$ROOT/target}/release/keyfence"
if [ -x "$cli" ]; then
    check_version "keyfence --version" "$("$cli" --version | awk '{print $2}')"
else
    fail "no release command line at $cli to ask its version"
fi

say "one repository address"
repo="$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["workspace"]["package"]["repository"])' "$ROOT/Cargo.toml")"
"$WORK/venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(f"Repository, {sys.argv[1]}" not in m.metadata("keyfence").get_all("Project-URL"))' "$repo" ||
    fail "the wheel's Project-URL Repository is not $repo"
for p in keyfence keyfence-linux-x64-gnu; do
    [ "$(node -p "require('$WORK/node-project/node_modules/$p/package.json').repository.url")" = "git+$repo.git" ] ||
        fail "node_modules/$p/package.json names another repository than $repo"
done
for crate in keyfence keyfence-policy; do
    tar -xzOf "$DIST/$crate-$VERSION.crate" "$crate-$VERSION/Cargo.toml" | grep -qxF "repository = \"$repo\"" ||
        fail "the $crate crate names another repository than $repo"
done

say "sizes"
(cd "$DIST" && du -k keyfence* | sort -k2)
say "all artifacts install and work"
