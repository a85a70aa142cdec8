#!/usr/bin/env python3
"""Writes two CP-ABE vectors of vectors/shared.kfv (CIRCL's own bytes) as
files for the release smoke tests: ok/ (decrypts to plaintext.bin) and
refused/ (a key whose attributes fail the policy).

Usage: vector.py SHARED_KFV OUT_DIR
"""

import pathlib
import sys

WANTED = {"abe-decrypt-ok": "ok", "abe-decrypt-negation-refuses": "refused"}


def vectors(text: str):
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith("#") or ": " not in line:
                continue
            k, v = line.split(": ", 1)
            fields.setdefault(k, v)
        if fields:
            yield fields


def main() -> int:
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    found = 0
    for v in vectors(src.read_text()):
        name = WANTED.get(v.get("name", ""))
        if name is None:
            continue
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        for field in ("public_key", "attribute_key", "ciphertext", "plaintext"):
            if field in v:
                (d / f"{field}.bin").write_bytes(bytes.fromhex(v[field]))
        found += 1
    if found != len(WANTED):
        print(f"vector.py: {src} lacks one of {sorted(WANTED)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
