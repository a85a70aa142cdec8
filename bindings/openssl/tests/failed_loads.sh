#!/usr/bin/env bash
# failed_loads.sh CLI MODULES WORK [RUNS]: `openssl pkey -in keyfence:FILE
# -pubout` on key files that cannot load, RUNS times each (default 1000),
# four at a time, against the provider in MODULES (the sanitizer build,
# with the ASan runtime preloaded). Every run must end with openssl's own
# failure (exit 1) and the provider's reason: never a crash.
#
# The crash this holds off: a failed load had started the engine, whose
# threads were still starting when OpenSSL unloaded the provider (and
# libkeyfence) at exit, and one of them then ran unmapped code (2 runs in
# 200 ended in SIGSEGV). Dropping an engine, a key process's supervisor
# or a remote client now joins every thread it started
# (core/src/sign/threads.rs).
set -euo pipefail
cli="$1" modules="$2" work="$3" runs="${4:-1000}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
# shellcheck source=common.sh
. "$here/common.sh"

keys_and_configs

# A local key whose machine key is gone: the engine starts, the envelope
# cannot be opened.
cp keys/us.machine gone.machine
"$cli" provider-key --envelope keys/ec256.env --store keys/store --machine-key gone.machine --out gone.kfk
rm gone.machine
# A remote key whose only key server may not hold it (its attributes do
# not satisfy the policy): the remote client starts and is dropped. The
# command line will not write such a file, so it is made from the local
# one's public key and envelope.
python3 - "$PWD/keys" <<'PY'
import base64, sys
keys = sys.argv[1]
text = open(f"{keys}/ec256.kfk").read()
body = base64.b64decode("".join(text.strip().splitlines()[1:-1]))
fields, i = {}, 6
while i < len(body):
    tag, n = body[i], int.from_bytes(body[i + 1:i + 5], "big")
    fields[tag] = body[i + 5:i + 5 + n]
    i += 5 + n
out = bytearray(body[:6])
def field(tag, value):
    out.extend(bytes([tag]) + len(value).to_bytes(4, "big") + value)
field(1, b"\x01")  # remote
for tag, name in ((6, "ec256.crt"), (7, "ec256.pem"), (8, "ca.pem")):
    field(tag, f"{keys}/{name}".encode())
field(9, b"fra1\x00127.0.0.1:9\x00country=FR")
field(2, fields[2])
field(3, fields[3])
s = base64.b64encode(bytes(out)).decode()
open("no-peer.kfk", "w").write("-----BEGIN KEYFENCE KEY-----\n" + "\n".join(s[j:j + 64] for j in range(0, len(s), 64))
                               + "\n-----END KEYFENCE KEY-----\n")
PY

# loads CNF FILE REASON: RUNS failing loads, four at a time.
loads() {
    local cnf="$1" file="$2" reason="$3" out start=$SECONDS
    "${asan_env[@]}" env OPENSSL_CONF="$PWD/$cnf" openssl pkey -in "keyfence:$PWD/$file" -pubout >/dev/null 2>one.err &&
        fail "$file loaded"
    grep -q "$reason" one.err || fail "$file: no '$reason' in: $(cat one.err)"
    out="$(seq "$runs" | xargs -P 4 -I{} "${asan_env[@]}" env OPENSSL_CONF="$PWD/$cnf" \
        sh -c 'openssl pkey -in "keyfence:$0" -pubout >/dev/null 2>&1; echo $?' "$PWD/$file" | sort | uniq -c)"
    [ "$(echo "$out" | awk '$2 != 1 { bad += $1 } END { print bad + 0 }')" = 0 ] ||
        fail "$file ($cnf): exit codes over $runs runs (count code): $out"
    echo "$file ($cnf): $runs failed loads, every one exit 1 ($((SECONDS - start)) s)"
}
loads local.cnf gone.kfk "cannot read the machine key"
loads isolated.cnf gone.kfk "cannot read the machine key"
loads local.cnf keys/fr.kfk POLICY_NOT_SATISFIED
loads local.cnf no-peer.kfk BACKEND_FAILED
echo "failed loads: no crash"
