#!/usr/bin/env python3
"""haproxy_async.py WORK CLI OPENSSL_CNF CA ADDR: HAProxy (one thread) serving
a local keyfence key and a remote one behind a slow link, with and without
`ssl-mode-async`, measured in one run.

WORK holds local.pem (a certificate and a local key file) and remote.pem (a
certificate; remote.pem.key, a remote key file whose peer is a delay relay
this script starts in front of the key server at ADDR, is written here). While remote handshakes run back to back in four
threads, local handshakes are timed one after another. With
ssl-mode-async, a remote signature pauses its handshake, not the thread:
local handshakes keep their latency (median under half the link's delay).
Without it (the control, so the test can fail) a local handshake waits
behind a remote signature (the slowest takes at least the delay).
Prints one JSON line per mode."""
import json
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time

work, cli, cnf, ca, server_addr = sys.argv[1:6]
DELAY = 0.25  # seconds added to every client-to-key-server chunk


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def relay(listener, target):
    """Forwards connections to target, delaying what the client sends."""
    host, port = target.rsplit(":", 1)

    def pipe(src, dst, delay):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if delay:
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    while True:
        try:
            c, _ = listener.accept()
        except OSError:
            return
        u = socket.create_connection((host, int(port)))
        threading.Thread(target=pipe, args=(c, u, DELAY), daemon=True).start()
        threading.Thread(target=pipe, args=(u, c, 0), daemon=True).start()


listener = socket.create_server(("127.0.0.1", 0))
relay_addr = f"127.0.0.1:{listener.getsockname()[1]}"
threading.Thread(target=relay, args=(listener, server_addr), daemon=True).start()

subprocess.run([cli, "provider-key", "--remote", "--envelope", f"{work}/keys/ec256.env",
                "--peer", f"sfo1,{relay_addr},country=US", "--tls-cert", f"{work}/edge.pem",
                "--tls-key", f"{work}/edge.key", "--tls-ca", f"{work}/mesh-ca.pem",
                "--out", f"{work}/remote.pem.key"], check=True)

client = ssl.create_default_context(cafile=ca)


def handshake(port):
    t = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        with client.wrap_socket(s, server_hostname="localhost"):
            pass
    return time.monotonic() - t


def run(mode_async):
    p_local, p_remote = free_port(), free_port()
    cfg = f"{work}/haproxy-{'async' if mode_async else 'sync'}.cfg"
    with open(cfg, "w") as f:
        f.write(f"""global
    nbthread 1
    {'ssl-mode-async' if mode_async else ''}
defaults
    mode http
    timeout connect 5s
    timeout client 10s
    timeout server 10s
frontend local
    bind 127.0.0.1:{p_local} ssl crt {work}/local.pem
    http-request return status 200 content-type text/plain string ok
frontend remote
    bind 127.0.0.1:{p_remote} ssl crt {work}/remote.pem
    http-request return status 200 content-type text/plain string ok
""")
    log = open(f"{cfg}.log", "w")
    hp = subprocess.Popen(["haproxy", "-db", "-f", cfg], env=dict(os.environ, OPENSSL_CONF=cnf),
                          stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", p_remote), 0.2).close()
                break
            except OSError:
                if hp.poll() is not None:
                    raise SystemExit(f"haproxy exited: {open(cfg + '.log').read()}")
                time.sleep(0.1)
        handshake(p_remote)  # connects the key server link once
        baseline = [handshake(p_local) for _ in range(10)]
        stop = threading.Event()
        remote, remote_failed = [], []

        def remote_loop():
            while not stop.is_set():
                try:
                    remote.append(handshake(p_remote))
                except (OSError, ssl.SSLError) as e:
                    remote_failed.append(str(e))

        threads = [threading.Thread(target=remote_loop) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        loaded = [handshake(p_local) for _ in range(20)]
        stop.set()
        for t in threads:
            t.join()
    finally:
        hp.send_signal(signal.SIGTERM)
        hp.wait(10)
    r = {
        "mode": "ssl-mode-async" if mode_async else "blocking",
        "delay_ms": DELAY * 1000,
        "local_baseline_median_ms": round(statistics.median(baseline) * 1000, 1),
        "local_under_remote_load_median_ms": round(statistics.median(loaded) * 1000, 1),
        "local_under_remote_load_max_ms": round(max(loaded) * 1000, 1),
        "remote_median_ms": round(statistics.median(remote) * 1000, 1),
        "remote_handshakes": len(remote),
        "remote_failed": len(remote_failed),
    }
    print(json.dumps(r), flush=True)
    return r


a = run(True)
b = run(False)
fails = []
if a["remote_failed"] or not a["remote_handshakes"]:
    fails.append("remote handshakes failed with ssl-mode-async")
if a["remote_median_ms"] < DELAY * 1000:
    fails.append("remote handshakes were not slowed by the link: the measurement shows nothing")
if a["local_under_remote_load_median_ms"] >= DELAY * 1000 / 2:
    fails.append("with ssl-mode-async, local handshakes waited behind remote signatures")
if b["local_under_remote_load_max_ms"] < DELAY * 1000:
    fails.append("without ssl-mode-async no local handshake waited: the control shows nothing")
if fails:
    raise SystemExit("FAIL: " + "; ".join(fails))
print("haproxy async: ok")
