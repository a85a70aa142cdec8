# Sourced by the OpenSSL provider's test scripts (servers.sh, deployed.sh,
# operator_commands.sh, failed_loads.sh, bench_handshakes.sh): what each of
# them needs and would otherwise write again. Expects `cli` and `modules`
# set, and the working folder to be the test's own.

fail() { echo "FAIL: $*" >&2; exit 1; }

# A port the system hands out now on 127.0.0.1.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits (at most 20 s) until something accepts on 127.0.0.1:$1.
wait_port() {
    local i
    for i in $(seq 200); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null && return 0
        sleep 0.1
    done
    fail "nothing listens on port $1"
}

# The servers a test started, each killed by its pid and waited for
# whatever happens (the caller's EXIT trap calls stop_servers).
pids=()
stop_servers() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

# The keys of make_keys.sh in ./keys, and the two configurations that load
# the provider: local.cnf (keys in process) and isolated.cnf (in its key
# process).
keys_and_configs() {
    bash "$(dirname "${BASH_SOURCE[0]}")/make_keys.sh" "$cli" keys
    "$cli" provider-config --module "$modules/keyfence.so" >local.cnf
    "$cli" provider-config --module "$modules/keyfence.so" --isolated >isolated.cnf
}

# `env` with the sanitizers' runtime preloaded when the module was built
# with them (its dependencies name libasan), for an uninstrumented
# `openssl`: halt_on_error makes the first report end the command with
# exit 23. Empty otherwise.
asan_env=()
if ldd "$modules/keyfence.so" 2>/dev/null | grep -q libasan; then
    asan_env=(env "LD_PRELOAD=$(cc -print-file-name=libasan.so)"
        "ASAN_OPTIONS=halt_on_error=1:exitcode=23:detect_leaks=0"
        "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")
fi
