#!/usr/bin/env python3
"""How far each fuzz target reaches into the parsers it is for.

Reads what `cargo fuzz coverage TARGET` left (fuzz/coverage/TARGET/
coverage.profdata, and the instrumented binary under TARGET_DIR) through
`llvm-cov show`, and prints a Markdown table: per target, each parser's
lines and branches covered. A parser is a whole file, or the functions
named (`name`, or `Type::name` for a method, `Type::*` for a whole impl
block) where the file also holds encoders or I/O that no parser runs.
A generic function's instantiations are merged: a line or a branch
direction counts as covered when any instantiation ran it.

Parsers every target uses (the byte reader) are measured once more over
all the targets given together.

Usage: coverage.py LLVM_COV TARGET_DIR TARGET... [--missed]
  --missed  also list, under the table, each parser's lines never run
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

# What each target is for. Keep in step with fuzz/fuzz_targets/ (a target
# not listed here is reported as such, so a new one is not forgotten).
PARSERS: dict[str, list[tuple[str, list[str] | None]]] = {
    "policy_parse": [("policy-lang/src/lexer.rs", None), ("policy-lang/src/parser.rs", None)],
    "abe_parse_keys": [
        ("core/src/abe/keys.rs", ["PublicKey::from_bytes", "MasterSecretKey::from_bytes", "AttributeKey::from_bytes", "utf8"]),
        ("core/src/abe/group.rs", ["g1_from_bytes", "g1_on_curve_from_bytes", "g2_from_bytes", "gt_from_bytes", "scalar_from_be", "is_canonical_scalar"]),
    ],
    "abe_parse_ciphertext": [
        ("core/src/abe/bk.rs", ["parse"]),
        ("core/src/abe/tkn.rs", ["LazyHeader::parse"]),
        ("core/src/abe/policy.rs", ["AbePolicy::decode", "AbePolicy::to_policy"]),
    ],
    # Its inputs are edits of one valid ciphertext, which reach the
    # decryption; the parsers on the way are abe_parse_ciphertext's.
    "abe_decrypt": [("core/src/abe/bk.rs", ["decrypt"])],
    "wrap_parse": [
        ("core/src/wrap/format.rs", ["reader", "suite", "Envelope::parse"]),
        ("core/src/wrap/machine.rs", ["MachineKey::from_bytes", "read_machine_key"]),
        ("core/src/wrap/policy.rs", ["CanonicalPolicy::decode"]),
    ],
    "keyproc_frames": [
        ("core/src/sign/key_process/protocol.rs", [
            "parse_hello_request", "parse_hello_reply", "parse_load_request", "path_from", "parse_unload_request",
            "parse_drop_privileges_request", "parse_op", "parse_error", "Status::parse",
        ]),
    ],
    "remote_frames": [
        ("core/src/sign/remote/protocol.rs", ["parse_hello_request", "parse_hello_reply", "Head::read", "parse_request", "parse_error"]),
    ],
    "wire_frames": [
        ("core/src/sign/wire/frame.rs", ["Decoder::*", "reader"]),
        ("core/src/sign/wire/hello.rs", ["parse_hello"]),
        ("core/src/sign/wire/op.rs", ["read"]),
        ("core/src/sign/wire/public_key.rs", ["parse"]),
        ("core/src/sign/wire/error.rs", ["parse_error", "ErrorCode::from_u8"]),
    ],
    "key_file": [
        ("core/src/key_file.rs", ["KeyFile::from_bytes", "Fields::take", "Fields::finish", "text", "once", "malformed"]),
    ],
    "wrap_lists": [
        ("core/src/wrap/generation_list.rs", ["GenerationList::verify", "is_unsigned_text", "GenerationList::goes_back_on", "Seen::accept"]),
        ("core/src/wrap/revocation.rs", ["RevocationList::verify", "RevocationList::contains", "SeenRevocations::accept"]),
    ],
    "wrap_sealed": [("core/src/wrap/sealed.rs", ["SealedKey::parse"])],
    "etcd_replies": [
        ("core/src/wrap/etcd.rs", [
            "int", "bytes", "answer", "revision_of", "range_value", "list_page", "txn_values", "txn_succeeded", "watch_line",
        ]),
    ],
}

# Parsers every target shares: each reads its own part (the signing
# protocols big-endian, the other formats little-endian), so they are
# measured over all the targets run together.
SHARED: list[tuple[str, list[str] | None]] = [("core/src/codec.rs", ["Reader::*"])]

LINE = re.compile(r"^\s*(\d+)\|\s*([0-9.]+[kMGTPE]?)?\|")
BRANCH = re.compile(r"Branch \((\d+):(\d+)\): \[True: ([0-9.]+[kMGTPE]?), False: ([0-9.]+[kMGTPE]?)\]")


def block_end(lines: list[str], start: int) -> int:
    """The last line (0-based) of the item opened on line `start`: a
    one-line item, or up to the `}` at its own indentation."""
    head = lines[start]
    if head.rstrip().endswith("}") and head.count("{") == head.count("}"):
        return start
    indent = head[: len(head) - len(head.lstrip())]
    for i in range(start + 1, len(lines)):
        if lines[i].rstrip() == indent + "}":
            return i
    raise ValueError(f"no end for line {start + 1}")


def span(lines: list[str], spec: str) -> range:
    """The 1-based line numbers of function `spec` in a file's lines."""
    owner, _, name = spec.rpartition("::")
    lo, hi = 0, len(lines) - 1
    if owner:
        impl = re.compile(rf"^\s*impl\b[^{{]*\b{re.escape(owner)}\b[^{{]*\{{\s*$")
        starts = [i for i, l in enumerate(lines) if impl.match(l) and " for " not in l]
        for s in starts:
            lo, hi = s, block_end(lines, s)
            if name == "*" or any(re.search(rf"\bfn {name}\b", l) for l in lines[lo:hi]):
                break
        else:
            raise ValueError(f"no impl of {owner} with fn {name}")
        if name == "*":
            return range(lo + 1, hi + 2)
    fn = re.compile(rf"^\s*(pub(\([^)]*\))? )?(const )?fn {re.escape(name)}\b")
    for i in range(lo, hi + 1):
        if fn.match(lines[i]):
            return range(i + 1, block_end(lines, i) + 2)
    raise ValueError(f"no fn {spec}")


def count(text: str | None) -> float:
    if not text:
        return 0.0
    scale = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
    return float(text[:-1]) * scale[text[-1]] if text[-1] in scale else float(text)


def show(llvm_cov: str, binary: pathlib.Path, profdata: pathlib.Path, path: str):
    """Per line: its count or None (not code); per branch (line, column):
    how often each direction was taken, summed over instantiations."""
    out = subprocess.run(
        [llvm_cov, "show", str(binary), f"-instr-profile={profdata}", "-show-branches=count",
         "-show-instantiations=false", str(REPO / path)],
        check=True, capture_output=True, text=True,
    ).stdout
    counts: dict[int, float | None] = {}
    branches: dict[tuple[int, int], list[float]] = {}
    for line in out.splitlines():
        # A generic function's line counts are its instantiations' sum; its
        # branches come once per instantiation.
        m = BRANCH.search(line)
        if m:
            t, f = branches.setdefault((int(m[1]), int(m[2])), [0.0, 0.0])
            branches[(int(m[1]), int(m[2]))] = [t + count(m[3]), f + count(m[4])]
        elif m := LINE.match(line):
            counts[int(m[1])] = count(m[2]) if m[2] else None
    return counts, branches


def pct(hit: int, total: int) -> str:
    return f"{hit}/{total} ({100 * hit / total:.1f}%)" if total else "-"


def measure(llvm_cov: str, runs: list[tuple[pathlib.Path, pathlib.Path]], path: str, functions: list[str] | None):
    """Lines and branches of a parser over the runs (binary, profile)
    given, summed: a row of the table and the lines never run."""
    counts: dict[int, float | None] = {}
    branches: dict[tuple[int, int], list[float]] = {}
    for binary, profdata in runs:
        c, b = show(llvm_cov, binary, profdata, path)
        for n, v in c.items():
            counts[n] = v if counts.get(n) is None else counts[n] + (v or 0)
        for k, (t, f) in b.items():
            old = branches.get(k, [0.0, 0.0])
            branches[k] = [old[0] + t, old[1] + f]
    source = (REPO / path).read_text().splitlines()
    if functions is None:
        scope, label = set(counts), f"`{path}`"
    else:
        scope = set().union(*(span(source, f) for f in functions))
        label = f"`{path}`: " + ", ".join(f"`{f}`" for f in functions)
    code = [n for n in sorted(scope) if counts.get(n) is not None]
    hit = [n for n in code if counts[n] > 0]
    directions = [v for (n, _), tf in branches.items() if n in scope for v in tf]
    never = [n for n in code if counts[n] == 0]
    return (label, pct(len(hit), len(code)), pct(sum(v > 0 for v in directions), len(directions))), never


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--missed"]
    missed_too = "--missed" in sys.argv
    if len(args) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    llvm_cov, target_dir, targets = args[0], pathlib.Path(args[1]), args[2:]
    run = {
        t: (target_dir / "x86_64-unknown-linux-gnu" / "release" / t, REPO / "fuzz" / "coverage" / t / "coverage.profdata")
        for t in targets
    }
    rows, missed = [], []
    parsers = [(t, [run[t]], p) for t in targets for p in PARSERS.get(t, [])]
    if len(targets) > 1:
        parsers += [("all of the above", list(run.values()), p) for p in SHARED]
    for t in targets:
        if t not in PARSERS:
            rows.append((t, "(no parser listed in fuzz/coverage.py)", "-", "-"))
    for name, runs, (path, functions) in parsers:
        row, never = measure(llvm_cov, runs, path, functions)
        rows.append((name, *row))
        if never:
            missed.append(f"{name} {path}: lines " + ", ".join(map(str, never)))
    print("| target | parser | lines | branches |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if missed_too and missed:
        print("\nLines never run:")
        print("\n".join(missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
