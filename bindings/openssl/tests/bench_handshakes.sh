#!/usr/bin/env bash
# bench_handshakes.sh CLI MODULES WORK [SECONDS] [ROUNDS]: full TLS 1.3
# handshakes per second on nginx (one worker) with a plain PEM key, a
# keyfence key file signed in the worker's process, and one signed in the
# isolated key process, for RSA-2048 and P-256; and, as deployed (run as
# root, with Debian's apache2 and the www-data user), nginx and Apache
# whose workers run as www-data, with a plain PEM key and with a key held
# by the key agent. The servers run side by side and are measured in turn,
# ROUNDS times each (SECONDS of `openssl s_time -new` per turn), so a
# change in the machine's load falls on all alike. Prints one JSON line per
# key type with the ratios to the plain key on the same server (targets:
# in process >= 0.95, isolated >= 0.85, agent >= 0.9).
# MODULES should hold a release build (cmake -DCMAKE_BUILD_TYPE=Release).
set -euo pipefail
cli="$1" modules="$2" work="$3" secs="${4:-3}" rounds="${5:-3}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
# shellcheck source=common.sh
. "$here/common.sh"
trap stop_servers EXIT
keys_and_configs
user_line=""
[ "$(id -u)" = 0 ] && user_line="user root;"
# As deployed: www-data workers, keys in the agent (its socket's group
# www-data), beside the same servers with plain keys.
deployed=""
if [ "$(id -u)" = 0 ] && id www-data >/dev/null 2>&1 && command -v apache2 >/dev/null; then
    deployed=1
    chmod 755 "$work"
    mkdir -m 755 run
    "$cli" agent --socket "$work/run/agent.sock" --store keys/served --machine-key keys/us.machine \
        --allow-user www-data --socket-group www-data >agent.out 2>agent.err &
    pids+=($!)
    for _ in $(seq 100); do grep -q listening agent.out && break; sleep 0.1; done
    for k in rsa2048 ec256; do
        "$cli" provider-key --agent "$work/run/agent.sock" --envelope keys/$k.env --out keys/$k.agent
    done
fi
# start NAME CNF KEY_SUFFIX [USER]: an nginx serving RSA-2048 and P-256
# (one port each), its worker as USER (default: root when run as root).
declare -A port
start() {
    local d="$work/$1" user="${4:+user $4;}"
    mkdir -p "$d/tmp"
    port[$1-rsa2048]=$(free_port)
    port[$1-ec256]=$(free_port)
    cat >"$d/nginx.conf" <<CONF
daemon off; master_process on; worker_processes 1; ${user:-$user_line}
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
# apache NAME KEY_SUFFIX: Apache (prefork, www-data children) serving
# RSA-2048 and P-256, one port each.
apache() {
    local d="$work/$1" k
    mkdir -p "$d" && chmod 755 "$d"
    port[$1-rsa2048]=$(free_port)
    port[$1-ec256]=$(free_port)
    {
        echo "ServerRoot /etc/apache2"
        echo "ServerName localhost"
        echo "DefaultRuntimeDir $d"
        echo "PidFile $d/apache.pid"
        echo "Mutex file:$d default"
        for m in mpm_prefork authz_core socache_shmcb ssl; do
            echo "LoadModule ${m}_module /usr/lib/apache2/modules/mod_$m.so"
        done
        echo "User www-data"
        echo "Group www-data"
        echo "ErrorLog $d/error.log"
        echo "StartServers 4"
        echo "SSLSessionCache none"
        echo "SSLSessionTickets off"
        for k in rsa2048 ec256; do
            echo "Listen 127.0.0.1:${port[$1-$k]}"
            echo "<VirtualHost 127.0.0.1:${port[$1-$k]}>"
            echo "  SSLEngine on"
            echo "  SSLProtocol -all +TLSv1.3"
            echo "  SSLCertificateFile $work/keys/$k.crt"
            echo "  SSLCertificateKeyFile $work/keys/$k.$2"
            echo "</VirtualHost>"
        done
    } >"$d/apache.conf"
    OPENSSL_CONF="$work/local.cnf" apache2 -f "$d/apache.conf" -k start
    apache_dirs+=("$d")
    wait_port "${port[$1-ec256]}"
}
apache_dirs=()
stop_apaches() {
    local d
    for d in "${apache_dirs[@]}"; do [ -f "$d/apache.pid" ] && kill "$(cat "$d/apache.pid")" 2>/dev/null; done
    stop_servers
}
trap stop_apaches EXIT
start plain local.cnf pem
start inproc local.cnf kfk
start isolated isolated.cnf kfk
modes=(plain inproc isolated)
if [ -n "$deployed" ]; then
    start www-plain local.cnf pem www-data
    start www-agent local.cnf agent www-data
    apache apache-plain pem
    apache apache-agent agent
    modes+=(www-plain www-agent apache-plain apache-agent)
fi
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
    declare -A sum=()
    for m in "${modes[@]}"; do sum[$m]=0; done
    for r in $(seq "$rounds"); do
        for m in "${modes[@]}"; do
            x=$(rate "${port[$m-$key]}")
            sum[$m]=$(python3 -c "print(${sum[$m]} + $x)")
        done
    done
    args=()
    for m in "${modes[@]}"; do args+=("$m=${sum[$m]}"); done
    python3 - "$key" "$rounds" "${args[@]}" <<'PY'
import json, sys
key, rounds = sys.argv[1], int(sys.argv[2])
hs = {m: float(v) / rounds for m, v in (a.split("=") for a in sys.argv[3:])}
out = {"key": key, "plain_hs_per_s": round(hs["plain"], 1),
       "keyfence_in_process_hs_per_s": round(hs["inproc"], 1),
       "keyfence_isolated_hs_per_s": round(hs["isolated"], 1),
       "in_process_ratio": round(hs["inproc"] / hs["plain"], 3), "isolated_ratio": round(hs["isolated"] / hs["plain"], 3)}
targets = {"in_process": 0.95, "isolated": 0.85}
if "www-agent" in hs:
    out.update({"nginx_www_data_plain_hs_per_s": round(hs["www-plain"], 1),
                "nginx_www_data_agent_hs_per_s": round(hs["www-agent"], 1),
                "nginx_agent_ratio": round(hs["www-agent"] / hs["www-plain"], 3),
                "apache_www_data_plain_hs_per_s": round(hs["apache-plain"], 1),
                "apache_www_data_agent_hs_per_s": round(hs["apache-agent"], 1),
                "apache_agent_ratio": round(hs["apache-agent"] / hs["apache-plain"], 3)})
    targets.update({"nginx_agent": 0.9, "apache_agent": 0.9})
out["targets"] = targets
print(json.dumps(out))
PY
done
