#!/usr/bin/env python3
"""Where one path of `keyfence bench sign --per-cpu` spends its CPU.

    perf record -e cpu-clock -F 1999 -o engine.data -- \\
        target/release/keyfence bench sign --json --per-cpu --path engine --case ecdsa-p256-sha256 --seconds 8
    python3 benches/sign_profile.py engine.data --block 2

`perf record` follows the key process and the key server (children of the
bench), and a software clock works where hardware counters do not (a VM).
Raw AWS-LC's blocks run on short-lived threads (made per block); the
path's blocks run on long-lived ones. This keeps the samples from the
start of the second raw block (the first is the warm-up) to one block
length (`--block`: the bench's --seconds over 4) after the last one ends,
drops the short-lived threads, and sorts what remains (the path's CPU, in
every process it uses) into the signature itself, TLS, allocation, locks,
the kernel's scheduling (wake-ups), socket I/O and poll, and the rest.
`--top CATEGORY` lists that category's heaviest symbols.
"""

import argparse
import collections
import re
import subprocess
import sys

LINE = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+(?:[0-9a-f]+\s+)?(.*?)\s+\((.*)\)\s*$")


# Where a sample's time went, by its symbol: the first pattern that matches
# names the category. Kernel symbols and user-space symbols are read apart.
KERNEL = [
    (r"sched|switch|futex|wake|ttwu|enqueue|dequeue|idle|update_curr|pick_next|hrtimer|tick|irq|raw_spin|rcu", "kernel: scheduling, wake-ups"),
    (r"tcp|ip_|ipv4|skb|sock|unix|net|dev_|inet|__sys_(send|recv)|copy_(to|from)_iter|_copy|csum|loopback|nf_", "kernel: socket I/O"),
    (r"poll|epoll", "kernel: poll"),
]
USER = [
    (
        r"aes_gcm|gcm_|GCM|SSL_|^ssl|bssl::(ssl|tls|SSL|dtls|ssl3|SSLAEAD|SSLBuffer|SSLTranscript)|tls13|EVP_AEAD|"
        r"CRYPTO_gcm|chacha|poly1305|openssl::ssl|SslStream",
        "TLS (records, AES-GCM)",
    ),
    (
        r"^(ecp_nistz256|__ecp_nistz256|ec_|bn_|BN_|ECDSA|ecdsa|sha256|sha512|SHA|ed25519|x25519|fe_|ge_|RSA|rsa_|"
        r"EVP_|EC_|copy_conditional|p256|RAND|rand_|CRYPTO_|ctr_drbg|CTR_DRBG|aes_hw|aes_nohw|vpaes|__bn|mulx4x|"
        r"bssl::|CBB|cbb|CBS|cbs|block_cipher_df|OPENSSL_|ERR_|aws_lc_|openssl::)",
        "the signature (AWS-LC)",
    ),
    (r"malloc|free|_int_|realloc|calloc|tcache|arena|alloc::alloc|__rust_(de)?alloc", "allocation"),
    (r"memcpy|memmove|memset", "copies"),
    (r"pthread|futex|__lll|park|unpark|Condvar|Mutex|crossbeam|std::sync", "user: locks, channels, park"),
]


def category(sym, dso):
    if "vdso" in dso:
        return "clock reads (vdso)"
    kernel = "kernel" in dso
    for pattern, name in KERNEL if kernel else USER:
        if re.search(pattern, sym):
            return name
    if kernel:
        return "kernel: other (syscall entry, memory)"
    if "libc" in dso:
        return "libc other (syscall stubs)"
    return "user: keyfence and std"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="perf.data of one `bench sign --per-cpu --path P` run")
    ap.add_argument("--block", type=float, required=True, help="seconds per block: the bench's --seconds / 4")
    ap.add_argument("--top", help="list this category's heaviest symbols")
    a = ap.parse_args()
    out = subprocess.run(
        ["perf", "script", "-i", a.data, "-F", "comm,pid,tid,time,ip,sym,dso"], capture_output=True, text=True, check=True
    ).stdout
    samples = [m.groups() for m in map(LINE.match, out.splitlines()) if m]
    samples = [(c, int(p), int(t), float(ts), s, d) for c, p, t, ts, s, d in samples]
    if not samples:
        sys.exit(f"{a.data}: no samples")
    main_pid = min(x[1] for x in samples)
    life, comm = {}, {}
    for c, pid, tid, t, _, _ in samples:
        lo, hi = life.get(tid, (t, t))
        life[tid] = (min(lo, t), max(hi, t))
        comm.setdefault(tid, c)
    raw = {tid for tid, (lo, hi) in life.items() if hi - lo < 1.3 * a.block and tid != main_pid and comm[tid] == "keyfence"}
    spans = sorted(life[t] for t in raw if life[t][1] - life[t][0] > 0.5 * a.block)
    if not spans:
        sys.exit(f"{a.data}: no raw blocks of about {a.block} s found")
    start, end = spans[0][0], spans[-1][1] + a.block
    kept = [x for x in samples if start <= x[3] <= end and x[2] not in raw]
    n = len(kept)
    procs = collections.Counter("this process" if pid == main_pid else f"process {pid}" for _, pid, _, _, _, _ in kept)
    cats = collections.Counter(category(s, d) for _, _, _, _, s, d in kept)
    print(f"{a.data}: {n} samples of the path's threads")
    for k, v in procs.most_common() + cats.most_common():
        print(f"  {k:<38} {100 * v / n:5.1f}%")
    if a.top:
        top = collections.Counter(s for _, _, _, _, s, d in kept if category(s, d) == a.top)
        for s, v in top.most_common(15):
            print(f"    {100 * v / n:5.2f}%  {s}")


if __name__ == "__main__":
    main()
