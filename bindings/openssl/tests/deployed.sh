#!/usr/bin/env bash
# deployed.sh CLI MODULES WORK: nginx and Apache from Debian's packages as
# they are deployed, their workers running as www-data, with keyfence keys
# held by the key agent (docs/deploy.md):
#  - the store and the machine key are root's alone (the workers cannot
#    read them, which is what broke before the agent);
#  - `keyfence agent` holds them and admits www-data; the key files name
#    only its socket;
#  - nginx (2 workers) and Apache (prefork) serve TLS 1.2 and 1.3 with EC
#    and RSA keys, the chain verified by curl;
#  - no worker's or master's memory holds the private scalar (the agent's
#    does: the search can fail);
#  - another user is refused (by the socket's mode, and by the agent's
#    allow-list when the mode lets it in);
#  - the agent killed: handshakes fail and the servers log why; started
#    again: handshakes succeed without restarting the servers;
#  - with the agent down, or a key it cannot open, `nginx -t` and Apache's
#    start fail, saying why; so does stunnel's (agent down).
# Needs root (the servers drop to www-data) and Debian's nginx, apache2 and
# stunnel4.
set -euo pipefail
cli="$1" modules="$2" work="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
missing=""
[ "$(id -u)" = 0 ] || missing="root"
command -v nginx >/dev/null || missing="$missing nginx"
command -v apache2 >/dev/null || missing="$missing apache2"
command -v stunnel4 >/dev/null || missing="$missing stunnel4"
id www-data >/dev/null 2>&1 || missing="$missing www-data"
if [ -n "$missing" ]; then
    [ -n "${KEYFENCE_REQUIRE_SERVERS:-}" ] && { echo "FAIL: missing:$missing" >&2; exit 1; }
    echo "SKIPPED: needs$missing"
    exit 0
fi
# The workers (www-data) must reach the agent's socket in the work
# folder: one in /tmp, which every user can traverse, whatever the build
# folder's parents allow (ctest's is under /root/.cache: www-data could not
# reach a socket there, and every handshake failed). WORK names where it is.
rm -rf "$work" && mkdir -p "$work"
work="$(mktemp -d "${TMPDIR:-/tmp}/keyfence-deployed.XXXXXX")"
echo "$work" >"$3/work-folder"
chmod 755 "$work"
cd "$work"

# shellcheck source=common.sh
. "$here/common.sh"
cleanup() {
    local rc=$?
    if [ -f a/apache.pid ]; then kill "$(cat a/apache.pid)" 2>/dev/null || true; fi
    stop_servers
    # Apache's children end with their parent; wait for its pid file to go.
    for _ in $(seq 50); do [ -f a/apache.pid ] || break; sleep 0.1; done
    # Kept when the test failed, for its logs.
    if [ "$rc" = 0 ]; then rm -rf "$work"; else echo "deployed.sh: the servers' logs are in $work" >&2; fi
}
trap cleanup EXIT
get() { # PORT VERSION: one HTTPS request, the chain verified
    curl -sS --max-time 10 --cacert keys/ca.pem --resolve "localhost:$1:127.0.0.1" \
        --tlsv"$2" --tls-max "$2" "https://localhost:$1/" 2>/dev/null || return 1
}
check_serves() { # PORT...
    local p v
    for p in "$@"; do
        for v in 1.2 1.3; do [ "$(get "$p" "$v")" = "ok" ] || fail "TLS $v on port $p"; done
    done
}

bash "$here/make_keys.sh" "$cli" keys
chmod 700 keys
# What broke before: the workers' user cannot read what opens the keys.
runuser -u www-data -- cat keys/us.machine >/dev/null 2>&1 && fail "www-data can read the machine key: the test proves nothing"

mkdir -m 755 run
start_agent() { # SOCKET [OPTIONS...]
    local socket="$1"
    shift
    "$cli" agent --socket "$socket" --store keys/served --machine-key keys/us.machine "$@" >"$socket.out" 2>>"$socket.err" &
    pids+=($!)
    agent_pid=$!
    for _ in $(seq 100); do grep -q listening "$socket.out" 2>/dev/null && return 0; sleep 0.1; done
    fail "the agent did not start: $(cat "$socket.err")"
}
start_agent run/agent.sock --allow-user www-data --socket-group www-data
main_agent=$agent_pid
for k in ec256 rsa2048; do
    "$cli" provider-key --agent run/agent.sock --envelope keys/$k.env --out agent-$k.kfk
done
# The provider as installed, where every user may read it (the build
# tree may be in root's home, which nobody else can enter).
mkdir -p lib/ossl-modules
cp "$modules/keyfence.so" lib/ossl-modules/
cp -L "$modules"/../libkeyfence.so.0 lib/
chmod -R a+rX lib
"$cli" provider-config --module "$work/lib/ossl-modules/keyfence.so" >keyfence.cnf
# A key file naming the agent whose envelope the agent's machine (US) may
# not open: the FR key's envelope in place of the EC key's.
python3 - <<'PY'
import base64
def body(path):
    t = open(path).read()
    return base64.b64decode("".join(t.strip().splitlines()[1:-1]))
b, env, out, i = body("agent-ec256.kfk"), open("keys/fr.env", "rb").read(), None, 6
out = bytearray(b[:6])
while i < len(b):
    tag, n = b[i], int.from_bytes(b[i + 1:i + 5], "big")
    v = env if tag == 3 else b[i + 5:i + 5 + n]
    out += bytes([tag]) + len(v).to_bytes(4, "big") + v
    i += 5 + n
s = base64.b64encode(bytes(out)).decode()
open("agent-fr.kfk", "w").write("-----BEGIN KEYFENCE KEY-----\n" + "\n".join(s[j:j + 64] for j in range(0, len(s), 64)) + "\n-----END KEYFENCE KEY-----\n")
PY

nginx_conf() { # DIR PORT CERT KEY [PORT CERT KEY]
    local dir="$1"; shift
    mkdir -p "$dir/tmp"
    {
        echo "daemon off; master_process on; worker_processes 2; user www-data;"
        echo "pid $dir/nginx.pid; error_log $dir/error.log;"
        echo "events { worker_connections 64; }"
        echo "http { access_log off; client_body_temp_path $dir/tmp; proxy_temp_path $dir/tmp;"
        echo "  fastcgi_temp_path $dir/tmp; uwsgi_temp_path $dir/tmp; scgi_temp_path $dir/tmp;"
        while [ $# -gt 0 ]; do
            echo "  server { listen 127.0.0.1:$1 ssl; ssl_protocols TLSv1.2 TLSv1.3;"
            echo "    ssl_certificate $work/$2; ssl_certificate_key $work/$3;"
            echo "    location / { return 200 \"ok\\n\"; } }"
            shift 3
        done
        echo "}"
    } >"$dir/nginx.conf"
}
apache_conf() { # DIR PORT CERT KEY [PORT CERT KEY]: Debian's apache2 as installed, prefork, www-data
    local dir="$1"; shift
    mkdir -p "$dir" && chmod 755 "$dir" && echo ok >"$dir/index.html"
    {
        echo "ServerRoot /etc/apache2"
        echo "ServerName localhost"
        echo "DefaultRuntimeDir $dir"
        echo "PidFile $dir/apache.pid"
        echo "Mutex file:$dir default"
        for m in mpm_prefork authz_core dir socache_shmcb ssl; do
            echo "LoadModule ${m}_module /usr/lib/apache2/modules/mod_$m.so"
        done
        echo "User www-data"
        echo "Group www-data"
        echo "ErrorLog $dir/error.log"
        echo "StartServers 2"
        echo "SSLSessionCache shmcb:$dir/ssl_scache(512000)"
        echo "DocumentRoot $dir"
        echo "DirectoryIndex index.html"
        while [ $# -gt 0 ]; do
            echo "Listen 127.0.0.1:$1"
            echo "<VirtualHost 127.0.0.1:$1>"
            echo "  SSLEngine on"
            echo "  SSLProtocol -all +TLSv1.2 +TLSv1.3"
            echo "  SSLCertificateFile $work/$2"
            echo "  SSLCertificateKeyFile $work/$3"
            echo "</VirtualHost>"
            shift 3
        done
    } >"$dir/apache.conf"
}

echo "== nginx and Apache with www-data workers, keys in the agent"
p1=$(free_port) p2=$(free_port) p3=$(free_port) p4=$(free_port)
nginx_conf "$work/n" "$p1" keys/ec256.crt agent-ec256.kfk "$p2" keys/rsa2048.crt agent-rsa2048.kfk
OPENSSL_CONF="$work/keyfence.cnf" nginx -t -p "$work/n" -c "$work/n/nginx.conf" -e "$work/n/error.log" >n-t.out 2>&1 ||
    fail "nginx -t: $(cat n-t.out)"
OPENSSL_CONF="$work/keyfence.cnf" nginx -p "$work/n" -c "$work/n/nginx.conf" -e "$work/n/error.log" &
pids+=($!)
nginx_master=$!
apache_conf "$work/a" "$p3" keys/ec256.crt agent-ec256.kfk "$p4" keys/rsa2048.crt agent-rsa2048.kfk
OPENSSL_CONF="$work/keyfence.cnf" apache2 -f "$work/a/apache.conf" -k start || fail "apache2: $(cat a/error.log)"
wait_port "$p1"
wait_port "$p3"
check_serves "$p1" "$p2" "$p3" "$p4"
workers="$(pgrep -u www-data -P "$nginx_master" | tr '\n' ' ') $(pgrep -u www-data -P "$(cat a/apache.pid)" | tr '\n' ' ')"
[ "$(echo $workers | wc -w)" -ge 4 ] || fail "expected www-data workers, found: $workers"
echo "served TLS 1.2 and 1.3 (EC, RSA) from www-data workers: $workers"

scalar="$(openssl pkey -in keys/ec256.pem -text -noout | sed -n '/^priv:/,/^pub:/p' | sed '1d;$d' | tr -d ' :\n')"
scalar="${scalar: -64}"
python3 "$here/memscan.py" "$main_agent" "$scalar" >/dev/null ||
    fail "the agent does not hold the private scalar: the memory search cannot see keys"
for p in $workers "$nginx_master" "$(cat a/apache.pid)"; do
    if python3 "$here/memscan.py" "$p" "$scalar" >/dev/null; then fail "process $p holds the private key"; fi
done
echo "no server process holds the private scalar; the agent does"

echo "== another user is refused"
runuser -u nobody -- env OPENSSL_CONF="$work/keyfence.cnf" openssl pkey -in "keyfence:$work/agent-ec256.kfk" -pubout \
    >nobody.out 2>&1 && fail "nobody used the agent"
grep -q "Permission denied" nobody.out || fail "nobody's refusal does not say why: $(cat nobody.out)"
# A socket open to all by its mode: the agent's allow-list refuses.
start_agent run/open.sock --socket-mode 666 --allow-user www-data
open_agent=$agent_pid
"$cli" provider-key --agent run/open.sock --envelope keys/ec256.env --out open-ec256.kfk
runuser -u nobody -- env OPENSSL_CONF="$work/keyfence.cnf" openssl pkey -in "keyfence:$work/open-ec256.kfk" -pubout \
    >nobody.out 2>&1 && fail "nobody used the open agent"
grep -q "user nobody (uid [0-9]*) is not allowed" nobody.out || fail "the open agent's refusal: $(cat nobody.out)"
grep -q "refused a client" run/open.sock.err || fail "the agent did not log the refusal: $(cat run/open.sock.err)"
kill "$open_agent"

echo "== the agent killed, then started again"
kill -9 "$main_agent"
wait "$main_agent" 2>/dev/null || true
for p in "$p1" "$p3"; do [ "$(get "$p" 1.3)" = "ok" ] && fail "port $p served with the agent gone"; done
why="the agent is being reconnected to\|connection to the agent (pid [0-9]*) ended"
grep -q "$why" n/error.log || fail "nginx's log does not say why: $(tail -3 n/error.log)"
grep -q "$why" a/error.log || fail "Apache's log does not say why: $(tail -3 a/error.log)"
start_agent run/agent.sock --allow-user www-data --socket-group www-data
main_agent=$agent_pid
for _ in $(seq 100); do
    ok=1
    for p in "$p1" "$p2" "$p3" "$p4"; do [ "$(get "$p" 1.3)" = "ok" ] || ok=0; done
    [ "$ok" = 1 ] && break
    sleep 0.1
done
check_serves "$p1" "$p2" "$p3" "$p4"
echo "served again after the agent came back, the servers not restarted"

echo "== keys that cannot be used stop a server's start, saying why"
# refused_by WHY DIR KEY: nginx -t and Apache's start, each with KEY, fail
# and say REASON (the provider's words) where they report at their default
# log level: nginx -t's output, Apache's error log.
refused_by() {
    local why="$1" dir="$2" key="$3"
    nginx_conf "$dir-n" "$(free_port)" keys/ec256.crt "$key"
    OPENSSL_CONF="$work/keyfence.cnf" nginx -t -p "$dir-n" -c "$dir-n/nginx.conf" -e "$dir-n/error.log" >"$dir-n.out" 2>&1 &&
        fail "nginx -t accepted $key ($why)"
    grep -q "$why" "$dir-n.out" || fail "nginx -t with $key: $(cat "$dir-n.out")"
    apache_conf "$dir-a" "$(free_port)" keys/ec256.crt "$key"
    OPENSSL_CONF="$work/keyfence.cnf" apache2 -f "$dir-a/apache.conf" -k start 2>"$dir-a.err" &&
        fail "Apache started with $key ($why)"
    grep -q "$why" "$dir-a/error.log" || fail "Apache's log with $key: $(cat "$dir-a/error.log")"
}
refused_by POLICY_NOT_SATISFIED "$work/unopenable" agent-fr.kfk
kill -9 "$main_agent"
wait "$main_agent" 2>/dev/null || true
refused_by "cannot connect to the agent" "$work/agent-down" agent-ec256.kfk
# stunnel, which showed only "bad keyfence key file": the reason on its
# output at its default level (the provider's log line).
printf 'foreground = yes\npid =\n[tls]\naccept = 127.0.0.1:%s\nconnect = 127.0.0.1:9\ncert = %s\nkey = %s\n' \
    "$(free_port)" "$work/keys/ec256.crt" "$work/agent-ec256.kfk" >stunnel.conf
OPENSSL_CONF="$work/keyfence.cnf" timeout 20 stunnel4 stunnel.conf >stunnel.out 2>&1 && fail "stunnel started with the agent down"
grep -q "cannot connect to the agent" stunnel.out || fail "stunnel with the agent down: $(cat stunnel.out)"
echo "nginx -t, Apache and stunnel refused keys they cannot use, each saying why"
echo "deployed: ok"
