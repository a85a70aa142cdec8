#!/usr/bin/env bash
# Installs each release artifact as a user would, somewhere outside the
# checkout, and uses it: the wheel into a fresh virtual environment and the
# npm tarballs into an empty project with cargo, rustc, CMake and every
# compiler hidden from PATH; the C tarball unpacked and built against
# (CMake package and pkg-config) with cargo and rustc hidden. Each runs the
# smoke test of release/smoke/: CP-ABE on CIRCL's bytes (vectors/shared.kfv),
# wrap and open, and a signature made in the key process that an outside
# library verifies (pyca/cryptography, Node's crypto, the openssl command).
# The Debian package is installed by dpkg into a scratch root, postinst
# included; its units are verified there as installed (systemd-analyze),
# its command line and provider sign from its folders alone, and lintian
# reports no error; its maintainer scripts are run by dpkg through an
# install, an upgrade, a remove, a purge and a reinstall, and by hand as
# under systemd (a mount namespace, systemctl stubbed).
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
DEB="$(one "keyfence_${VERSION}_amd64.deb")"
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
# dependencies (AWS-LC among them) that the Rust tests compiled, where
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
         share/keyfence/systemd/keyfence-serve.service share/keyfence/systemd/sysusers.d/keyfence.conf \
         share/keyfence/systemd/tmpfiles.d/keyfence.conf; do
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

say "the Debian package: installed into a scratch root, its units verified as installed, lintian"
# dpkg itself installs it, postinst included, into a root of its own: the
# maintainer scripts run outside a chroot with DPKG_ROOT naming the root
# (--force-script-chrootless), the libraries it depends on are the
# machine's (--force-depends). Only root can give files their owners.
deb_root="$WORK/deb-root"
mkdir -p "$deb_root/etc" "$deb_root/var/lib/dpkg/updates" "$deb_root/var/lib/dpkg/info"
touch "$deb_root/var/lib/dpkg/status"
if [ "$(id -u)" = 0 ]; then
    dpkg --root="$deb_root" --log=/dev/null --force-script-chrootless --force-depends -i "$DEB" >"$WORK/dpkg.log" 2>&1 ||
        { cat "$WORK/dpkg.log"; fail "dpkg cannot install $DEB into a scratch root"; }
    # The postinst made the system user and its folders.
    kf_uid="$(awk -F: '$1 == "keyfence" { print $3 }' "$deb_root/etc/passwd")"
    [ -n "$kf_uid" ] || fail "the package's postinst made no user keyfence (systemd-sysusers)"
    [ "$(stat -c '%u %a' "$deb_root/run/keyfence")" = "$kf_uid 755" ] ||
        fail "/run/keyfence is not keyfence's, mode 755, after the postinst (tmpfiles.d): $(stat -c '%u %a' "$deb_root/run/keyfence")"
    [ "$(stat -c '%u %a' "$deb_root/var/lib/keyfence")" = "$kf_uid 700" ] ||
        fail "/var/lib/keyfence is not keyfence's, mode 700, after the postinst (tmpfiles.d)"
else
    echo "release check: not root: the package is unpacked (dpkg-deb -x), its postinst not run"
    dpkg-deb -x "$DEB" "$deb_root"
fi
[ "$(dpkg-deb -f "$DEB" Version)" = "$VERSION" ] || fail "the package's version is $(dpkg-deb -f "$DEB" Version)"
multiarch=usr/lib/x86_64-linux-gnu
for f in usr/bin/keyfence "$multiarch/ossl-modules/keyfence.so" "$multiarch/libkeyfence.so.0" \
         "$multiarch/keyfence-key-process" usr/lib/sysusers.d/keyfence.conf usr/lib/tmpfiles.d/keyfence.conf \
         usr/share/doc/keyfence/copyright usr/share/doc/keyfence/changelog.gz usr/share/man/man1/keyfence.1.gz \
         usr/share/doc/keyfence/examples/keyfence-agent.service.d/softhsm.conf; do
    [ -e "$deb_root/$f" ] || fail "the Debian package lacks /$f"
done
units=(keyfence-agent.socket keyfence-agent.service keyfence-serve.service)
for u in "${units[@]}"; do
    cmp -s "$deb_root/lib/systemd/system/$u" "$ROOT/bindings/cli/systemd/$u" ||
        fail "the package's /lib/systemd/system/$u is not bindings/cli/systemd/$u"
done
no_build_paths "$deb_root" "the Debian package"
# The units as installed, unmodified: their ExecStart is the package's
# /usr/bin/keyfence. The root also holds this machine's systemd units
# (sysinit.target, sockets.target...), as the machine it is installed on
# would; any warning fails.
mkdir -p "$deb_root/usr/lib/systemd/system"
(cd /lib/systemd/system && tar --exclude='keyfence*' -cf - .) | tar -C "$deb_root/usr/lib/systemd/system" -xf -
# ... and /bin/kill, the agent unit's ExecReload, from procps, which the
# package depends on.
dpkg-deb -f "$DEB" Depends | grep -qw procps || fail "the Debian package does not depend on procps, whose /bin/kill its agent unit's ExecReload runs"
mkdir -p "$deb_root/bin" && cp /bin/kill "$deb_root/bin/kill"
verify_units() { # verify_units WHAT: fails on an error or a warning
    if ! systemd-analyze verify --root="$deb_root" "${units[@]}" 2>"$WORK/verify.err" || [ -s "$WORK/verify.err" ]; then
        cat "$WORK/verify.err" >&2
        fail "systemd-analyze verify: the installed units $1 do not verify cleanly (above)"
    fi
}
verify_units ""
# ... and with the SoftHSM2 drop-in in place, as docs/deploy.md puts it.
dropins="$deb_root/etc/systemd/system/keyfence-agent.service.d"
mkdir -p "$dropins"
cp "$deb_root/usr/share/doc/keyfence/examples/keyfence-agent.service.d/softhsm.conf" "$dropins/"
verify_units "with the SoftHSM2 drop-in"
# The control: a spoiled drop-in is seen, so the units verified above are
# the scratch root's, drop-ins and all.
printf '[Service]\nProtectSystem=sometimes\n' >"$dropins/zz-spoiled.conf"
systemd-analyze verify --root="$deb_root" keyfence-agent.service 2>"$WORK/verify.err" || true
[ -s "$WORK/verify.err" ] || fail "systemd-analyze verify --root did not see a spoiled drop-in in the scratch root"
rm "$dropins/zz-spoiled.conf"
# The provider, from the package's folders only: libkeyfence through its
# RUNPATH, the key process beside libkeyfence (a key file signed with in
# isolation), the command line's own key process (`keyfence key-process`).
deb_cli="$deb_root/usr/bin/keyfence"
deb_version="$("$deb_cli" --version | awk '{print $2}')"
provider_libs="$(env -u LD_LIBRARY_PATH ldd "$deb_root/$multiarch/ossl-modules/keyfence.so")"
grep -qF "=> $deb_root/$multiarch/ossl-modules/../libkeyfence.so.0 " <<<"$provider_libs" ||
    { echo "$provider_libs"; fail "the package's provider does not load the package's libkeyfence"; }
env -u LD_LIBRARY_PATH -u OPENSSL_CONF openssl list -providers -provider-path "$deb_root/$multiarch/ossl-modules" \
    -provider keyfence >"$WORK/providers.txt" || fail "openssl cannot load the package's provider"
grep -q '^  keyfence$' "$WORK/providers.txt" || { cat "$WORK/providers.txt"; fail "openssl lists no keyfence provider"; }
mkdir -p "$WORK/deb"
# (Not `( ... ) || fail`: bash runs such a subshell without errexit.)
(
    cd "$WORK/deb"
    export PATH="$deb_root/usr/bin:$PATH"
    unset LD_LIBRARY_PATH OPENSSL_CONF
    keyfence authority init --store store >/dev/null
    keyfence authority issue --store store --attrs country=US --out us.machine >/dev/null
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out key.pem 2>/dev/null
    openssl pkey -in key.pem -pubout -out key.pub
    keyfence authority wrap --store store --policy 'country: US' --in key.pem --out key.env >/dev/null
    printf 'signed through the packaged provider' >msg
    keyfence sign --isolated --key key.pem --alg ecdsa-p256-sha256 --in msg --out cli.sig
    openssl dgst -sha256 -verify key.pub -signature cli.sig msg >/dev/null
    keyfence provider-key --envelope key.env --store store --machine-key us.machine --out key.kfk
    keyfence provider-config --module "$deb_root/$multiarch/ossl-modules/keyfence.so" --isolated >openssl.cnf
    # The include the package ships names the module where it is installed,
    # and provider-check follows it from an openssl.cnf as the page adds it.
    grep -qxF "module = /usr/lib/x86_64-linux-gnu/ossl-modules/keyfence.so" "$deb_root/etc/keyfence/openssl-include.cnf"
    sed "s|/usr/lib/x86_64-linux-gnu/|$deb_root/$multiarch/|" "$deb_root/etc/keyfence/openssl-include.cnf" >include.cnf
    printf '.include %s\n' "$PWD/include.cnf" >system.cnf
    keyfence provider-check --config system.cnf >/dev/null
    OPENSSL_CONF="$PWD/openssl.cnf" openssl dgst -sha256 -sign key.kfk -out provider.sig msg
    openssl dgst -sha256 -verify key.pub -signature provider.sig msg >/dev/null
)
# lintian: no error (its warnings are overridden in the package, each with
# its reason, or shown here).
lintian --display-info --show-overrides "$DEB" >"$WORK/lintian.txt" 2>&1 ||
    { cat "$WORK/lintian.txt"; fail "lintian reports errors in $DEB"; }
grep -v '^running with root privileges' "$WORK/lintian.txt" || true

say "the Debian package's maintainer scripts: install, upgrade, remove, purge, reinstall (dpkg --root)"
# dpkg runs the scripts as on a sysadmin's machine, but in a root of its
# own (DPKG_ROOT), where they must not touch this machine's systemd: what
# they do is checked in the root's files. Then the systemd branch, which
# DPKG_ROOT skips, by running the scripts themselves below.
conffile="$ROOT/bindings/cli/systemd/default/keyfence"
# The unit's default for the agent (no /etc/default/keyfence: the C
# tarball's units) is the conffile's.
unit_default="$(sed -n 's/^Environment="KEYFENCE_AGENT_OPTIONS=\(.*\)"$/\1/p' "$ROOT/bindings/cli/systemd/keyfence-agent.service")"
file_default="$(sed -n 's/^KEYFENCE_AGENT_OPTIONS="\(.*\)"$/\1/p' "$conffile")"
[ -n "$unit_default" ] && [ "$unit_default" = "$file_default" ] ||
    fail "keyfence-agent.service's default KEYFENCE_AGENT_OPTIONS ($unit_default) is not /etc/default/keyfence's ($file_default)"
if [ "$(id -u)" != 0 ]; then
    [ "${KEYFENCE_REQUIRE_ROOT:-0}" != 1 ] || fail "not root: the maintainer scripts cannot be run (KEYFENCE_REQUIRE_ROOT=1)"
    echo "release check: not root: the maintainer scripts are not run"
else
    mroot="$WORK/maint-root"
    mkdir -p "$mroot/etc" "$mroot/var/lib/dpkg/updates" "$mroot/var/lib/dpkg/info"
    touch "$mroot/var/lib/dpkg/status"
    # mdpkg WHAT DPKG-ARGS...: no terminal to answer a prompt on (a
    # conffile question fails the step).
    mdpkg() {
        local what="$1"
        shift
        dpkg --root="$mroot" --log=/dev/null --force-script-chrootless --force-depends "$@" </dev/null \
            >"$WORK/maint-dpkg.log" 2>&1 || { cat "$WORK/maint-dpkg.log"; fail "dpkg cannot $what"; }
        if grep -q "Configuration file '/etc/default/keyfence'" "$WORK/maint-dpkg.log"; then
            cat "$WORK/maint-dpkg.log"
            fail "dpkg asked about /etc/default/keyfence at $what"
        fi
    }
    status_is() { # status_is WHAT "STATUS VERSION" (or not-installed)
        local status
        status="$(dpkg-query --admindir="$mroot/var/lib/dpkg" -W -f='${db:Status-Status} ${Version}' keyfence 2>/dev/null)" ||
            status=not-installed
        [ "$status" = "$2" ] || fail "after $1, the scratch root's keyfence is '$status', not '$2'"
    }
    systemd_dir="$mroot/etc/systemd/system"
    links_to() { find "$systemd_dir" -type l -name 'keyfence-*' 2>/dev/null | sort; }

    mdpkg "install $DEB" -i "$DEB"
    status_is install "installed $VERSION"
    cmp -s "$mroot/etc/default/keyfence" "$conffile" || fail "the installed /etc/default/keyfence is not bindings/cli/systemd/default/keyfence"
    dpkg-query --admindir="$mroot/var/lib/dpkg" -W -f='${Conffiles}' keyfence |
        grep -qxF " /etc/default/keyfence $(md5sum <"$conffile" | cut -d' ' -f1)" ||
        fail "dpkg does not hold /etc/default/keyfence as a conffile"
    ! grep -q '  etc/' "$mroot/var/lib/dpkg/info/keyfence.md5sums" || fail "md5sums lists a conffile (dpkg keeps their sums)"
    # Nothing enabled; every link an enable would make is recorded, for
    # the purge to remove.
    [ -z "$(links_to)" ] || fail "the install enabled units: $(links_to)"
    grep -qxF /etc/systemd/system/sockets.target.wants/keyfence-agent.socket \
        "$mroot/var/lib/systemd/deb-systemd-helper-enabled/keyfence-agent.socket.dsh-also" ||
        fail "deb-systemd-helper holds no state of keyfence-agent.socket after the install"

    # The sysadmin: the socket enabled, HAProxy allowed, the machine's key
    # and store in place, and a link of their own to the socket that no
    # state records (systemctl add-wants), which the purge must not leave
    # dangling.
    systemctl --root="$mroot" --quiet enable keyfence-agent.socket 2>/dev/null ||
        fail "systemctl --root cannot enable the installed keyfence-agent.socket"
    sed -i 's/^KEYFENCE_AGENT_OPTIONS=.*/KEYFENCE_AGENT_OPTIONS="--allow-user www-data --allow-user haproxy"/' "$mroot/etc/default/keyfence"
    cp "$mroot/etc/default/keyfence" "$WORK/edited-default"
    mkdir -p "$mroot/etc/keyfence" "$mroot/var/lib/keyfence/store" "$systemd_dir/nginx.service.wants"
    echo machine-key >"$mroot/etc/keyfence/machine.key"
    echo store >"$mroot/var/lib/keyfence/store/planted"
    ln -s /lib/systemd/system/keyfence-agent.socket "$systemd_dir/nginx.service.wants/keyfence-agent.socket"
    enabled="$systemd_dir/sockets.target.wants/keyfence-agent.socket"
    [ -L "$enabled" ] || fail "systemctl --root enable made no $enabled"

    # An upgrade: the same package as the next version.
    dpkg-deb -R "$DEB" "$WORK/bumped"
    sed -i "s/^Version: .*/Version: $VERSION+1/" "$WORK/bumped/DEBIAN/control"
    dpkg-deb --root-owner-group -Znone -b "$WORK/bumped" "$WORK/keyfence_bumped.deb" >/dev/null
    rm -rf "$WORK/bumped"
    mdpkg "upgrade to $VERSION+1" -i "$WORK/keyfence_bumped.deb"
    status_is upgrade "installed $VERSION+1"
    cmp -s "$mroot/etc/default/keyfence" "$WORK/edited-default" || fail "the upgrade did not keep the sysadmin's /etc/default/keyfence"
    [ -L "$enabled" ] || fail "the upgrade disabled keyfence-agent.socket"

    # remove: the units' files go, the sysadmin's choices stay.
    mdpkg remove -r keyfence
    status_is remove "config-files $VERSION+1"
    [ ! -e "$mroot/usr/bin/keyfence" ] && [ ! -e "$mroot/lib/systemd/system/keyfence-agent.socket" ] ||
        fail "the remove left the package's files"
    cmp -s "$mroot/etc/default/keyfence" "$WORK/edited-default" || fail "the remove did not keep /etc/default/keyfence"
    [ -L "$enabled" ] || fail "the remove forgot that keyfence-agent.socket was enabled"

    # purge: the conffile and every link to the units go; the keys stay.
    mdpkg purge --purge keyfence
    status_is purge not-installed
    left="$(find "$mroot" -name '*keyfence*' | sed "s|^$mroot||" | sort | paste -sd' ')"
    [ "$left" = "/etc/keyfence /run/keyfence /var/lib/keyfence" ] ||
        fail "after the purge the scratch root holds: $left (only /etc/keyfence, /run/keyfence and /var/lib/keyfence should stay)"
    [ "$(cat "$mroot/etc/keyfence/machine.key")" = machine-key ] && [ "$(cat "$mroot/var/lib/keyfence/store/planted")" = store ] ||
        fail "the purge changed the machine key or the store"
    [ -z "$(find "$mroot/var/lib/systemd" -name 'keyfence*' 2>/dev/null)" ] || fail "the purge left deb-systemd-helper's state"

    # Installed again: as new, the keys the purge kept still there.
    mdpkg "install $DEB again after the purge" -i "$DEB"
    status_is reinstall "installed $VERSION"
    cmp -s "$mroot/etc/default/keyfence" "$conffile" || fail "the reinstall did not ship /etc/default/keyfence afresh"
    [ "$(grep -c '^keyfence:' "$mroot/etc/passwd")" = 1 ] || fail "the reinstall made the user keyfence twice"
    m_uid="$(awk -F: '$1 == "keyfence" { print $3 }' "$mroot/etc/passwd")"
    [ "$(stat -c '%u %a' "$mroot/var/lib/keyfence")" = "$m_uid 700" ] && [ -f "$mroot/var/lib/keyfence/store/planted" ] ||
        fail "/var/lib/keyfence after the reinstall: $(stat -c '%u %a' "$mroot/var/lib/keyfence"), keyfence is $m_uid"
    [ -z "$(links_to)" ] || fail "the reinstall enabled units: $(links_to)"

    say "the Debian package's maintainer scripts under systemd (unshare --mount, systemctl stubbed)"
    # The scripts as dpkg runs them on a machine booted with systemd:
    # /run/systemd/system exists, /etc/systemd/system is a scratch folder
    # here, and systemctl, deb-systemd-invoke, deb-systemd-helper and the
    # user and folder makers are stubs that log what they are asked
    # (deb-systemd-helper answering as DSH_INSTALLED says). A process that
    # maps the provider's file, then deleted, is what an upgrade leaves in
    # a server that loaded the old provider.
    sd="$WORK/maint-systemd"
    mkdir -p "$sd/bin" "$sd/etc-systemd" "$sd/ossl-modules" "$sd/otherroot"
    dpkg-deb -e "$DEB" "$sd/DEBIAN"
    for tool in systemctl deb-systemd-invoke deb-systemd-helper systemd-sysusers systemd-tmpfiles; do
        cat >"$sd/bin/$tool" <<'EOF'
#!/bin/sh
echo "${0##*/} $*" >>"$MAINT_LOG"
case "${0##*/} $1" in
    "deb-systemd-helper debian-installed" | "deb-systemd-helper --quiet") [ "$DSH_INSTALLED" = 1 ] ;;
esac
EOF
        chmod 755 "$sd/bin/$tool"
    done
    cp "$mroot/$multiarch/libkeyfence.so.$VERSION" "$sd/libkeyfence-copy.so"
    export MAINT_LOG="$sd/log" DPKG_MAINTSCRIPT_PACKAGE=keyfence
    : >"$MAINT_LOG"
    # Bounded: the holder sleeps 60 s at most, and is killed by its pid.
    timeout 60 unshare --mount --propagation private bash -euo pipefail -c '
        sd="$1" version="$2" python="$3" modules=/usr/lib/x86_64-linux-gnu/ossl-modules
        if [ -d /run/systemd ]; then mount -t tmpfs tmpfs /run/systemd; else mount -t tmpfs tmpfs /run; fi
        mkdir -p /run/systemd/system
        mount --bind "$sd/etc-systemd" /etc/systemd/system
        # No unit of this machine named keyfence-* (the package installed
        # here would make the planted links live).
        mount -t tmpfs tmpfs /lib/systemd/system
        [ -d "$modules" ] || { echo "no $modules here (libssl3) to stand for the provider'\''s folder" >&2; exit 1; }
        mount --bind "$sd/ossl-modules" "$modules"
        export PATH="$sd/bin:$PATH"
        step() { echo "== $1" >>"$MAINT_LOG"; }
        cp "$sd/libkeyfence-copy.so" "$modules/keyfence.so"
        "$python" -c "import ctypes, sys, time; ctypes.CDLL(sys.argv[1]); print(\"ready\", flush=True); time.sleep(60)" \
            "$modules/keyfence.so" >"$sd/holder.out" &
        holder=$!
        trap "kill $holder 2>/dev/null || true; wait $holder 2>/dev/null || true" EXIT
        echo "$holder" >"$sd/holder.pid"
        for _ in $(seq 100); do grep -q ready "$sd/holder.out" && break; sleep 0.1; done
        cat "/proc/$holder/comm" >"$sd/holder.comm"

        step install
        DSH_INSTALLED=0 "$sd/DEBIAN/postinst" configure "" >"$sd/install.out" 2>&1
        # The upgrade replaced the provider under the holder.
        rm "$modules/keyfence.so"
        step upgrade
        DSH_INSTALLED=1 "$sd/DEBIAN/postinst" configure "$version" >"$sd/upgrade.out" 2>&1
        step prerm-upgrade
        "$sd/DEBIAN/prerm" upgrade "$version+1"
        step remove
        "$sd/DEBIAN/prerm" remove
        "$sd/DEBIAN/postrm" remove
        # Links to the units: the enable link (deb-systemd-helper would
        # remove it; its stub does not), a hand-made one, both dangling
        # now, and one to a unit of the sysadmin'\''s own, which stays.
        etc=/etc/systemd/system
        mkdir -p "$etc/sockets.target.wants" "$etc/nginx.service.requires" "$etc/multi-user.target.wants"
        ln -s /lib/systemd/system/keyfence-agent.socket "$etc/sockets.target.wants/keyfence-agent.socket"
        ln -s /usr/lib/systemd/system/keyfence-agent.service "$etc/nginx.service.requires/keyfence-agent.service"
        echo "[Service]" >"$etc/keyfence-serve.service"
        ln -s "$etc/keyfence-serve.service" "$etc/multi-user.target.wants/keyfence-serve.service"
        step purge
        "$sd/DEBIAN/postrm" purge
        # dpkg --root: nothing asks this machine'\''s systemd, and the
        # holder (still running) is no process of that root'\''s.
        step dpkg-root
        DPKG_ROOT="$sd/otherroot" DSH_INSTALLED=1 "$sd/DEBIAN/postinst" configure "$version" >"$sd/dpkg-root.out" 2>&1
        DPKG_ROOT="$sd/otherroot" "$sd/DEBIAN/prerm" remove
        DPKG_ROOT="$sd/otherroot" "$sd/DEBIAN/postrm" remove
        step end
    ' maint "$sd" "$VERSION" "$PYTHON" || { cat "$MAINT_LOG"; fail "the maintainer scripts fail under systemd (log above)"; }
    unset MAINT_LOG DPKG_MAINTSCRIPT_PACKAGE
    holder="$(cat "$sd/holder.pid")"
    ! kill -0 "$holder" 2>/dev/null || fail "the holder process $holder outlived its namespace"
    # step NAME: the log's lines between "== NAME" and the next step.
    step_log() { awk -v s="== $1" '$0 == s { on = 1; next } /^== / { on = 0 } on' "$sd/log"; }
    in_order() { # in_order STEP LINE...: each line logged in STEP, in this order
        local log step="$1" at=0 n
        log="$(step_log "$1")"
        shift
        for line in "$@"; do
            n="$({ grep -nxF -- "$line" <<<"$log" || true; } | head -1 | cut -d: -f1)"
            [ -n "$n" ] && [ "$n" -gt "$at" ] || { echo "$log" >&2; fail "$step: not logged (in order): $line"; }
            at="$n"
        done
    }
    all_units="${units[*]}"
    in_order install "systemd-sysusers keyfence.conf" "systemd-tmpfiles --create keyfence.conf" \
        "deb-systemd-helper debian-installed keyfence-agent.socket" "deb-systemd-helper update-state keyfence-agent.socket" \
        "deb-systemd-helper update-state keyfence-agent.service" "deb-systemd-helper update-state keyfence-serve.service" \
        "systemctl --system daemon-reload" "deb-systemd-invoke try-restart $all_units"
    ! step_log install | grep -Eq ' (enable|start|restart) ' || fail "the install enables or starts units: $(step_log install)"
    in_order upgrade "deb-systemd-helper unmask keyfence-agent.socket" "deb-systemd-helper --quiet was-enabled keyfence-agent.socket" \
        "deb-systemd-helper enable keyfence-agent.socket" "deb-systemd-helper update-state keyfence-agent.socket" \
        "deb-systemd-helper update-state keyfence-serve.service" "systemctl --system daemon-reload" "deb-systemd-invoke try-restart $all_units"
    [ -z "$(step_log prerm-upgrade)" ] || fail "prerm upgrade stops units: $(step_log prerm-upgrade)"
    in_order remove "deb-systemd-invoke stop $all_units" "systemctl --system daemon-reload"
    ! step_log remove | grep -q 'deb-systemd-helper' || fail "the remove changes the units' enable state: $(step_log remove)"
    in_order purge "deb-systemd-helper purge $all_units" "deb-systemd-helper unmask $all_units"
    etc="$sd/etc-systemd"
    [ ! -L "$etc/sockets.target.wants/keyfence-agent.socket" ] && [ ! -L "$etc/nginx.service.requires/keyfence-agent.service" ] ||
        fail "the purge left links to the package's units: $(find "$etc" -type l | paste -sd' ')"
    [ -L "$etc/multi-user.target.wants/keyfence-serve.service" ] || fail "the purge removed a link to the sysadmin's own unit"
    ! step_log dpkg-root | grep -Eq '^(systemctl|deb-systemd-invoke) ' || fail "with DPKG_ROOT, the scripts ask this machine's systemd: $(step_log dpkg-root)"
    in_order dpkg-root "systemd-sysusers --root=$sd/otherroot keyfence.conf"
    # The stale library: named at the upgrade, not while the file was
    # there, not for another root.
    holder_comm="$(cat "$sd/holder.comm")"
    grep -qF "keyfence: these processes still use the old keyfence library; restart them: $holder_comm (pid $holder)" "$sd/upgrade.out" ||
        { cat "$sd/upgrade.out"; fail "the upgrade did not name the process ($holder_comm, $holder) still mapping the replaced provider"; }
    ! grep -q 'still use the old' "$sd/install.out" || { cat "$sd/install.out"; fail "a process mapping the live provider was named as stale"; }
    ! grep -q 'still use the old' "$sd/dpkg-root.out" || fail "with DPKG_ROOT, this machine's processes were named as stale"
fi

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
check_version "the Debian package's keyfence --version" "$deb_version"
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
[ "$(dpkg-deb -f "$DEB" Homepage)" = "$repo" ] || fail "the Debian package's Homepage is not $repo"
for crate in keyfence keyfence-policy; do
    tar -xzOf "$DIST/$crate-$VERSION.crate" "$crate-$VERSION/Cargo.toml" | grep -qxF "repository = \"$repo\"" ||
        fail "the $crate crate names another repository than $repo"
done

say "sizes"
(cd "$DIST" && du -k keyfence* | sort -k2)
say "all artifacts install and work"
