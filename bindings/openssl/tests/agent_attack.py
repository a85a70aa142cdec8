#!/usr/bin/env python3
# agent_attack.py ATTACK SOCKET COUNT SECONDS [ENVELOPE]: a local user
# attacking the key agent on SOCKET for SECONDS (deployed.sh runs it as
# nobody while nginx reloads; issue 52.3, docs/deploy.md "Local users and
# the agent's bounds"). The agent's protocol (docs/isolation.md): frames
# of length:u32 kind:u8 id:u64 body, big-endian.
#
#  refused: a user the agent does not allow. It first checks that it is
#    refused (prints `refused: MESSAGE`), then keeps COUNT connections
#    dribbling 16 bytes of a hello that never ends every 10-20 ms, each
#    connection the agent closed made again at once.
#  unread: a user the agent allows, with ENVELOPE, which it may load. It
#    first loads the key and signs once, reading the replies (prints
#    `signed`), then on COUNT connections loads the key and sends signing
#    requests (8 every 2 ms on each, whole frames only, as far as the
#    connection takes them) and never reads their replies; a connection
#    the agent cut off is counted and made again.
#
# Prints `ready N` once its N connections are up and `done cut=C
# reconnects=R` at the end.
import os
import random
import socket
import struct
import sys
import time

attack, path, count, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
envelope = open(sys.argv[5], "rb").read() if len(sys.argv) > 5 else None
HELLO, LOAD, OP, OK, ERR = 0x01, 0x02, 0x04, 0x80, 0x81


def frame(kind, ident, body):
    return struct.pack(">IBQ", 9 + len(body), kind, ident) + body


hello = frame(HELLO, 0, b"KFKP" + struct.pack(">HI", 1, 64))
load = frame(LOAD, 1, struct.pack(">QBI", 1, 5, len(envelope or b"")) + (envelope or b"")) if envelope else b""


def sign(ident):
    # Key 1, 10 s to start, sign a message (1) with ECDSA P-256 SHA-256
    # (TLS code 0x0403).
    return frame(OP, ident, struct.pack(">QIBH", 1, 10_000_000, 1, 0x0403) + bytes(32))


def connect(timeout=1.0):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        return s
    except OSError:
        s.close()
        return None


def replies(s, n):
    """The first n frames the agent sends on s (or fewer, at its end)."""
    got, buf = [], b""
    s.settimeout(10)
    while len(got) < n:
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            length = struct.unpack(">I", buf[:4])[0]
            kind, _ = struct.unpack(">BQ", buf[4:13])
            got.append((kind, buf[13:4 + length]))
            buf = buf[4 + length:]
        if len(got) >= n:
            break
        try:
            chunk = s.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
    return got


until = time.monotonic() + seconds
cut = reconnects = 0
if attack == "refused":
    s = connect()
    try:
        s.sendall(hello)
    except OSError:
        pass  # already refused and closed
    said = replies(s, 2)
    s.close()
    err = [b for k, b in said if k == ERR]
    print("refused:", err[0][1:].decode(errors="replace") if err else "NOT REFUSED %r" % said, flush=True)
    conns = [connect() for _ in range(count)]
    print("ready", sum(c is not None for c in conns), flush=True)
    while time.monotonic() < until:
        for i, c in enumerate(conns):
            try:
                if c is None:
                    raise OSError("not connected")
                c.send(bytes(16))
            except OSError:
                if c is not None:
                    c.close()
                conns[i] = connect(0.2)
                reconnects += 1
        time.sleep(random.uniform(0.010, 0.020))
elif attack == "unread":
    s = connect()
    s.sendall(hello + load)
    said = replies(s, 2)
    s.sendall(sign(2))
    said += replies(s, 1)
    s.close()
    print("signed" if [k for k, _ in said] == [HELLO, OK, OK] else "NOT SIGNED %r" % said, flush=True)

    def attacker():
        c = connect()
        if c is not None:
            c.settimeout(1)
            try:
                # The key loaded (its replies read): from here on, nothing is.
                c.sendall(hello + load)
                if [k for k, _ in replies(c, 2)] != [HELLO, OK]:
                    raise OSError("not loaded")
            except OSError:
                c.close()
                return None
            c.setblocking(False)
        return c

    conns = [attacker() for _ in range(count)]
    pending = [b""] * count
    print("ready", sum(c is not None for c in conns), flush=True)
    ident = 3
    while time.monotonic() < until:
        for i, c in enumerate(conns):
            if c is None:
                conns[i], pending[i] = attacker(), b""
                reconnects += 1
                continue
            try:
                # Whole frames: a frame cut in two would end the connection
                # as malformed, which is not this attack.
                if not pending[i]:
                    pending[i] = b"".join(sign(ident + j) for j in range(8))
                    ident += 8
                pending[i] = pending[i][c.send(pending[i]):]
            except BlockingIOError:
                pass
            except OSError:
                # Cut off by the agent (a broken pipe or a reset).
                cut += 1
                c.close()
                conns[i] = None
        time.sleep(0.002)
else:
    sys.exit("unknown attack " + attack)
print("done cut=%d reconnects=%d" % (cut, reconnects), flush=True)
os._exit(0)
