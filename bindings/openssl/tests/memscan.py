#!/usr/bin/env python3
"""memscan.py PID HEX: exit 0 if process PID's readable memory holds the
bytes HEX (big-endian, as `openssl pkey -text` prints a private scalar) or
their reverse (little-endian limbs, as AWS-LC and BoringSSL keep a scalar), 1 if not.
Reads /proc/PID/mem (root, or the same user with ptrace allowed)."""
import re
import sys

pid, needle_hex = sys.argv[1], sys.argv[2]
needle = bytes.fromhex(needle_hex)
needles = [needle, needle[::-1]]
found = False
with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
    for line in maps:
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+)", line)
        start, end, perms = int(m.group(1), 16), int(m.group(2), 16), m.group(3)
        if perms[0] != "r" or end - start > (1 << 30) or "[vvar]" in line or "[vsyscall]" in line:
            continue
        try:
            mem.seek(start)
            data = mem.read(end - start)
        except OSError:
            continue
        if any(n in data for n in needles):
            found = True
            break
print("found" if found else "absent")
sys.exit(0 if found else 1)
