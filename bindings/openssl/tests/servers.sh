#!/usr/bin/env bash
# servers.sh CLI MODULES WORK: keyfence key files in real servers, on
# loopback, on ports the system hands out, in the scratch directory WORK,
# every process killed by its pid at the end:
#  - nginx (its own prefix, pid and error log here, `daemon off`, one
#    worker, run as the current user) with ssl_certificate_key on keyfence
#    key files for P-256 and RSA-2048: curl and openssl s_client complete
#    TLS 1.2 and 1.3 and verify the chain;
#  - the same with the keys in the isolated key process, whose worker's
#    memory is then searched for the private scalar (and the in-process
#    worker's, where it must be found, so the search can fail);
#  - a remote key: nginx here, the key opened only by `keyfence serve`;
#    once the key server is gone, handshakes fail;
#  - HAProxy with ssl-mode-async (haproxy_async.py): local handshakes keep
#    their latency while remote ones wait on a slow link, and without it
#    (the control) they do not;
#  - Python's ssl (load_cert_chain on the key file) accepting s_client;
#  - openssl s_server loading keyfence:PATH through OSSL_STORE;
#  - bad key files: `nginx -t` refuses each with the provider's reason, and
#    a reload onto one keeps the running server serving.
set -euo pipefail
cli="$1" modules="$2" work="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v nginx >/dev/null; then
    # ./x installs nginx and sets KEYFENCE_REQUIRE_SERVERS; elsewhere the
    # test says it did not run (ctest reports it as skipped).
    [ -n "${KEYFENCE_REQUIRE_SERVERS:-}" ] && { echo "FAIL: nginx is not installed" >&2; exit 1; }
    echo "SKIPPED: nginx is not installed"
    exit 0
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work"

# shellcheck source=common.sh
. "$here/common.sh"
trap stop_servers EXIT

keys_and_configs

# curl PORT VERSION (1.2 or 1.3): one HTTPS request, the chain verified.
get() {
    curl -sS --max-time 10 --cacert keys/ca.pem --resolve "localhost:$1:127.0.0.1" \
        --tlsv"$2" --tls-max "$2" "https://localhost:$1/" || return 1
}
# s_client PORT VERSION: a handshake whose chain and name verify.
# The output is read whole before it is searched: `grep -q` in a pipe would
# exit at the match, s_client would die of SIGPIPE writing the rest, and
# with pipefail a good handshake would fail, as it did now and then.
handshake() {
    local out
    out="$(echo | timeout 10 openssl s_client -connect "127.0.0.1:$1" -servername localhost -tls"${2/./_}" \
        -CAfile keys/ca.pem -verify_return_error -verify_hostname localhost 2>&1)" || true
    grep -q "Verify return code: 0 (ok)" <<<"$out"
}
check_serves() { # PORT...: TLS 1.2 and 1.3, curl and s_client
    local p v
    for p in "$@"; do
        for v in 1.2 1.3; do
            [ "$(get "$p" "$v")" = "ok" ] || fail "curl TLS $v on port $p"
            handshake "$p" "$v" || fail "openssl s_client TLS $v on port $p"
        done
    done
}

user_line=""
[ "$(id -u)" = 0 ] && user_line="user root;"
# nginx_conf DIR PORT CERT KEY [PORT CERT KEY]: a config serving each key.
nginx_conf() {
    local dir="$1"; shift
    mkdir -p "$dir/tmp"
    {
        echo "daemon off; master_process on; worker_processes 1; $user_line"
        # SoftHSM2 finds its tokens through SOFTHSM2_CONF, which nginx
        # clears from its workers' environment unless told to keep it.
        [ -z "${SOFTHSM2_CONF:-}" ] || echo "env SOFTHSM2_CONF;"
        echo "pid $dir/nginx.pid; error_log $dir/error.log info;"
        echo "events { worker_connections 64; }"
        echo "http { access_log off; client_body_temp_path $dir/tmp; proxy_temp_path $dir/tmp;"
        echo "  fastcgi_temp_path $dir/tmp; uwsgi_temp_path $dir/tmp; scgi_temp_path $dir/tmp;"
        while [ $# -gt 0 ]; do
            echo "  server { listen 127.0.0.1:$1 ssl; ssl_protocols TLSv1.2 TLSv1.3;"
            echo "    ssl_certificate $work/$2; ssl_certificate_key $work/$3; ${nginx_server_extra:-}"
            echo "    location / { return 200 \"ok\\n\"; } }"
            shift 3
        done
        echo "}"
    } >"$dir/nginx.conf"
}
# start_nginx DIR CNF: nginx in the foreground of a background job.
start_nginx() {
    OPENSSL_CONF="$work/$2" nginx -p "$1" -c "$1/nginx.conf" -e "$1/error.log" &
    pids+=($!)
    echo $! >"$1/master.pid"
}
worker_of() { pgrep -P "$(cat "$1/master.pid")" nginx | head -1; }
scalar="$(openssl pkey -in keys/ec256.pem -text -noout | sed -n '/^priv:/,/^pub:/p' | sed '1d;$d' | tr -d ' :\n')"
scalar="${scalar: -64}"

# serve_file_keys DIR CNF EC_PORT RSA_PORT: nginx in DIR with OPENSSL_CONF
# CNF serves the EC and RSA key files on the two ports, and both answer.
serve_file_keys() {
    nginx_conf "$work/$1" "$3" keys/ec256.crt keys/ec256.kfk "$4" keys/rsa2048.crt keys/rsa2048.kfk
    start_nginx "$work/$1" "$2"
    wait_port "$3"
    check_serves "$3" "$4"
}

echo "== nginx, keys in process"
p1=$(free_port) p2=$(free_port)
serve_file_keys n1 local.cnf "$p1" "$p2"
python3 "$here/memscan.py" "$(worker_of n1)" "$scalar" >/dev/null ||
    fail "the in-process worker does not hold the private scalar: the memory search cannot see keys"

echo "== nginx, keys in the isolated key process"
p3=$(free_port) p4=$(free_port)
serve_file_keys n2 isolated.cnf "$p3" "$p4"
w=$(worker_of n2)
pgrep -P "$w" -f keyfence-key-process >/dev/null || fail "the isolated worker has no key process"
if python3 "$here/memscan.py" "$w" "$scalar" >/dev/null; then fail "the isolated nginx worker holds the private key"; fi
if python3 "$here/memscan.py" "$(cat n2/master.pid)" "$scalar" >/dev/null; then fail "the isolated nginx master holds the private key"; fi

echo "== nginx, token keys (SoftHSM2 through a PKCS#11 URI key file), in process and isolated"
# The certificate request is signed in the token through the provider;
# the CA issues the certificate; nginx serves with the key file. With the
# keys isolated, only the key process maps the token's module.
tok_rc=0
bash "$here/../../../vectors/softhsm-fixture.sh" "$work/hsm" >/dev/null || tok_rc=$?
if [ "$tok_rc" = 0 ]; then
    set -a
    # shellcheck disable=SC1091
    . "$work/hsm/env"
    set +a
    for t in p256 rsa; do
        "$cli" provider-key --pkcs11 "pkcs11:token=edge;object=tls-$t" --out "tok-$t.kfk"
        OPENSSL_CONF="$work/local.cnf" openssl req -new -key "keyfence:$work/tok-$t.kfk" -subj /CN=localhost -out "tok-$t.csr"
        openssl x509 -req -in "tok-$t.csr" -CA keys/ca.pem -CAkey keys/ca.key -CAcreateserial -days 2 \
            -extfile keys/san.ext -out "tok-$t.crt" 2>/dev/null
    done
    pt1=$(free_port) pt2=$(free_port) pt3=$(free_port) pt4=$(free_port)
    nginx_conf "$work/nt1" "$pt1" tok-p256.crt tok-p256.kfk "$pt2" tok-rsa.crt tok-rsa.kfk
    nginx_conf "$work/nt2" "$pt3" tok-p256.crt tok-p256.kfk "$pt4" tok-rsa.crt tok-rsa.kfk
    # One after the other, as an operator starts them: SoftHSM2's file
    # store can show a token as absent to a process that reads it while
    # another logs in (keyfence lists the slots again, three times).
    start_nginx "$work/nt1" local.cnf
    wait_port "$pt1"
    start_nginx "$work/nt2" isolated.cnf
    wait_port "$pt3"
    check_serves "$pt1" "$pt2" "$pt3" "$pt4"
    grep -q libsofthsm2 "/proc/$(worker_of nt1)/maps" || fail "the in-process worker does not map the token's module"
    w=$(worker_of nt2)
    if grep -q libsofthsm2 "/proc/$w/maps"; then fail "the isolated nginx worker maps the token's module"; fi
    kp=$(pgrep -P "$w" -f keyfence-key-process | head -1)
    [ -n "$kp" ] || fail "the isolated worker has no key process"
    grep -q libsofthsm2 "/proc/$kp/maps" || fail "the key process does not map the token's module"
    echo "token keys: nginx serves TLS 1.2 and 1.3 with P-256 and RSA keys in the token; isolated, only the key process maps the module"
elif [ "$tok_rc" = 77 ]; then
    echo "*** SKIPPED: token keys (no SoftHSM2) ***"
else
    fail "vectors/softhsm-fixture.sh failed"
fi

echo "== RSA key exchange: refused at negotiation by the cipher string docs/openssl.md gives"
# keyfence signs and never decrypts: a TLS 1.2 client offering only RSA
# key exchange (AES128-GCM-SHA256) would have the server decrypt its
# premaster secret with the RSA key. Without `!kRSA` nginx picks that
# suite and the handshake fails halfway (the control); with it, the
# server refuses at negotiation and says so.
rsa_only() { # PORT: what a TLS 1.2 client with only RSA key exchange gets
    echo | timeout 10 openssl s_client -connect "127.0.0.1:$1" -tls1_2 -cipher AES128-GCM-SHA256 -CAfile keys/ca.pem 2>&1 || true
}
pk1=$(free_port) pk2=$(free_port)
nginx_conf "$work/nk1" "$pk1" keys/rsa2048.crt keys/rsa2048.kfk
nginx_server_extra="ssl_ciphers HIGH:!aNULL:!MD5:!kRSA;"
nginx_conf "$work/nk2" "$pk2" keys/rsa2048.crt keys/rsa2048.kfk
nginx_server_extra=""
start_nginx "$work/nk1" local.cnf
start_nginx "$work/nk2" local.cnf
wait_port "$pk1"
wait_port "$pk2"
rsa_only "$pk1" >/dev/null
grep -q "decryption failed" nk1/error.log || fail "the control did not fail halfway: $(tail -2 nk1/error.log)"
grep -q "handshake failure" <<<"$(rsa_only "$pk2")" || fail "!kRSA: the RSA-only client was not refused at negotiation"
grep -q "no shared cipher" nk2/error.log || fail "!kRSA: nginx does not say why: $(tail -2 nk2/error.log)"
check_serves "$pk2"

echo "== nginx, a remote key (keyfence serve opens it; this machine may not)"
openssl ecparam -name prime256v1 -genkey -noout -out mesh-ca.key
openssl req -x509 -new -key mesh-ca.key -subj "/CN=keyfence mesh CA" -days 2 -out mesh-ca.pem 2>/dev/null
for n in sfo1 edge; do
    openssl ecparam -name prime256v1 -genkey -noout -out "$n.key"
    openssl req -new -key "$n.key" -subj "/CN=$n" -out "$n.csr" 2>/dev/null
    printf 'subjectAltName=DNS:%s\n' "$n" >"$n.ext"
    openssl x509 -req -in "$n.csr" -CA mesh-ca.pem -CAkey mesh-ca.key -CAcreateserial -days 2 \
        -extfile "$n.ext" -out "$n.pem" 2>/dev/null
done
"$cli" serve --listen 127.0.0.1:0 --name sfo1 --cert sfo1.pem --key sfo1.key --ca mesh-ca.pem \
    --store keys/store --machine-key keys/us.machine --envelopes keys/ec256.env >serve.out 2>serve.err &
server=$!
pids+=($server)
for i in $(seq 200); do grep -q '^listening' serve.out && break; sleep 0.1; done
addr=$(sed -n 's/^listening //p' serve.out)
[ -n "$addr" ] || fail "keyfence serve did not start: $(cat serve.err)"
"$cli" provider-key --remote --envelope keys/ec256.env --peer "sfo1,$addr,country=US" \
    --tls-cert edge.pem --tls-key edge.key --tls-ca mesh-ca.pem --out remote.kfk
p5=$(free_port)
nginx_conf "$work/n3" "$p5" keys/ec256.crt remote.kfk
start_nginx "$work/n3" local.cnf
wait_port "$p5"
check_serves "$p5"
if command -v haproxy >/dev/null; then
    echo "== HAProxy, ssl-mode-async: a slow remote key does not stall local handshakes"
    # Both ways HAProxy takes a key: after the certificate in the crt file
    # (local), or as NAME.pem.key beside it (remote, written by haproxy_async.py).
    cat keys/ec256.crt keys/ec256.kfk >local.pem && cp keys/ec256.crt remote.pem
    python3 "$here/haproxy_async.py" "$work" "$cli" "$work/local.cnf" "$work/keys/ca.pem" "$addr" |
        tee haproxy.jsonl
elif [ -n "${KEYFENCE_REQUIRE_SERVERS:-}" ]; then
    fail "haproxy is not installed"
fi
kill "$server"
wait "$server" 2>/dev/null || true
if get "$p5" 1.3 >/dev/null 2>&1; then fail "a handshake succeeded with the key server gone"; fi

echo "== Python's ssl"
p6=$(free_port)
cat >server.py <<PY
import socket, ssl
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("keys/ec256.crt", "keys/ec256.kfk")
s = socket.create_server(("127.0.0.1", $p6))
while True:
    c, _ = s.accept()
    try:
        with ctx.wrap_socket(c, server_side=True) as t:
            t.recv(100)
            t.sendall(b"HTTP/1.0 200 OK\r\n\r\nok\n")
    except (ssl.SSLError, OSError):
        pass
PY
OPENSSL_CONF="$work/local.cnf" python3 server.py &
pids+=($!)
wait_port "$p6"
handshake "$p6" 1.3 || fail "s_client against Python's ssl (TLS 1.3)"
handshake "$p6" 1.2 || fail "s_client against Python's ssl (TLS 1.2)"

echo "== openssl s_server -key keyfence:PATH (OSSL_STORE)"
p7=$(free_port)
OPENSSL_CONF="$work/local.cnf" openssl s_server -accept "127.0.0.1:$p7" -cert keys/rsa2048.crt \
    -key "keyfence:$work/keys/rsa2048.kfk" -www >s_server.out 2>&1 &
pids+=($!)
wait_port "$p7"
handshake "$p7" 1.2 || fail "s_client against s_server with a keyfence: key (TLS 1.2)"
handshake "$p7" 1.3 || fail "s_client against s_server with a keyfence: key (TLS 1.3)"

echo "== bad key files"
python3 - <<'PY'
import base64, re
text = open("keys/ec256.kfk").read()
body = base64.b64decode("".join(text.strip().splitlines()[1:-1]))
def pem(b):
    s = base64.b64encode(b).decode()
    return "-----BEGIN KEYFENCE KEY-----\n" + "\n".join(s[i:i + 64] for i in range(0, len(s), 64)) + "\n-----END KEYFENCE KEY-----\n"
open("bad-truncated.kfk", "w").write(pem(body[:-20]))
open("bad-version.kfk", "w").write(pem(body[:5] + b"\x07" + body[6:]))
PY
# A remote key whose only peer may not hold it (its attributes do not
# satisfy the policy): no key server is asked.
"$cli" provider-key --remote --envelope keys/ec256.env --peer "fra1,127.0.0.1:9,country=FR" \
    --tls-cert edge.pem --tls-key edge.key --tls-ca mesh-ca.pem --out bad-peer.kfk 2>/dev/null &&
    fail "provider-key wrote a key file no peer may hold"
# ... so the remote key file is made by hand from the good one's fields.
python3 - "$addr" <<'PY'
import base64, sys
text = open("remote.kfk").read()
body = base64.b64decode("".join(text.strip().splitlines()[1:-1]))
out, i = bytearray(body[:6]), 6
while i < len(body):
    tag, n = body[i], int.from_bytes(body[i + 1:i + 5], "big")
    v = body[i + 5:i + 5 + n]
    if tag == 9:
        v = b"fra1\x00127.0.0.1:9\x00country=FR"
    out += bytes([tag]) + len(v).to_bytes(4, "big") + v
    i += 5 + n
s = base64.b64encode(bytes(out)).decode()
open("bad-peer.kfk", "w").write("-----BEGIN KEYFENCE KEY-----\n" + "\n".join(s[j:j + 64] for j in range(0, len(s), 64)) + "\n-----END KEYFENCE KEY-----\n")
PY
for bad in "bad-truncated.kfk:bad keyfence key file:truncated" \
           "bad-version.kfk:bad keyfence key file:version 7 is not supported" \
           "bad-peer.kfk:keyfence key unavailable:BACKEND_FAILED" \
           "keys/fr.kfk:keyfence key unavailable:POLICY_NOT_SATISFIED"; do
    IFS=: read -r file reason detail <<<"$bad"
    nginx_conf "$work/t" "$(free_port)" keys/ec256.crt "$file"
    if OPENSSL_CONF="$work/local.cnf" nginx -t -p "$work/t" -c "$work/t/nginx.conf" -e "$work/t/error.log" >t.out 2>&1; then
        fail "nginx -t accepted $file"
    fi
    grep -q "$reason" t.out && grep -q "$detail" t.out || fail "nginx -t on $file: no \"$reason\" / \"$detail\": $(cat t.out)"
done
# A reload onto a bad key file: nginx keeps its old configuration, and serves.
nginx_conf "$work/n1" "$p1" keys/ec256.crt bad-truncated.kfk "$p2" keys/rsa2048.crt keys/rsa2048.kfk
kill -HUP "$(cat n1/master.pid)"
for i in $(seq 100); do grep -q "truncated" n1/error.log && break; sleep 0.1; done
grep -q "bad keyfence key file" n1/error.log || fail "the reload's error is not in nginx's log"
check_serves "$p1" "$p2"
echo "servers: ok"
