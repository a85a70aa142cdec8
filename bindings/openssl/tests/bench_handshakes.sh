#!/usr/bin/env bash
# bench_handshakes.sh CLI MODULES WORK [SECONDS] [ROUNDS]: full TLS 1.3
# handshakes per second on nginx (one worker) with a plain PEM key, a
# keyfence key file signed in the worker's process, and one signed in the
# isolated key process, for RSA-2048 and P-256. The three nginx run side by
# side and are measured in turn, ROUNDS times each (SECONDS of
# `openssl s_time -new` per turn), so a change in the machine's load falls
# on all three alike. Prints one JSON line per key type with the ratios to
# the plain key (targets: in process >= 0.95, isolated >= 0.85).
# MODULES should hold a release build (cmake -DCMAKE_BUILD_TYPE=Release).
set -euo pipefail
cli="$1" modules="$2" work="$3" secs="${4:-3}" rounds="${5:-3}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {
    local i
    for i in $(seq 200); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on port $1" >&2
    exit 1
}
bash "$here/make_keys.sh" "$cli" keys
"$cli" provider-config --module "$modules/keyfence.so" >local.cnf
"$cli" provider-config --module "$modules/keyfence.so" --isolated >isolated.cnf
user_line=""
[ "$(id -u)" = 0 ] && user_line="user root;"
# start NAME CNF KEY_SUFFIX: an nginx serving RSA-2048 and P-256 (one port each).
declare -A port
start() {
    local d="$work/$1"
    mkdir -p "$d/tmp"
    port[$1-rsa2048]=$(free_port)
    port[$1-ec256]=$(free_port)
    cat >"$d/nginx.conf" <<CONF
daemon off; master_process on; worker_processes 1; $user_line
pid $d/nginx.pid; error_log $d/error.log warn;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path $d/tmp; proxy_temp_path $d/tmp;
  fastcgi_temp_path $d/tmp; uwsgi_temp_path $d/tmp; scgi_temp_path $d/tmp;
  ssl_protocols TLSv1.3; ssl_session_tickets off; ssl_session_cache off;
  server { listen 127.0.0.1:${port[$1-rsa2048]} ssl;
    ssl_certificate $work/keys/rsa2048.crt; ssl_certificate_key $work/keys/rsa2048.$3; }
  server { listen 127.0.0.1:${port[$1-ec256]} ssl;
    ssl_certificate $work/keys/ec256.crt; ssl_certificate_key $work/keys/ec256.$3; }
}
CONF
    OPENSSL_CONF="$work/$2" nginx -p "$d" -c "$d/nginx.conf" -e "$d/error.log" &
    pids+=($!)
    wait_port "${port[$1-ec256]}"
}
start plain local.cnf pem
start inproc local.cnf kfk
start isolated isolated.cnf kfk
# rate PORT: full handshakes per second over $secs seconds.
rate() {
    local t0 t1 n
    t0=$(date +%s.%N)
    n=$(openssl s_time -connect "127.0.0.1:$1" -new -tls1_3 -time "$secs" 2>/dev/null |
        sed -n 's/^\([0-9]*\) connections in .*real seconds.*/\1/p' | head -1)
    t1=$(date +%s.%N)
    python3 -c "print(${n:-0} / ($t1 - $t0))"
}
for key in rsa2048 ec256; do
    declare -A sum=([plain]=0 [inproc]=0 [isolated]=0)
    for r in $(seq "$rounds"); do
        for m in plain inproc isolated; do
            x=$(rate "${port[$m-$key]}")
            sum[$m]=$(python3 -c "print(${sum[$m]} + $x)")
        done
    done
    python3 - "$key" "${sum[plain]}" "${sum[inproc]}" "${sum[isolated]}" "$rounds" <<'PY'
import json, sys
key, plain, inproc, isolated, rounds = sys.argv[1], *map(float, sys.argv[2:5]), int(sys.argv[5])
print(json.dumps({"key": key, "plain_hs_per_s": round(plain / rounds, 1),
                  "keyfence_in_process_hs_per_s": round(inproc / rounds, 1),
                  "keyfence_isolated_hs_per_s": round(isolated / rounds, 1),
                  "in_process_ratio": round(inproc / plain, 3), "isolated_ratio": round(isolated / plain, 3),
                  "targets": {"in_process": 0.95, "isolated": 0.85}}))
PY
done
