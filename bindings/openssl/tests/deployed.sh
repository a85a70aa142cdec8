#!/usr/bin/env bash
# deployed.sh CLI MODULES WORK: nginx and Apache from Debian's packages as
# they are deployed, their workers running as www-data, with keyfence keys
# held by the key agent, following docs/deploy.md as a sysadmin on Debian 12
# would, the machine-wide paths under a scratch root (WORK's system/,
# standing for /):
#  - the authority apart: its store (keys/store, root's, mode 700) stays
#    out of the scratch root, which gets the servers' copy (`keyfence
#    authority export`) in /var/lib/keyfence/store and the machine key in
#    /etc/keyfence, both the agent's user's and unreadable by the workers
#    (what broke before the agent); nothing under the scratch root holds
#    the authority's state, and an agent given the authority's store
#    refuses to start, naming `keyfence authority export`;
#  - `keyfence agent` runs as its own system user (keyfence), started as
#    keyfence-agent.socket and .service would: a listener that is not the
#    agent (activate.py, in PID 1's place) makes /run/keyfence/agent.sock
#    (keyfence:www-data, 0660) and passes it at descriptor 3 (LISTEN_FDS,
#    LISTEN_PID); the agent keeps its floor in its state folder and admits
#    www-data; the key files name only its socket;
#  - the provider is added to a copy of Debian's /etc/ssl/openssl.cnf with
#    one `.include` (`keyfence provider-config --include`): `nginx -t` run
#    by root with it loads the key through the agent, and not without it;
#  - nginx (2 workers) and Apache (prefork) serve TLS 1.2 and 1.3 with EC
#    and RSA keys, the chain verified by curl;
#  - no worker's or master's memory holds the private scalar (the agent's
#    does: the search can fail);
#  - another user is refused (by the socket's mode, and by the agent's
#    allow-list when the mode lets it in);
#  - the agent killed: handshakes fail and the servers log why; started
#    again: handshakes succeed without restarting the servers;
#  - a policy key rotated and retired under a serving, reloading nginx
#    (issue 52.4), the servers' copy copied in after each export: no
#    request and no reload fails, and after the retirement new workers, a
#    new key file of the old envelope, and an agent started since (nothing
#    cached) still load the key, which the agent opens from the store's
#    copy;
#  - local users attacking the agent (issue 52.3), run as nobody: one it
#    refuses dribbling 300 connections, one it allows never reading its
#    replies; meanwhile each `nginx -s reload` and a handshake through the
#    attacked agent after it take less than 2 s;
#  - with the agent down, or a key it cannot open, `nginx -t` and Apache's
#    start fail, saying why; so does stunnel's (agent down).
# Needs root (the servers drop to www-data, the agent to its user) and
# Debian's nginx, apache2 and stunnel4. Creates the system user keyfence
# if there is none, and deletes it at the end.
set -euo pipefail
cli="$1" modules="$2" work="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
missing=""
[ "$(id -u)" = 0 ] || missing="root"
command -v nginx >/dev/null || missing="$missing nginx"
command -v apache2 >/dev/null || missing="$missing apache2"
command -v stunnel4 >/dev/null || missing="$missing stunnel4"
id www-data >/dev/null 2>&1 || missing="$missing www-data"
id nobody >/dev/null 2>&1 || missing="$missing nobody"
command -v setpriv >/dev/null || missing="$missing setpriv"
command -v useradd >/dev/null || missing="$missing useradd"
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
# The agents' pids: each agent is its listener's child, not this shell's,
# so it is killed by its pid and waited for by looking (pids, from
# common.sh, holds this shell's children: servers, listeners, loops,
# attackers).
agents=()
gone() { local s; s="$(ps -o stat= -p "$1" 2>/dev/null)" || return 0; [ -z "$s" ] || [ "${s#Z}" != "$s" ]; }
forget() { # PID: no longer killed at the end (it ended, and its pid may be reused)
    local p kept=()
    for p in "${agents[@]}"; do [ "$p" = "$1" ] || kept+=("$p"); done
    agents=("${kept[@]}")
    kept=()
    for p in "${pids[@]}"; do [ "$p" = "$1" ] || kept+=("$p"); done
    pids=("${kept[@]}")
}
created_user=""
cleanup() {
    local rc=$? p
    for p in "${agents[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    for p in "${agents[@]}"; do for _ in $(seq 100); do gone "$p" && break; sleep 0.05; done; done
    if [ -f a/apache.pid ]; then kill "$(cat a/apache.pid)" 2>/dev/null || true; fi
    stop_servers
    # Apache's children end with their parent; wait for its pid file to go.
    for _ in $(seq 50); do [ -f a/apache.pid ] || break; sleep 0.1; done
    if [ -n "$created_user" ]; then
        userdel "$created_user" || echo "deployed.sh: could not delete the user $created_user" >&2
        if getent group "$created_user" >/dev/null; then groupdel "$created_user" || true; fi
    fi
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

# The authority's machine: keys/ (make_keys.sh: the authority's store,
# store/, and its servers' copy, served/, made by `keyfence authority
# export`), root's alone. The server's files are made from it below, as
# they would be sent to a server.
bash "$here/make_keys.sh" "$cli" keys
chmod 700 keys
[ -e keys/store/authority/state ] || fail "make_keys.sh made no authority store"
[ -e keys/served/public/generations ] && [ ! -e keys/served/authority ] ||
    fail "keys/served is not a servers' copy: $(ls keys/served)"

# The agent's own user. The package's (sysusers.d/keyfence.conf) if it is
# installed, else one made for this test and deleted at its end: not an
# existing user such as daemon, whose files and processes are others', and
# never www-data or nobody, the users the agent must keep out of its keys.
agent_user=keyfence
if ! id "$agent_user" >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$agent_user"
    created_user="$agent_user"
fi
agent_group="$(id -gn "$agent_user")"
as_agent=(setpriv --reuid="$agent_user" --regid="$agent_group" --init-groups --)

# The scratch root, laid out as docs/deploy.md's "Install the agent on a
# server" does on /: the command line where the package puts it (the build
# tree may be in root's home, which the agent's user cannot enter), the
# machine key and the key files in /etc/keyfence, the servers' copy and
# the agent's floor in /var/lib/keyfence, its socket in /run/keyfence.
sys="$work/system"
etc="system/etc/keyfence" # relative to $work, as the servers' configurations take them
state="$sys/var/lib/keyfence"
store="$state/store"
mkdir -p "$sys/usr/bin" "$sys/var/lib" "$sys/run" "$sys/etc/ssl"
chmod -R 755 "$sys"
install -m 755 "$cli" "$sys/usr/bin/keyfence"
install -d -m 755 "$sys/etc/keyfence"
install -o "$agent_user" -g "$agent_group" -m 400 keys/us.machine "$sys/etc/keyfence/machine.key"
install -d -o "$agent_user" -g "$agent_group" -m 700 "$state"
# The page's `rsync -a --delete served/ /var/lib/keyfence/store/ && chown
# -R keyfence:keyfence ...`, with cp -a (rsync is not in Debian's base
# system): no agent reads the store yet. Later copies, under a running
# agent, go through copy_store (below).
cp -a keys/served "$store"
chown -R "$agent_user:$agent_group" "$store"
install -d -m 755 "$sys/run/keyfence"
no_authority_state() { # nothing under the scratch root is the authority's
    local found
    found="$(find "$sys" -path '*authority*')"
    [ -z "$found" ] || fail "the server's files hold the authority's: $found"
}
agents_own() { # DIR: every file in it the agent's user's
    local others
    others="$(find "$1" ! -user "$agent_user")"
    [ -z "$others" ] || fail "not the agent's user's: $others"
}
agents_own "$store"
no_authority_state
# What broke before: the workers' user cannot read what opens the keys.
runuser -u www-data -- cat keys/us.machine >/dev/null 2>&1 && fail "www-data can read the machine key: the test proves nothing"
runuser -u www-data -- cat "$sys/etc/keyfence/machine.key" >/dev/null 2>&1 && fail "www-data can read the server's machine key"
runuser -u www-data -- ls "$store" >/dev/null 2>&1 && fail "www-data can read the server's store"
"${as_agent[@]}" cat "$sys/etc/keyfence/machine.key" >/dev/null || fail "the agent's user cannot read its machine key"

echo "== an agent given the authority's store refuses to start"
# The page's own example, as root on the authority's machine (exit 3)...
set +e
(cd keys && timeout 20 "$cli" agent --socket "$work/wrong.sock" --store store --machine-key us.machine) >wrong.out 2>&1
rc=$?
set -e
[ "$rc" = 3 ] || fail "an agent on the authority's store: exit $rc, not 3: $(cat wrong.out)"
grep -q "keyfence authority export" wrong.out || fail "the refusal does not name keyfence authority export: $(cat wrong.out)"
# ...and a sysadmin's slip on a server: the authority's store copied where
# the servers' copy goes, the agent's user's (outside the scratch root,
# and deleted at once).
mkdir -m 700 slip
cp -a keys/store slip/store
chown -R "$agent_user:$agent_group" slip
set +e
timeout 20 "${as_agent[@]}" "$sys/usr/bin/keyfence" agent --socket "$work/slip/agent.sock" --store "$work/slip/store" \
    --machine-key "$sys/etc/keyfence/machine.key" --state-dir "$work/slip" >slip.out 2>&1
rc=$?
set -e
rm -rf slip
[ "$rc" = 3 ] || fail "the agent's user's agent on a copy of the authority's store: exit $rc, not 3: $(cat slip.out)"
grep -q "keyfence authority export" slip.out || fail "the refusal does not name keyfence authority export: $(cat slip.out)"
echo "refused, naming keyfence authority export: $(grep -o 'holds the authority.s secrets[^:]*' slip.out | head -1)"

# copy_store: the servers' copy copied into the scratch store under a
# running agent, as the agent's user's files. Not cp -a, nor the page's
# `rsync -a --delete` and `chown -R` after it: either writes envelopes/
# and public/ before sealed/ (rsync in name order), so an agent loading a
# key meanwhile meets a re-wrapped envelope whose policy key version is
# not there yet (UNKNOWN_POLICY_KEY), and leaves new files root's, which
# the agent cannot read, until the chown; cp also writes files in place,
# where the agent may read half of one. Here, as `keyfence authority
# export` writes its copy: sealed keys, envelopes, then the lists that name
# them, each file whole (copied beside, made the agent's, renamed into
# place), then what the source no longer has deleted.
copy_store() { # SRC DST
    local src="$1" dst="$2" d f
    for d in sealed envelopes public; do
        [ -d "$src/$d" ] || continue
        while IFS= read -r f; do
            if [ -d "$src/$f" ]; then
                [ -d "$dst/$f" ] || install -d -o "$agent_user" -g "$agent_group" -m 700 "$dst/$f"
                continue
            fi
            cmp -s "$src/$f" "$dst/$f" && continue
            cp -p "$src/$f" "$work/incoming"
            chown "$agent_user:$agent_group" "$work/incoming"
            mv -f "$work/incoming" "$dst/$f"
        done < <(cd "$src" && find "$d" | sort)
    done
    for d in sealed envelopes public; do
        [ -d "$dst/$d" ] || continue
        while IFS= read -r f; do
            [ -e "$src/$f" ] || rm -f "$dst/$f"
        done < <(cd "$dst" && find "$d" -type f)
        find "$dst/$d" -mindepth 1 -type d -empty -delete
    done
    agents_own "$dst"
    no_authority_state
}

# The agent as keyfence-agent.socket and keyfence-agent.service start it:
# the listener (activate.py, PID 1's part) makes the socket, owner the
# agent's user and group www-data, and starts the unit's command as the
# agent's user, its state folder in STATE_DIRECTORY as StateDirectory=
# sets it (an option --state-dir overrides it).
start_agent() { # NAME MODE [OPTIONS...]: the socket $sys/run/keyfence/NAME.sock
    local name="$1" mode="$2" socket="$sys/run/keyfence/$1.sock" i
    shift 2
    # Not the last agent's lines: the file is made anew by the listener's
    # redirection, which may come after the first look below.
    rm -f "$name.out"
    python3 "$here/activate.py" "$socket" "$agent_user" www-data "$mode" \
        "${as_agent[@]}" env STATE_DIRECTORY="$state" \
        "$sys/usr/bin/keyfence" agent --socket "$socket" --store "$store" \
        --machine-key "$sys/etc/keyfence/machine.key" --log info "$@" >"$name.out" 2>>"$name.err" &
    pids+=($!)
    listener_pid=$!
    agent_pid=""
    for i in $(seq 200); do
        if [ -z "$agent_pid" ]; then
            agent_pid="$(sed -n 's/^agent \([0-9]*\)$/\1/p' "$name.out" 2>/dev/null)"
            [ -n "$agent_pid" ] && agents+=("$agent_pid")
        fi
        grep -q "^listening" "$name.out" 2>/dev/null && return 0
        grep -q "^agent ended" "$name.out" 2>/dev/null && break
        sleep 0.1
    done
    fail "the agent $name did not start: $(cat "$name.out" "$name.err")"
}
stop_agent() { # AGENT LISTENER: the agent killed (-9, a crash), and its socket unit stopped (the socket removed)
    kill -9 "$1" || fail "the agent $1 was not running: $(tail -3 ./*.err)"
    for _ in $(seq 100); do gone "$1" && break; sleep 0.05; done
    gone "$1" || fail "the agent $1 did not end"
    kill "$2"
    wait "$2" 2>/dev/null || true
    forget "$1"
    forget "$2"
}
start_agent agent 660 --allow-user www-data
main_agent=$agent_pid main_listener=$listener_pid
# Its user, its socket (made by another process), its floor.
[ "$(ps -o ruser=,euser= -p "$main_agent" | xargs)" = "$agent_user $agent_user" ] ||
    fail "the agent runs as $(ps -o ruser=,euser= -p "$main_agent"), not $agent_user"
[ "$main_agent" != "$main_listener" ] && [ "$(ps -o ppid= -p "$main_agent" | xargs)" = "$main_listener" ] ||
    fail "the agent $main_agent is not its listener's ($main_listener) child"
[ "$(stat -c '%U:%G %a' "$sys/run/keyfence/agent.sock")" = "$agent_user:www-data 660" ] ||
    fail "the socket: $(stat -c '%U:%G %a' "$sys/run/keyfence/agent.sock")"
[ "$(stat -c %U "$state/machine.newest.lock" 2>&1)" = "$agent_user" ] || fail "the agent holds no floor in its state folder: $(ls -la "$state")"
echo "the agent runs as $agent_user (pid $main_agent) on the socket its listener (pid $main_listener) made"
for k in ec256 rsa2048; do
    "$cli" provider-key --agent "$sys/run/keyfence/agent.sock" --envelope keys/$k.env --out "$etc/$k.kfk"
done
# The provider as installed (the package's multiarch folder), where every
# user may read it (the build tree may be in root's home, which nobody
# else can enter).
multiarch="$(cc -print-multiarch 2>/dev/null || true)"
[ -n "$multiarch" ] || multiarch="$(uname -m)-linux-gnu"
lib="$sys/usr/lib/$multiarch"
mkdir -p "$lib/ossl-modules"
cp "$modules/keyfence.so" "$lib/ossl-modules/"
cp -L "$modules"/../libkeyfence.so.0 "$lib/"
chmod -R a+rX "$sys/usr"
# The system's OpenSSL configuration, as the page adds the provider to it:
# a copy of Debian's /etc/ssl/openssl.cnf (the real one is never touched)
# with one `.include`. Every program here reads it through OPENSSL_CONF,
# standing for the default path; the copy before the line is the control.
cp /etc/ssl/openssl.cnf "$sys/etc/ssl/openssl.cnf.orig"
cp /etc/ssl/openssl.cnf "$sys/etc/ssl/openssl.cnf"
"$cli" provider-config --module "$lib/ossl-modules/keyfence.so" --include >"$sys/etc/keyfence/openssl-include.cnf"
echo ".include $sys/etc/keyfence/openssl-include.cnf" >>"$sys/etc/ssl/openssl.cnf"
conf="$sys/etc/ssl/openssl.cnf"
# A key file naming the agent whose envelope the agent's machine (US) may
# not open: the FR key's envelope in place of the EC key's.
python3 - "$etc/ec256.kfk" keys/fr.env "$etc/fr.kfk" <<'PY'
import base64, sys
def body(path):
    t = open(path).read()
    return base64.b64decode("".join(t.strip().splitlines()[1:-1]))
b, env, out, i = body(sys.argv[1]), open(sys.argv[2], "rb").read(), None, 6
out = bytearray(b[:6])
while i < len(b):
    tag, n = b[i], int.from_bytes(b[i + 1:i + 5], "big")
    v = env if tag == 3 else b[i + 5:i + 5 + n]
    out += bytes([tag]) + len(v).to_bytes(4, "big") + v
    i += 5 + n
s = base64.b64encode(bytes(out)).decode()
open(sys.argv[3], "w").write("-----BEGIN KEYFENCE KEY-----\n" + "\n".join(s[j:j + 64] for j in range(0, len(s), 64)) + "\n-----END KEYFENCE KEY-----\n")
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
nginx_conf "$work/n" "$p1" keys/ec256.crt "$etc/ec256.kfk" "$p2" keys/rsa2048.crt "$etc/rsa2048.kfk"
# `nginx -t` as an admin types it, root with the system's configuration:
# the key files hold no key, so it loads them through the agent; without
# the `.include` line (the control) it cannot.
OPENSSL_CONF="$conf" nginx -t -p "$work/n" -c "$work/n/nginx.conf" -e "$work/n/error.log" >n-t.out 2>&1 ||
    fail "nginx -t: $(cat n-t.out)"
OPENSSL_CONF="$sys/etc/ssl/openssl.cnf.orig" nginx -t -p "$work/n" -c "$work/n/nginx.conf" -e "$work/n/error.log" >n-t-orig.out 2>&1 &&
    fail "nginx -t loaded a keyfence key file without the provider: $(cat n-t-orig.out)"
grep -q "cannot load certificate key" n-t-orig.out || fail "nginx -t without the provider: $(cat n-t-orig.out)"
echo "nginx -t as root, with the .include line: $(grep -o 'test is successful' n-t.out)"
OPENSSL_CONF="$conf" nginx -p "$work/n" -c "$work/n/nginx.conf" -e "$work/n/error.log" &
pids+=($!)
nginx_master=$!
apache_conf "$work/a" "$p3" keys/ec256.crt "$etc/ec256.kfk" "$p4" keys/rsa2048.crt "$etc/rsa2048.kfk"
OPENSSL_CONF="$conf" apache2 -f "$work/a/apache.conf" -k start || fail "apache2: $(cat a/error.log)"
wait_port "$p1"
wait_port "$p3"
check_serves "$p1" "$p2" "$p3" "$p4"
workers="$(pgrep -u www-data -P "$nginx_master" | tr '\n' ' ') $(pgrep -u www-data -P "$(cat a/apache.pid)" | tr '\n' ' ')"
[ "$(echo $workers | wc -w)" -ge 4 ] || fail "expected www-data workers, found: $workers"
echo "served TLS 1.2 and 1.3 (EC, RSA) from www-data workers: $workers"
# The newest lists the agent accepted, kept in its state folder.
[ "$(stat -c %U "$state/machine.newest" 2>&1)" = "$agent_user" ] || fail "no floor in the agent's state folder: $(ls -la "$state")"

scalar="$(openssl pkey -in keys/ec256.pem -text -noout | sed -n '/^priv:/,/^pub:/p' | sed '1d;$d' | tr -d ' :\n')"
scalar="${scalar: -64}"
python3 "$here/memscan.py" "$main_agent" "$scalar" >/dev/null ||
    fail "the agent does not hold the private scalar: the memory search cannot see keys"
for p in $workers "$nginx_master" "$(cat a/apache.pid)" "$main_listener"; do
    if python3 "$here/memscan.py" "$p" "$scalar" >/dev/null; then fail "process $p holds the private key"; fi
done
echo "no server process (nor the agent's listener) holds the private scalar; the agent does"

echo "== provider-check: the servers loaded the provider; a process from before it did not"
"$cli" provider-check --config "$conf" --pid "$nginx_master" --pid "$(cat a/apache.pid)" >check.out 2>&1 ||
    fail "provider-check refused the running servers: $(cat check.out)"
grep -q "pid $nginx_master (nginx) has loaded" check.out || fail "provider-check: $(cat check.out)"
# The control: the agent's listener never loaded the provider, as a master
# started before the .include had not; the check says to restart it.
"$cli" provider-check --config "$conf" --pid "$main_listener" >check.out 2>&1 &&
    fail "provider-check passed a process without the provider: $(cat check.out)"
grep -q "a restart, not a reload" check.out || fail "provider-check on the listener: $(cat check.out)"
cat check.out

echo "== another user is refused"
runuser -u nobody -- env OPENSSL_CONF="$conf" openssl pkey -in "keyfence:$work/$etc/ec256.kfk" -pubout \
    >nobody.out 2>&1 && fail "nobody used the agent"
grep -q "Permission denied" nobody.out || fail "nobody's refusal does not say why: $(cat nobody.out)"
# A socket open to all by its mode: the agent's allow-list refuses. (This
# agent stays up: the attacks below are on it.)
install -d -o "$agent_user" -g "$agent_group" -m 700 "$work/open-state"
start_agent open 666 --state-dir "$work/open-state" --allow-user www-data
"$cli" provider-key --agent "$sys/run/keyfence/open.sock" --envelope keys/ec256.env --out "$etc/open-ec256.kfk"
runuser -u nobody -- env OPENSSL_CONF="$conf" openssl pkey -in "keyfence:$work/$etc/open-ec256.kfk" -pubout \
    >nobody.out 2>&1 && fail "nobody used the open agent"
grep -q "user nobody (uid [0-9]*) is not allowed" nobody.out || fail "the open agent's refusal: $(cat nobody.out)"
grep -q "refused a client" open.err || fail "the agent did not log the refusal: $(cat open.err)"

echo "== the agent killed, then started again"
# Killed, and its socket unit stopped too (systemd would otherwise start
# it again at the next connection).
stop_agent "$main_agent" "$main_listener"
for p in "$p1" "$p3"; do [ "$(get "$p" 1.3)" = "ok" ] && fail "port $p served with the agent gone"; done
# Why, in the provider's words: a worker that was connected says the
# connection ended or is being made again; a prefork child that never
# reached the agent before it went (a spare one Apache started meanwhile)
# says it cannot connect to the socket.
why="the agent is being reconnected to\|connection to the agent (pid [0-9]*) ended\|cannot connect to the agent at $sys/run/keyfence/agent.sock"
grep -q "$why" n/error.log || fail "nginx's log does not say why: $(tail -3 n/error.log)"
grep -q "$why" a/error.log || fail "Apache's log does not say why: $(tail -3 a/error.log)"
start_agent agent 660 --allow-user www-data
main_agent=$agent_pid main_listener=$listener_pid
for _ in $(seq 100); do
    ok=1
    for p in "$p1" "$p2" "$p3" "$p4"; do [ "$(get "$p" 1.3)" = "ok" ] || ok=0; done
    [ "$ok" = 1 ] && break
    sleep 0.1
done
check_serves "$p1" "$p2" "$p3" "$p4"
echo "served again after the agent came back, the servers not restarted"

# nginx's worker processes serving now (not those shutting down).
workers_of() { ps -o pid=,args= --ppid "$1" | awk '$2 == "nginx:" && / worker process$/ { print $1 }'; }
# reload_nginx DIR MASTER: `nginx -s reload` as an admin types it (it
# loads every key itself first, and fails if one does not load), then
# waits (10 s at most) until the reload is done: two new workers, every
# old one told to quit, and the master back waiting for signals. How long
# it all took, in ms, in `took`.
#
# The last condition is for the next reload. The provider's threads in the
# master (the key process client's) leave every signal unblocked, so a
# SIGHUP that comes while the master's own thread blocks signals (between
# starting the new workers and telling the old ones to quit, 100 ms) runs
# nginx's handler on one of them: the flag is set, but the master's
# sigsuspend() is not woken, and nginx reloads only at some later signal
# (seen here: no new workers 10 s after `nginx -s reload` exited 0).
master_waits() { # MASTER: in sigsuspend() (where the kernel does not say, take it that it is)
    local w
    w="$(cat "/proc/$1/wchan" 2>/dev/null)" || return 0
    [ -z "$w" ] || [ "$w" = 0 ] || [ "${w#*sigsuspend}" != "$w" ]
}
reload_nginx() {
    local dir="$1" master="$2" old t0 p fresh stale
    old=" $(workers_of "$master" | tr '\n' ' ') "
    t0=$(date +%s%N)
    if ! OPENSSL_CONF="$conf" nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" -s reload >"$dir/reload.out" 2>&1; then
        echo "nginx -s reload failed: $(cat "$dir/reload.out")"
        return 1
    fi
    for _ in $(seq 500); do
        fresh=0 stale=0
        for p in $(workers_of "$master"); do case "$old" in *" $p "*) stale=1 ;; *) fresh=$((fresh + 1)) ;; esac; done
        if [ "$fresh" -ge 2 ] && [ "$stale" = 0 ] && master_waits "$master"; then
            took=$((($(date +%s%N) - t0) / 1000000))
            return 0
        fi
        sleep 0.02
    done
    echo "the reload was not done 10 s after nginx -s reload: $(tail -2 "$dir/error.log")"
    return 1
}

echo "== a policy key rotated and retired under a serving, reloading nginx (issue 52.4)"
# Requests (TLS 1.2 and 1.3 in turn, every port) and `nginx -s reload`
# every second, each loop counting what failed, while the authority
# rotates and retires the policy key of every served key and the servers'
# copy is copied in after each export, as the page's "Rotating and
# retiring" says.
rm -f stop-loops
(
    n=0 failed=0 v=1.2
    while [ ! -e stop-loops ]; do
        for p in "$p1" "$p2" "$p3" "$p4"; do
            n=$((n + 1))
            [ "$(get "$p" "$v")" = "ok" ] || { failed=$((failed + 1)); echo "$(date +%T.%N) port $p TLS $v failed" >>request-failures; }
        done
        if [ "$v" = 1.2 ]; then v=1.3; else v=1.2; fi
    done
    echo "$n $failed" >requests.count
) &
pids+=($!)
requests_loop=$!
(
    n=0 failed=0
    while [ ! -e stop-loops ]; do
        n=$((n + 1))
        if reload_nginx "$work/n" "$nginx_master" >reload.why; then echo "$took" >>reload-times; else
            failed=$((failed + 1))
            echo "$(date +%T.%N) $(cat reload.why)" >>reload-failures
        fi
        sleep 1
    done
    echo "$n $failed" >reloads.count
) &
pids+=($!)
reloads_loop=$!
# Reloads done so far; waiting for N more (60 s at most: each takes well
# under a second, and the loop waits 1 s between them).
reloads_done() { cat reload-times reload-failures 2>/dev/null | wc -l; }
wait_reloads() {
    local until=$(($(reloads_done) + $1))
    for _ in $(seq 600); do
        [ "$(reloads_done)" -ge "$until" ] && return 0
        sleep 0.1
    done
    fail "nginx made no reload in 60 s"
}
wait_reloads 2
(cd keys && "$cli" authority rotate-policy --store store --policy 'country: US' && "$cli" authority export --store store --to served) >authority.out
copy_store keys/served "$store"
# Every server has the copy once the agent followed its store (within
# seconds); reloads meanwhile load the key files' envelopes, now re-wrapped.
sleep 3
wait_reloads 2
(cd keys && "$cli" authority retire-policy-key --store store --policy 'country: US' && "$cli" authority export --store store --to served) >>authority.out
copy_store keys/served "$store"
# New workers after the retirement, each loading the keys anew.
sleep 1
wait_reloads 3
touch stop-loops
wait "$requests_loop" "$reloads_loop"
forget "$requests_loop"
forget "$reloads_loop"
read -r requests failed_requests <requests.count
read -r reloads failed_reloads <reloads.count
[ "$failed_requests" = 0 ] || fail "$failed_requests of $requests requests failed: $(cat request-failures)"
[ "$failed_reloads" = 0 ] || fail "$failed_reloads of $reloads reloads failed: $(cat reload-failures)"
[ "$requests" -ge 40 ] && [ "$reloads" -ge 6 ] || fail "too few requests ($requests) or reloads ($reloads) to tell"
grep -q "retired version(s) \[1\]" authority.out || fail "no policy key was retired: $(cat authority.out)"
echo "$requests requests and $reloads reloads (slowest $(sort -n reload-times | tail -1) ms), none failed, through rotate-policy and retire-policy-key"
# The key files' envelope no longer opens by itself (its version is
# retired, in the agent's store too)...
for s in keys/served "$store"; do
    set +e
    "$cli" machine open --store "$s" --key keys/us.machine --in keys/ec256.env --out /dev/null 2>machine-open.err
    rc=$?
    set -e
    [ "$rc" = 1 ] || fail "the retired envelope opened from $s (exit $rc): $(cat machine-open.err)"
done
rm -f keys/us.machine.newest keys/us.machine.newest.lock
# ...yet new workers load the key files, and a new key file of the old
# envelope makes a certificate request: the agent opens the store's copy
# of the same secret.
reload_nginx "$work/n" "$nginx_master" || fail "nginx -s reload after the retirement"
check_serves "$p1" "$p2" "$p3" "$p4"
"$cli" provider-key --agent "$sys/run/keyfence/agent.sock" --envelope keys/ec256.env --out "$etc/renewed.kfk"
OPENSSL_CONF="$conf" openssl req -new -key "keyfence:$work/$etc/renewed.kfk" -subj /CN=localhost -out renewed.csr 2>req.err ||
    fail "openssl req with a key file of the retired envelope: $(cat req.err)"
openssl req -in renewed.csr -verify -noout 2>/dev/null || fail "the request's signature does not verify"
[ "$(openssl req -in renewed.csr -pubkey -noout)" = "$(openssl pkey -in keys/ec256.pem -pubout)" ] ||
    fail "the request is not for the key of the old envelope"
echo "after the retirement: new workers serve, and a new key file of the old envelope signs"

echo "== local users attacking the agent while nginx reloads (issue 52.3)"
# The attacker is nobody. The deployed socket (0660, group www-data) keeps
# nobody out before the agent hears of it, so the attacks are on agents
# whose sockets are open to all by their mode (standing for a local user
# in the socket's group): the open agent above, which refuses nobody, and
# a shared one, which allows nobody an envelope. A second nginx serves one
# key through each, so that each reload and each handshake below goes
# through the agent under attack. The shared agent starts after the
# retirement, with nothing cached from before it: its key file, of the old
# envelope, loads from the store's copy too.
install -d -o "$agent_user" -g "$agent_group" -m 700 "$work/shared-state"
start_agent shared 666 --state-dir "$work/shared-state" --allow-user www-data --allow-user nobody
"$cli" provider-key --agent "$sys/run/keyfence/shared.sock" --envelope keys/ec256.env --out "$etc/shared-ec256.kfk"
p5=$(free_port) p6=$(free_port)
nginx_conf "$work/s" "$p5" keys/ec256.crt "$etc/open-ec256.kfk" "$p6" keys/ec256.crt "$etc/shared-ec256.kfk"
OPENSSL_CONF="$conf" nginx -p "$work/s" -c "$work/s/nginx.conf" -e "$work/s/error.log" &
pids+=($!)
attacked_master=$!
wait_port "$p5"
check_serves "$p5" "$p6"
# What nobody runs must be readable by nobody (the source tree may not be).
install -m 644 "$here/agent_attack.py" "$work/agent_attack.py"
install -m 644 keys/ec256.env "$work/attacker.env"
# under_attack NAME PORT ATTACK SOCKET COUNT SECONDS [ENVELOPE]: the attack
# run as nobody while this reloads the second nginx and then makes a
# handshake on PORT, again and again until the attack ends. Each must take
# less than 2 s: before issue 52.3's fixes a new connection to an agent
# under such an attack waited 10 s and failed, while here, on two shared
# cores, each takes well under a second; 2 s is a bound noise does not
# reach and that stall cannot hide under.
under_attack() {
    local name="$1" port="$2" attacker t0 slow_reload=0 slow_get=0 n=0 v=1.3
    shift 2
    rm -f "attack-$name.out"
    setpriv --reuid=nobody --regid="$(id -gn nobody)" --init-groups -- env -i PATH=/usr/bin:/bin \
        python3 "$work/agent_attack.py" "$@" >"attack-$name.out" 2>&1 &
    attacker=$!
    pids+=("$attacker")
    for _ in $(seq 200); do grep -q "^ready" "attack-$name.out" 2>/dev/null && break; sleep 0.1; done
    grep -q "^ready" "attack-$name.out" || fail "the $name attack did not start: $(cat "attack-$name.out")"
    while ! grep -q "^done" "attack-$name.out" && ! gone "$attacker"; do
        reload_nginx "$work/s" "$attacked_master" >reload.why || fail "during the $name attack: $(cat reload.why)"
        [ "$took" -lt 2000 ] || fail "during the $name attack, nginx -s reload took $took ms"
        [ "$took" -le "$slow_reload" ] || slow_reload=$took
        t0=$(date +%s%N)
        [ "$(get "$port" "$v")" = "ok" ] || fail "during the $name attack, TLS $v on port $port failed"
        took=$((($(date +%s%N) - t0) / 1000000))
        [ "$took" -lt 2000 ] || fail "during the $name attack, a handshake took $took ms"
        [ "$took" -le "$slow_get" ] || slow_get=$took
        n=$((n + 1))
        if [ "$v" = 1.2 ]; then v=1.3; else v=1.2; fi
    done
    wait "$attacker" || fail "the $name attacker: $(cat "attack-$name.out")"
    forget "$attacker"
    [ "$n" -ge 3 ] || fail "only $n reloads during the $name attack"
    echo "attack $name: $(grep -h '^ready\|^done' "attack-$name.out" | xargs); meanwhile $n reloads and handshakes, the slowest $slow_reload ms and $slow_get ms"
}
# (a) A user the agent refuses, dribbling 16 bytes every 10-20 ms on 300
# connections (each the agent closes made again).
under_attack refused "$p5" refused "$sys/run/keyfence/open.sock" 300 8
grep -q "^refused: user nobody (uid [0-9]*) is not allowed" attack-refused.out || fail "the open agent did not refuse nobody: $(cat attack-refused.out)"
grep -q "^ready 300" attack-refused.out || fail "the refused attacker had not its 300 connections: $(cat attack-refused.out)"
grep -q "refused a client" open.err || fail "the open agent did not log the refusals: $(tail -3 open.err)"
# (b) A user the agent allows, with a key it may load, sending signing
# requests on 8 connections and never reading the replies: the agent
# cuts them off (5 s without taking a reply), and they connect again.
under_attack unread "$p6" unread "$sys/run/keyfence/shared.sock" 8 12 "$work/attacker.env"
grep -q "^signed" attack-unread.out || fail "nobody could not sign through the shared agent: $(cat attack-unread.out)"
grep -q "^done cut=[1-9]" attack-unread.out || fail "the agent never cut off the reader that reads nothing: $(cat attack-unread.out)"
grep -q "cut off a client" shared.err || fail "the shared agent did not log the cut: $(tail -3 shared.err)"
check_serves "$p1" "$p2" "$p3" "$p4" "$p5" "$p6"
echo "nginx reloaded and served through each attacked agent"

echo "== keys that cannot be used stop a server's start, saying why"
# refused_by WHY DIR KEY: nginx -t and Apache's start, each with KEY, fail
# and say REASON (the provider's words) where they report at their default
# log level: nginx -t's output, Apache's error log.
refused_by() {
    local why="$1" dir="$2" key="$3"
    nginx_conf "$dir-n" "$(free_port)" keys/ec256.crt "$key"
    OPENSSL_CONF="$conf" nginx -t -p "$dir-n" -c "$dir-n/nginx.conf" -e "$dir-n/error.log" >"$dir-n.out" 2>&1 &&
        fail "nginx -t accepted $key ($why)"
    grep -q "$why" "$dir-n.out" || fail "nginx -t with $key: $(cat "$dir-n.out")"
    apache_conf "$dir-a" "$(free_port)" keys/ec256.crt "$key"
    OPENSSL_CONF="$conf" apache2 -f "$dir-a/apache.conf" -k start 2>"$dir-a.err" &&
        fail "Apache started with $key ($why)"
    grep -q "$why" "$dir-a/error.log" || fail "Apache's log with $key: $(cat "$dir-a/error.log")"
}
refused_by POLICY_NOT_SATISFIED "$work/unopenable" "$etc/fr.kfk"
stop_agent "$main_agent" "$main_listener"
refused_by "cannot connect to the agent" "$work/agent-down" "$etc/ec256.kfk"
# stunnel, which showed only "bad keyfence key file": the reason on its
# output at its default level (the provider's log line).
printf 'foreground = yes\npid =\n[tls]\naccept = 127.0.0.1:%s\nconnect = 127.0.0.1:9\ncert = %s\nkey = %s\n' \
    "$(free_port)" "$work/keys/ec256.crt" "$work/$etc/ec256.kfk" >stunnel.conf
OPENSSL_CONF="$conf" timeout 20 stunnel4 stunnel.conf >stunnel.out 2>&1 && fail "stunnel started with the agent down"
grep -q "cannot connect to the agent" stunnel.out || fail "stunnel with the agent down: $(cat stunnel.out)"
echo "nginx -t, Apache and stunnel refused keys they cannot use, each saying why"
echo "deployed: ok"
