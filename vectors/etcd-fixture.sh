#!/usr/bin/env bash
# A three-member etcd cluster on loopback for the bindings' etcd store
# tests (C, Python and Node run the same fixture; the Rust tests have
# core/tests/etcd_support, which it mirrors).
#
#   vectors/etcd-fixture.sh DIR
#
# Starts the members with their data and logs in DIR and returns once the
# cluster has a leader and answers a read: the client endpoints are in
# DIR/endpoints (`127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`, the part of an
# `etcd://` store name before the prefix) and in DIR/pids, one a line, the
# pid of each member's process group (`timeout` and etcd under it) to kill
# with `kill -9 -- -PID`. Each member is killed by itself after 600 s, or
# KEYFENCE_ETCD_LIFETIME seconds (a long benchmark on the cluster).
#
# Ports are drawn below Linux's ephemeral range (32768 and up), where the
# OS hands none out, and a member that finds its port taken anyway exits:
# then the whole cluster is started again on other ports, up to five times.
# Exits 77 (a skip, to ctest and the other tests) when there is no etcd,
# unless KEYFENCE_REQUIRE_ETCD is set.
set -euo pipefail
dir="$1"
mkdir -p "$dir"
if ! command -v etcd >/dev/null; then
    if [ -n "${KEYFENCE_REQUIRE_ETCD:-}" ]; then
        echo "etcd-fixture: KEYFENCE_REQUIRE_ETCD is set but no etcd is on PATH" >&2
        exit 1
    fi
    echo "etcd-fixture: *** SKIPPED: no etcd on PATH (apt-get install etcd-server) ***" >&2
    exit 77
fi

port() { shuf -i 20000-32767 -n 1; }

probe() { # probe PORT: a read through etcdctl (./x installs etcd-client), else curl
    if command -v etcdctl >/dev/null; then
        ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$1" --dial-timeout 1s --command-timeout 2s get probe >/dev/null 2>&1
    else
        curl -sf -m 2 -X POST "http://127.0.0.1:$1/v3/kv/range" -d '{"key":"cHJvYmU="}' >/dev/null 2>&1
    fi
}

stop() { # stop PGID...
    for g in "$@"; do kill -9 -- "-$g" 2>/dev/null || true; done
}

for attempt in 1 2 3 4 5; do
    client=() peer=()
    for i in 0 1 2; do
        client+=("$(port)")
        peer+=("$(port)")
    done
    initial="m0=http://127.0.0.1:${peer[0]},m1=http://127.0.0.1:${peer[1]},m2=http://127.0.0.1:${peer[2]}"
    pids=()
    for i in 0 1 2; do
        # A process group of its own (setsid execs, keeping the pid), so
        # that one kill ends `timeout` and the member; `timeout` ends a
        # member that a crashed test left behind.
        setsid timeout -s KILL "${KEYFENCE_ETCD_LIFETIME:-600}" etcd --name "m$i" --data-dir "$dir/m$i-$attempt" \
            --listen-client-urls "http://127.0.0.1:${client[$i]}" --advertise-client-urls "http://127.0.0.1:${client[$i]}" \
            --listen-peer-urls "http://127.0.0.1:${peer[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peer[$i]}" \
            --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token "fixture-$$-$attempt" \
            --heartbeat-interval 50 --election-timeout 500 \
            </dev/null >"$dir/m$i-$attempt.log" 2>&1 &
        pids+=("$!")
    done
    ready=""
    for _ in $(seq 600); do # 60 s
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null || break 2
        done
        # A linearizable read: answered only once there is a leader.
        if probe "${client[0]}"; then
            ready=1
            break
        fi
        sleep 0.1
    done
    if [ -n "$ready" ]; then
        printf '127.0.0.1:%s,127.0.0.1:%s,127.0.0.1:%s\n' "${client[@]}" >"$dir/endpoints"
        printf '%s\n' "${pids[@]}" >"$dir/pids"
        exit 0
    fi
    stop "${pids[@]}"
    if ! grep -qs "address already in use" "$dir"/m?-"$attempt".log; then
        echo "etcd-fixture: the cluster did not start:" >&2
        tail -n 20 "$dir"/m?-"$attempt".log >&2
        exit 1
    fi
    echo "etcd-fixture: a port was taken; again on other ports" >&2
done
echo "etcd-fixture: no free ports after five attempts" >&2
exit 1
