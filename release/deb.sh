#!/usr/bin/env bash
# The Debian package a sysadmin installs (`apt install ./keyfence_V_amd64.deb`;
# docs/deploy.md, "Install the package"), made with dpkg-deb from what the
# other artifacts are made of; nothing is compiled here:
#
#   /usr/bin/keyfence                         the release command line (its key
#                                             process is `keyfence key-process`)
#   /usr/lib/x86_64-linux-gnu/ossl-modules/keyfence.so
#                                             the OpenSSL provider, in Debian's
#                                             OpenSSL 3 module folder
#   /usr/lib/x86_64-linux-gnu/libkeyfence.so.0[.V]
#   /usr/lib/x86_64-linux-gnu/keyfence-key-process
#                                             what the provider loads: libkeyfence
#                                             (its RUNPATH, $ORIGIN/.., and the
#                                             default search path both find it), and
#                                             the key process, which libkeyfence
#                                             looks for beside itself
#   /lib/systemd/system/keyfence-agent.{socket,service}, keyfence-serve.service
#   /etc/default/keyfence                     the units' options (a conffile)
#   /etc/keyfence/openssl-include.cnf         what /etc/ssl/openssl.cnf includes to
#                                             load the provider (a conffile)
#   /usr/lib/sysusers.d/keyfence.conf, /usr/lib/tmpfiles.d/keyfence.conf
#   /usr/share/doc/keyfence/                  copyright (DEP-5), changelog,
#                                             THIRD-PARTY-NOTICES.txt, the SoftHSM2
#                                             drop-in example
#   /usr/share/man/man1/keyfence.1.gz         from the command line's --help
#
# No header and no libkeyfence.so link: building against keyfence is the C
# tarball's job. Debian would ship the library in a libkeyfence0 package of
# its own; one package is what a sysadmin installs here (the lintian
# overrides below say so).
#
# Usage: release/deb.sh OUT_DIR C_PREFIX CLI
#   C_PREFIX: the C library's `cmake --install` tree, stripped, with the
#   provider (release/dist.sh stages it); CLI: the release `keyfence`.
#   Environment: KEYFENCE_DEB_MAINTAINER ("Name <address>") names the
#   maintainer; SOURCE_DATE_EPOCH the date of the files (default: the last
#   commit's).
set -euo pipefail
shopt -s inherit_errexit
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(cd "$1" && pwd)"
PREFIX="$(cd "$2" && pwd)"
CLI="$3"
VERSION="$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["workspace"]["package"]["version"])' "$ROOT/Cargo.toml")"
REPO_URL="$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["workspace"]["package"]["repository"])' "$ROOT/Cargo.toml")"
MAINTAINER="${KEYFENCE_DEB_MAINTAINER:-The keyfence authors <keyfence@users.noreply.github.com>}"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || date +%s)}"
ARCH=amd64
TRIPLET=x86_64-linux-gnu
fail() { echo "deb: $*" >&2; exit 1; }

for f in "lib/libkeyfence.so.$VERSION" lib/keyfence-key-process lib/ossl-modules/keyfence.so; do
    [ -f "$PREFIX/$f" ] || fail "$PREFIX lacks $f (the provider is built only where CMake found OpenSSL 3's headers: libssl-dev)"
done
[ -x "$CLI" ] || fail "no command line at $CLI"
"$CLI" --version | grep -qxF "keyfence $VERSION" || fail "$CLI is not keyfence $VERSION"

# dpkg-shlibdeps reads debian/control and finds the package's own
# libraries in debian/PACKAGE: the package is built in that layout.
WORK="$(mktemp -d "${TMPDIR:-/tmp}/keyfence-deb.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
PKG="$WORK/debian/keyfence"
LIB="$PKG/usr/lib/$TRIPLET"
DOC="$PKG/usr/share/doc/keyfence"
SYSTEMD="$ROOT/bindings/cli/systemd"
install -d "$PKG/DEBIAN" "$PKG/usr/bin" "$LIB/ossl-modules" "$PKG/lib/systemd/system" \
    "$PKG/usr/lib/sysusers.d" "$PKG/usr/lib/tmpfiles.d" "$DOC/examples/keyfence-agent.service.d" \
    "$PKG/usr/share/man/man1" "$PKG/usr/share/lintian/overrides"

# Stripped as dh_strip strips (the C tarball keeps the symbol tables; a
# Debian package keeps them in a -dbgsym package, which this one has not).
install -m 755 "$CLI" "$PKG/usr/bin/keyfence"
install -m 755 "$PREFIX/lib/keyfence-key-process" "$LIB/keyfence-key-process"
strip --remove-section=.comment --remove-section=.note "$PKG/usr/bin/keyfence" "$LIB/keyfence-key-process"
install -m 644 "$PREFIX/lib/libkeyfence.so.$VERSION" "$LIB/"
ln -s "libkeyfence.so.$VERSION" "$LIB/libkeyfence.so.0"
install -m 644 "$PREFIX/lib/ossl-modules/keyfence.so" "$LIB/ossl-modules/keyfence.so"
strip --remove-section=.comment --remove-section=.note --strip-unneeded \
    "$LIB/libkeyfence.so.$VERSION" "$LIB/ossl-modules/keyfence.so"

install -m 644 "$SYSTEMD/keyfence-agent.socket" "$SYSTEMD/keyfence-agent.service" "$SYSTEMD/keyfence-serve.service" \
    "$PKG/lib/systemd/system/"
# The units' options (EnvironmentFile=): a conffile, like every file the
# package puts in /etc (DEBIAN/conffiles below).
install -D -m 644 "$SYSTEMD/default/keyfence" "$PKG/etc/default/keyfence"
# The .include docs/deploy.md adds to /etc/ssl/openssl.cnf, for the module
# where this package puts it, written by the command that documents it
# (a conffile too: an operator's edits survive upgrades).
install -d -m 755 "$PKG/etc/keyfence"
# (The command names a module that exists: the staged one, then the path it
# is installed at.)
"$CLI" provider-config --module "$LIB/ossl-modules/keyfence.so" --include |
    sed "s|^module = .*|module = /usr/lib/$TRIPLET/ossl-modules/keyfence.so|" >"$PKG/etc/keyfence/openssl-include.cnf"
grep -qxF "module = /usr/lib/$TRIPLET/ossl-modules/keyfence.so" "$PKG/etc/keyfence/openssl-include.cnf" ||
    fail "the packaged openssl-include.cnf names no module"
chmod 644 "$PKG/etc/keyfence/openssl-include.cnf"
install -m 644 "$SYSTEMD/sysusers.d/keyfence.conf" "$PKG/usr/lib/sysusers.d/keyfence.conf"
install -m 644 "$SYSTEMD/tmpfiles.d/keyfence.conf" "$PKG/usr/lib/tmpfiles.d/keyfence.conf"
install -m 644 "$SYSTEMD/keyfence-agent.service.d/softhsm.conf" "$DOC/examples/keyfence-agent.service.d/"
install -m 644 "$ROOT/THIRD-PARTY-NOTICES.txt" "$DOC/"
gzip -9n "$DOC/THIRD-PARTY-NOTICES.txt"

# copyright (DEP-5): keyfence's own licence, then every component compiled
# into the binaries, grouped by licence, from THIRD-PARTY-NOTICES.txt
# (release/notices.py writes it from Cargo.lock), whose texts it points to.
python3 - "$ROOT" "$REPO_URL" >"$DOC/copyright" <<'EOF'
import pathlib, re, sys
root, repo = pathlib.Path(sys.argv[1]), sys.argv[2]
notices = (root / "THIRD-PARTY-NOTICES.txt").read_text()
entry = re.compile(r"^(?P<name>\S+) (?P<version>\S+): (?:Copyright (?P<holder>[^,]+), )?(?P<expr>.*?) ?\[[0-9a-f, ]+\]$")
components, section = {}, None
for line in notices.splitlines():
    if line.startswith("Components compiled from C"):
        section = "c"
    elif line.startswith("Rust crates"):
        section = "rust"
    elif line.startswith("Licence and notice texts"):
        break
    elif section and (m := re.match(r"^AWS-LC \(in aws-lc-sys (\S+)\): \[", line)):
        # AWS-LC's LICENSE: Apache-2.0 or ISC for its own code, with the
        # OpenSSL and SSLeay licences of the code it keeps from OpenSSL.
        components[("AWS-LC", m.group(1))] = (None, "Apache-2.0 or ISC, and OpenSSL")
    elif section and (m := entry.match(line)):
        key = (m["name"], m["version"])
        if m["holder"] or key not in components:
            components[key] = (m["holder"], m["expr"])
if not components:
    sys.exit("deb: no components read from THIRD-PARTY-NOTICES.txt")

def dep5(expr: str) -> str:
    """An SPDX expression as DEP-5 writes it: `or`/`and`, exceptions as `with X exception`,
    and a comma where `and` binds a parenthesised `or`; the choices of a plain `or` sorted,
    so that `MIT OR Apache-2.0` and `Apache-2.0 OR MIT` are one licence."""
    expr = expr.replace("/", " OR ")
    expr = re.sub(r" WITH (\S+)-exception", r" with \1 exception", expr)
    m = re.fullmatch(r"\((.*)\) AND (.*)", expr)
    if m:
        return f"{dep5(m.group(1))}, and {dep5(m.group(2))}"
    if " AND " not in expr and "(" not in expr:
        return " or ".join(sorted(expr.split(" OR ")))
    return expr.replace(" OR ", " or ").replace(" AND ", " and ")

groups = {}
for (name, version), (holder, expr) in sorted(components.items(), key=lambda kv: (kv[0][0].lower(), kv[0][1])):
    groups.setdefault((dep5(expr), holder), []).append(f"{name}-{version}")
# keyfence's own copyright line, as its MIT licence says it.
own = re.search(r"^Copyright \(c\) (.+)$", (root / "LICENSE-MIT").read_text(), re.M).group(1)
out = [
    "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/",
    "Upstream-Name: keyfence",
    f"Source: {repo}",
    "Comment: The binaries of this package are compiled from keyfence's sources",
    " and from the components listed below by name and version (Files: third-party/",
    " NAME-VERSION/ stands for each one's sources). Each component's own licence and",
    " notice texts are in /usr/share/doc/keyfence/THIRD-PARTY-NOTICES.txt.gz.",
    "",
    "Files: *",
    f"Copyright: {own}",
    "License: Apache-2.0 or MIT",
]
short_names = {"Apache-2.0", "MIT"}
for (licence, holder), names in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1] or "")):
    paths = [f"third-party/{n}/*" for n in names]
    out += ["", f"Files: {paths[0]}"] + [f" {p}" for p in paths[1:]]
    out.append(f"Copyright: {holder}" if holder else "Copyright: their authors, as each one's notice in THIRD-PARTY-NOTICES.txt.gz says")
    out.append(f"License: {licence}")
    short_names.update(s.strip() for s in re.split(r",? (?:or|and) ", licence))
common = {"Apache-2.0": "Apache-2.0", "CC0-1.0": "CC0-1.0"}
mit = (root / "LICENSE-MIT").read_text().split("Permission is hereby granted", 1)[1]
for name in sorted(short_names):
    out += ["", f"License: {name}"]
    if name in common:
        text = f"On Debian systems, the complete text of this licence is in\n/usr/share/common-licenses/{common[name]}."
    elif name == "MIT":
        text = "Permission is hereby granted" + mit
    else:
        text = ("The text of this licence, as each component released under it\n"
                "carries it, is in /usr/share/doc/keyfence/THIRD-PARTY-NOTICES.txt.gz.")
        if name.startswith("Apache-2.0 with"):
            text += "\nApache-2.0's own text is in /usr/share/common-licenses/Apache-2.0."
    out += [f" {l}" if l.strip() else " ." for l in text.strip("\n").splitlines()]
print("\n".join(out))
EOF

# changelog.gz: a native package's changelog (no Debian revision: the
# package's version is the workspace's), this version's entries of
# CHANGELOG.md in Debian's format.
python3 - "$ROOT/CHANGELOG.md" "$VERSION" "$MAINTAINER" "$SOURCE_DATE_EPOCH" >"$DOC/changelog" <<'EOF'
import email.utils, re, sys, textwrap
changelog, version, maintainer, epoch = sys.argv[1:]
text = open(changelog).read()
m = re.search(rf"^## {re.escape(version)}\b.*?\n(.*?)(?=^## |\Z)", text, re.S | re.M)
items = []
for block in re.split(r"\n(?=- )|\n\n", m.group(1) if m else ""):
    block = " ".join(block.split())
    if block:
        items.append(block[2:] if block.startswith("- ") else block)
items = items or [f"Release {version}."]
print(f"keyfence ({version}) unstable; urgency=medium\n")
for item in items:
    print(textwrap.fill(item, 78, initial_indent="  * ", subsequent_indent="    ", break_on_hyphens=False))
print(f"\n -- {maintainer}  {email.utils.formatdate(int(epoch))}")
EOF
gzip -9n "$DOC/changelog"

# keyfence(1): the command line's help, every command's, as the binary
# prints it.
python3 - "$CLI" "$VERSION" "$SOURCE_DATE_EPOCH" >"$PKG/usr/share/man/man1/keyfence.1" <<'EOF'
import re, subprocess, sys, textwrap, time
cli, version, epoch = sys.argv[1:]
def help_of(words):
    return subprocess.run([cli, *words, "--help"], check=True, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "80"}).stdout
def commands(text):
    m = re.search(r"^Commands:\n(.*?)(?:\n\n|\Z)", text, re.S | re.M)
    return [l.split()[0] for l in (m.group(1).splitlines() if m else []) if re.match(r"^  \S", l)] if m else []
def wrap(line):
    """A line of help in 72 columns (the page indents it by 7): continued under its
    description (clap does not wrap)."""
    if len(line) <= 72:
        return [line]
    m = re.match(r"^(\s*(?:-\S.*?|\S+)\s{2,}|\s*)", line)
    indent = " " * (len(m.group(1)) if len(m.group(1)) < 40 else len(line) - len(line.lstrip()) + 4)
    return textwrap.wrap(line, 72, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)
def roff(text):
    out = []
    for l in (w for line in text.rstrip("\n").splitlines() for w in wrap(line)):
        l = l.replace("\\", "\\e")
        out.append("\\&" + l if l.startswith((".", "'")) else l)
    return "\n".join(out)
top = help_of([])
# The exit statuses and the pointer to the documentation, after every
# command's help: printed once, under the first.
footer = top[top.index("Exit status:"):] if "Exit status:" in top else None
date = time.strftime("%Y-%m-%d", time.gmtime(int(epoch)))
print(f'.TH KEYFENCE 1 "{date}" "keyfence {version}" "User Commands"')
print(".SH NAME\nkeyfence \\- " + top.splitlines()[0].rstrip(".").lower())
print(".SH SYNOPSIS\n.B keyfence\n.I COMMAND\n.RI [ OPTIONS ]")
print(".SH DESCRIPTION\n.nf\n" + roff(top) + "\n.fi")
print(".SH COMMANDS")
todo = [[c] for c in commands(top) if c != "help"]
while todo:
    words = todo.pop(0)
    text = help_of(words)
    if footer:
        text = text.replace(footer, "")
    print(f'.SS "keyfence {" ".join(words)}"\n.nf\n' + roff(text) + "\n.fi")
    todo[0:0] = [words + [c] for c in commands(text) if c != "help"]
print(".SH FILES\n.TP\n.I /lib/systemd/system/keyfence-agent.socket, keyfence-agent.service, keyfence-serve.service")
print("The key agent's and the key server's units.")
print(".TP\n.I /etc/default/keyfence\nThe units' options: who may connect to the agent, the agent's and the server's bounds.")
print(".TP\n.I /usr/lib/" "x86_64-linux-gnu/ossl-modules/keyfence.so\nThe OpenSSL provider (keyfence provider-config).")
print(".TP\n.I /usr/share/doc/keyfence/examples/keyfence-agent.service.d/softhsm.conf")
print("The drop-in an agent serving SoftHSM2 token keys needs.")
print(".SH SEE ALSO\n.BR openssl (1),\n.BR systemd.service (5)")
print(".PP\nThe documentation: https://github.com/keyfence/keyfence/tree/main/docs")
EOF
gzip -9n "$PKG/usr/share/man/man1/keyfence.1"

# What lintian warns of and why it is so.
cat >"$PKG/usr/share/lintian/overrides/keyfence" <<'EOF'
# One package for a sysadmin to install: the command line, the OpenSSL
# provider and the libkeyfence it loads. libkeyfence's soname is for the
# provider and for programs built against the C tarball; a separate
# libkeyfence0 package is Debian's own packaging to make.
keyfence: package-name-doesnt-match-sonames libkeyfence0
# libkeyfence starts its key process from beside itself (the core's rule,
# core/src/sign/key_process/supervisor.rs): an internal program, not a
# command.
keyfence: executable-in-usr-lib [usr/lib/x86_64-linux-gnu/keyfence-key-process]
EOF

# The libraries' dependency information: the soname stays .so.0 until 1.0
# while each 0.x minor may change the ABI (README, "Versions").
IFS=. read -r major minor _ <<<"$VERSION"
if [ "$major" = 0 ]; then
    echo "libkeyfence 0 keyfence (>= $VERSION), keyfence (<< 0.$((minor + 1))~)" >"$PKG/DEBIAN/shlibs"
else
    echo "libkeyfence $major keyfence (>= $VERSION), keyfence (<< $((major + 1))~)" >"$PKG/DEBIAN/shlibs"
fi
echo "activate-noawait ldconfig" >"$PKG/DEBIAN/triggers"

# The maintainer scripts: what dh_installsystemd --no-enable --no-start
# generates for the three units (debhelper 13, Debian 12), the system user
# and its folders, and at an upgrade the processes still running the old
# library. Nothing is enabled or started at install: the sysadmin enables
# keyfence-agent.socket once the machine key and the store are in place
# (docs/deploy.md). DPKG_ROOT: a package installed into another root
# (dpkg --root): deb-systemd-helper works in that root, and nothing asks
# this machine's systemd about it.
cat >"$PKG/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
units="keyfence-agent.socket keyfence-agent.service keyfence-serve.service"

# The processes that still map a keyfence file this configure replaced
# (dpkg unlinks the old file: the kernel names it "(deleted)"): servers
# that loaded the provider (nginx, apache2, haproxy), a key process, an
# agent started outside its unit. Named with the unit to restart where
# the process is one's.
stale_processes() {
    pattern=' (/usr)?/(lib/x86_64-linux-gnu/(libkeyfence\.so\.[0-9.]+|ossl-modules/keyfence\.so|keyfence-key-process)|bin/keyfence) \(deleted\)$'
    grep -lE "$pattern" /proc/[0-9]*/maps 2>/dev/null | while IFS= read -r maps; do
        pid="${maps#/proc/}"
        pid="${pid%/maps}"
        name="$(cat "/proc/$pid/comm" 2>/dev/null)" || continue
        unit="$(sed -n 's,^0::/.*/\([^/]*\.service\)$,\1,p' "/proc/$pid/cgroup" 2>/dev/null)" || true
        echo "$pid ${unit:--} $name"
    done | awk '
        { name = $0; sub(/^[^ ]+ [^ ]+ /, "", name)
          if (!count[name]++) order[++n] = name
          pids[name] = pids[name] (count[name] > 1 ? " " : "") $1
          if ($2 != "-" && !seen[$2]++) units = units " " $2 }
        END {
            if (!n) exit
            line = ""
            for (i = 1; i <= n; i++) line = line (i > 1 ? ", " : "") order[i] " (pid" (count[order[i]] > 1 ? "s " : " ") pids[order[i]] ")"
            print "keyfence: these processes still use the old keyfence library; restart them: " line
            if (units != "") print "keyfence: systemctl restart" units
        }'
}

if [ "$1" = configure ] || [ "$1" = abort-upgrade ] || [ "$1" = abort-deconfigure ] || [ "$1" = abort-remove ]; then
    # The system user keyfence and its folders (/usr/lib/sysusers.d and
    # /usr/lib/tmpfiles.d/keyfence.conf).
    systemd-sysusers ${DPKG_ROOT:+--root="$DPKG_ROOT"} keyfence.conf
    systemd-tmpfiles ${DPKG_ROOT:+--root="$DPKG_ROOT"} --create keyfence.conf

    # The units' enable state, kept as the sysadmin left it: a unit enabled
    # before gets the links its new [Install] names; deb-systemd-helper's
    # state records every link the units may have, so that a purge removes
    # them (whoever made them: `systemctl enable`). The unmask undoes a
    # mask deb-systemd-helper made itself, never the sysadmin's.
    for unit in $units; do
        if deb-systemd-helper debian-installed "$unit"; then
            deb-systemd-helper unmask "$unit" >/dev/null || true
            if deb-systemd-helper --quiet was-enabled "$unit"; then
                deb-systemd-helper enable "$unit" >/dev/null || true
            fi
        fi
        deb-systemd-helper update-state "$unit" >/dev/null || true
    done

    if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        # What runs is restarted, nothing else started. The socket first:
        # a socket unit whose file changed under it (or that a purge left
        # running, by a package older than this prerm) "is not functional
        # until restarted", and the agent systemd then starts binds a
        # socket of its own that the servers' workers cannot open.
        # Restarting the socket restarts the agent (Requires=), which then
        # runs the new binary; so does a key server. Also at a first
        # install: only what an older package's purge left running runs.
        # shellcheck disable=SC2086 # $units: three words
        deb-systemd-invoke try-restart $units >/dev/null || true
    fi

    # The servers still running the old library, which this package cannot
    # restart for the sysadmin (stdout: dpkg and apt show it).
    if [ "$1" = configure ] && [ -z "${DPKG_ROOT:-}" ]; then
        stale_processes || true
    fi
fi
EOF
cat >"$PKG/DEBIAN/prerm" <<'EOF'
#!/bin/sh
# Removed (or deconfigured for a package that breaks it): its units are
# stopped, the socket with them, before their files go. An upgrade stops
# nothing here: the agent serves through the unpacking, and the new
# postinst restarts it.
set -e
if [ -z "${DPKG_ROOT:-}" ] && { [ "$1" = remove ] || [ "$1" = deconfigure ]; } && [ -d /run/systemd/system ]; then
    deb-systemd-invoke stop keyfence-agent.socket keyfence-agent.service keyfence-serve.service >/dev/null || true
fi
EOF
cat >"$PKG/DEBIAN/postrm" <<'EOF'
#!/bin/sh
# On remove, systemd forgets the units; the enable links stay, so that a
# reinstall keeps the sysadmin's choice. On purge, the links go too:
# those deb-systemd-helper recorded, and any link left in a .wants or
# .requires folder to a unit file the package shipped (made by hand, or
# left by an older package) - never a link to a unit of the sysadmin's
# own. dpkg itself deletes the conffile, /etc/default/keyfence.
#
# Kept, also on purge: the user keyfence, /etc/keyfence (the machine key)
# and /var/lib/keyfence (the store, the agent's state): they hold keys,
# which a package manager must never throw away. docs/deploy.md says how
# to remove them by hand.
set -e
units="keyfence-agent.socket keyfence-agent.service keyfence-serve.service"
if [ "$1" = purge ]; then
    if command -v deb-systemd-helper >/dev/null; then
        # shellcheck disable=SC2086 # $units: three words
        deb-systemd-helper purge $units >/dev/null || true
        # shellcheck disable=SC2086
        deb-systemd-helper unmask $units >/dev/null || true
    fi
    for unit in $units; do
        for link in "${DPKG_ROOT:-}"/etc/systemd/system/*.wants/"$unit" "${DPKG_ROOT:-}"/etc/systemd/system/*.requires/"$unit"; do
            [ -L "$link" ] || continue
            target="$(readlink "$link")"
            case "$target" in
                /lib/systemd/system/"$unit" | /usr/lib/systemd/system/"$unit")
                    [ -e "${DPKG_ROOT:-}$target" ] || rm -f "$link"
                    ;;
            esac
        done
    done
fi
if [ -z "${DPKG_ROOT:-}" ] && { [ "$1" = remove ] || [ "$1" = purge ]; } && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
EOF
chmod 755 "$PKG/DEBIAN/postinst" "$PKG/DEBIAN/prerm" "$PKG/DEBIAN/postrm"

# Depends from the binaries' libraries; systemd-sysusers and
# systemd-tmpfiles for the postinst; deb-systemd-helper working in
# DPKG_ROOT (init-system-helpers 1.63; Debian 12 has 1.65) for all three;
# procps for the agent unit's ExecReload, /bin/kill.
cat >"$WORK/debian/control" <<EOF
Source: keyfence

Package: keyfence
Architecture: $ARCH
EOF
shlibs="$(cd "$WORK" && dpkg-shlibdeps -O -xkeyfence \
    -e"debian/keyfence/usr/bin/keyfence" -e"debian/keyfence/usr/lib/$TRIPLET/keyfence-key-process" \
    -e"debian/keyfence/usr/lib/$TRIPLET/libkeyfence.so.$VERSION" \
    -e"debian/keyfence/usr/lib/$TRIPLET/ossl-modules/keyfence.so")"
depends="${shlibs#shlibs:Depends=}"
[ -n "$depends" ] && [ "$depends" != "$shlibs" ] || fail "dpkg-shlibdeps said: $shlibs"
depends="$depends, init-system-helpers (>= 1.63), procps, systemd | systemd-standalone-sysusers, systemd | systemd-standalone-tmpfiles"

installed_size="$(du -sk --apparent-size --exclude=DEBIAN "$PKG" | cut -f1)"
cat >"$PKG/DEBIAN/control" <<EOF
Package: keyfence
Version: $VERSION
Architecture: $ARCH
Maintainer: $MAINTAINER
Installed-Size: $installed_size
Depends: $depends
Suggests: softhsm2
Section: admin
Priority: optional
Homepage: $REPO_URL
Description: keep private keys inside a policy: key agent and OpenSSL provider
 keyfence wraps private keys in envelopes that only machines whose
 attributes satisfy a policy can open (CP-ABE, byte-compatible with
 Cloudflare CIRCL), and signs with them in an isolated key process.
 .
 This package holds the keyfence command line, the key agent's and the
 key server's systemd units with their system user, and the OpenSSL 3
 provider that lets nginx, Apache, HAProxy and stunnel use keyfence key
 files, with the libkeyfence library and key process it loads.
EOF
# The conffiles' sums are dpkg's to keep (the status file's Conffiles:),
# not md5sums' (as dh_md5sums leaves them out).
(cd "$PKG" && find etc -type f -printf '/%p\n' | LC_ALL=C sort) >"$PKG/DEBIAN/conffiles"
(cd "$PKG" && find . \( -path ./DEBIAN -o -path ./etc \) -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) \
    >"$PKG/DEBIAN/md5sums"
chmod 644 "$PKG/DEBIAN/control" "$PKG/DEBIAN/md5sums" "$PKG/DEBIAN/shlibs" "$PKG/DEBIAN/triggers" "$PKG/DEBIAN/conffiles"

# Reproducible: every file dated SOURCE_DATE_EPOCH, owned by root.
find "$PKG" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb="$OUT/keyfence_${VERSION}_$ARCH.deb"
dpkg-deb --root-owner-group -Zxz --build "$PKG" "$deb" >/dev/null
echo "$deb"
