#!/usr/bin/env python3
"""Runs the code blocks of README.md and docs/*.md, so a page stays a promise.

Every fenced block a reader would run is run here, page by page, in a
scratch directory of its own (one per page, shared by the page's blocks in
order, as a reader following the page shares one shell), and a failing
block is reported with its page and line.

The block's info string is its language and then tags:

    ```sh                     run each command; each must exit 0
    ```sh output              ... and `# text` lines right after a command are its output
    ```sh cwd=repo            run in the checkout instead of the scratch directory
    ```python / ```js / ```c  run as a program (C: compiled against the installed package)
    ```c file=PATH            the block is PATH's text, verbatim; a test runs PATH
    ```sh no-run (why)        not run, and the reason says why (a server, a machine-wide install)

In shell blocks, a command whose trailing comment starts with `exit N`
must exit N (`# exit 2`); a block whose lines start with `$ ` is a
transcript: the lines after each command are its expected output. Blocks
in other languages (`text`, `json`, `cmake`, `rust`: Rust blocks are doc
tests of the core) are not run here.

Usage: run_blocks.py [--list] [PAGE...]   (default: README.md docs/*.md)

The environment names what the pages use:
  KEYFENCE_BIN_DIR     directory holding `keyfence` (put first on PATH)
  KEYFENCE_PYTHON      the Python that has the keyfence package
  KEYFENCE_NODE_PKG    the built Node package folder (bindings/node)
  KEYFENCE_C_PREFIX    an install prefix of the C package (cmake --install)
A language whose variable is unset is reported as skipped, and
KEYFENCE_DOCS_STRICT=1 (set by ./x test) turns every skip into a failure.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGE_TIMEOUT = 900
RUN_LANGS = {"sh", "python", "js", "c"}
FENCE = re.compile(r"^(`{3,})(.*)$")


@dataclass
class Block:
    page: pathlib.Path
    line: int  # 1-based line of the opening fence
    lang: str
    tags: dict[str, str]
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


@dataclass
class Outcome:
    ran: int = 0
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def parse_tags(info: str) -> tuple[str, dict[str, str]]:
    lang, _, rest = info.strip().partition(" ")
    tags: dict[str, str] = {}
    m = re.search(r"no-run\s*\((.*)\)\s*$", rest)
    if m:
        tags["no-run"] = m.group(1).strip()
        rest = rest[: m.start()]
    for word in rest.split():
        k, _, v = word.partition("=")
        tags[k] = v
    return lang, tags


def blocks(page: pathlib.Path) -> list[Block]:
    out: list[Block] = []
    lines = page.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.groups()
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].rstrip() != fence:
            body.append(lines[i])
            i += 1
        lang, tags = parse_tags(info)
        out.append(Block(page, start + 1, lang, tags, "\n".join(body) + "\n"))
        i += 1
    return out


def trailing_comment(line: str) -> tuple[str, str | None]:
    """Splits `cmd  # comment` at the first `#` outside quotes that follows a space."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
            elif ch == "\\" and quote == '"':
                continue
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line, None


def complete(text: str) -> bool:
    """Whether bash reads `text` as complete commands (`bash -n`)."""
    return subprocess.run(["bash", "-n", "-c", text], capture_output=True).returncode == 0


@dataclass
class Command:
    line: int
    text: str
    exit: int = 0
    output: list[str] | None = None


def shell_commands(b: Block) -> list[Command]:
    raw = b.text.rstrip("\n").split("\n")
    transcript = any(x.startswith("$ ") for x in raw)
    checks_output = transcript or "output" in b.tags
    cmds: list[Command] = []
    collecting = False  # comment lines right after a command are its output
    i = 0
    while i < len(raw):
        line = raw[i]
        n = b.line + 1 + i
        i += 1
        if transcript and not line.startswith("$ "):
            if cmds:
                cmds[-1].output.append(line)  # type: ignore[union-attr]
            continue
        if transcript:
            line = line[2:]
        elif not line.strip():
            collecting = False
            continue
        elif line.lstrip().startswith("#"):
            body = line.lstrip()[1:]
            if collecting:
                cmds[-1].output.append(body[1:] if body.startswith(" ") else body)  # type: ignore[union-attr]
            continue
        # A command goes on while bash says it is incomplete: a `\` at the
        # end of a line, an open quote, a function or loop body.
        text = line
        while i < len(raw) and (text.endswith("\\") or not complete(text)):
            text = text + "\n" + raw[i]
            i += 1
        _, comment = trailing_comment(text.split("\n")[-1])
        c = Command(n, text, output=[] if checks_output else None)
        if comment:
            m = re.match(r"exit (\d+)\b", comment)
            if m:
                c.exit = int(m.group(1))
        cmds.append(c)
        collecting = checks_output
    if transcript:
        # `$ echo $?` after a command shows that command's exit status.
        kept: list[Command] = []
        for c in cmds:
            if c.text.strip() == "echo $?" and kept and c.output and c.output[0].strip().isdigit():
                kept[-1].exit = int(c.output[0].strip())
                continue
            kept.append(c)
        cmds = kept
    else:
        for c in cmds:
            if not c.output:
                c.output = None  # the page shows no output for it: not checked
    return cmds


class Runner:
    def __init__(self) -> None:
        self.strict = os.environ.get("KEYFENCE_DOCS_STRICT") == "1"
        self.env = dict(os.environ)
        path = self.env.get("PATH", "")
        for var, sub in (("KEYFENCE_BIN_DIR", ""), ("KEYFENCE_PYTHON", "..")):
            v = os.environ.get(var)
            if v:
                d = pathlib.Path(v) if not sub else pathlib.Path(v).parent
                path = f"{d}{os.pathsep}{path}"
        self.env["PATH"] = path
        self.env.pop("CARGO_INSTALL_ROOT", None)

    def skip(self, out: Outcome, b: Block, why: str) -> None:
        msg = f"{b.where}: {b.lang} block not run: {why}"
        (out.failed if self.strict and "no-run" not in b.tags else out.skipped).append(msg)

    def page(self, page: pathlib.Path, out: Outcome) -> None:
        todo = [b for b in blocks(page) if b.lang in RUN_LANGS]
        if not todo:
            return
        with tempfile.TemporaryDirectory(prefix="keyfence-docs-") as scratch_s:
            scratch = pathlib.Path(scratch_s)
            env = dict(self.env)
            env["HOME_SCRATCH"] = scratch_s
            # `cargo install` from a page lands here, not in ~/.cargo/bin.
            env["CARGO_INSTALL_ROOT"] = str(scratch / "cargo-root")
            env["PATH"] = f"{scratch / 'cargo-root' / 'bin'}{os.pathsep}{env['PATH']}"
            shell = ShellSession(scratch, env)
            try:
                for b in todo:
                    if "no-run" in b.tags:
                        if not b.tags["no-run"]:
                            out.failed.append(f"{b.where}: `no-run` needs a reason in parentheses")
                        else:
                            self.skip(out, b, b.tags["no-run"])
                        continue
                    if "file" in b.tags:
                        self.check_file(b, out)
                        continue
                    err = getattr(self, f"run_{b.lang}")(b, scratch, env, shell)
                    if err is None:
                        out.ran += 1
                    elif err.startswith("skip: "):
                        self.skip(out, b, err[6:])
                    else:
                        out.failed.append(f"{b.where}: {err}")
                        return  # later blocks of the page build on this one
            finally:
                shell.close()

    def check_file(self, b: Block, out: Outcome) -> None:
        f = REPO / b.tags["file"]
        if not f.is_file():
            out.failed.append(f"{b.where}: file={b.tags['file']} does not exist")
        elif b.text not in f.read_text(encoding="utf-8"):
            out.failed.append(f"{b.where}: the block differs from {b.tags['file']}: update one from the other")
        else:
            out.ran += 1

    def run_sh(self, b: Block, scratch: pathlib.Path, env: dict[str, str], shell: "ShellSession") -> str | None:
        cwd = REPO if b.tags.get("cwd") == "repo" else scratch
        for c in shell_commands(b):
            code, text = shell.run(c.text, cwd)
            if code != c.exit:
                return f"line {c.line}: `{first_line(c.text)}` exited {code}, the page says {c.exit}\n{indent(text)}"
            if c.output is not None:
                got = [x.rstrip() for x in text.rstrip("\n").split("\n")] if text.strip() else []
                want = [x.rstrip() for x in c.output]
                while want and not want[-1]:
                    want.pop()
                if got != want:
                    return (
                        f"line {c.line}: `{first_line(c.text)}` printed\n{indent(text)}\n"
                        f"  where the page shows\n{indent(chr(10).join(want))}"
                    )
        return None

    def run_program(self, b: Block, scratch: pathlib.Path, env: dict[str, str], argv: list[str]) -> str | None:
        try:
            r = subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return f"`{' '.join(argv)}` did not finish in 300 s"
        if r.returncode != 0:
            return f"`{' '.join(argv)}` exited {r.returncode}\n{indent(r.stdout + r.stderr)}"
        return None

    @staticmethod
    def block_file(b: Block, scratch: pathlib.Path, ext: str) -> pathlib.Path:
        """The block's text as a file of the scratch directory."""
        f = scratch / f"block_{b.line}.{ext}"
        f.write_text(b.text, encoding="utf-8")
        return f

    def run_python(self, b: Block, scratch: pathlib.Path, env: dict[str, str], _: "ShellSession") -> str | None:
        py = os.environ.get("KEYFENCE_PYTHON")
        if not py:
            return "skip: KEYFENCE_PYTHON is not set"
        return self.run_program(b, scratch, env, [py, self.block_file(b, scratch, "py").name])

    def run_js(self, b: Block, scratch: pathlib.Path, env: dict[str, str], _: "ShellSession") -> str | None:
        pkg = os.environ.get("KEYFENCE_NODE_PKG")
        if not pkg:
            return "skip: KEYFENCE_NODE_PKG is not set"
        # `require('keyfence')` finds the built package, as in a project
        # that installed it.
        link = scratch / "node_modules" / "keyfence"
        link.parent.mkdir(exist_ok=True)
        if not link.exists():
            link.symlink_to(pathlib.Path(pkg).resolve(), target_is_directory=True)
        return self.run_program(b, scratch, env, ["node", self.block_file(b, scratch, "js").name])

    def run_c(self, b: Block, scratch: pathlib.Path, env: dict[str, str], _: "ShellSession") -> str | None:
        prefix = os.environ.get("KEYFENCE_C_PREFIX")
        if not prefix:
            return "skip: KEYFENCE_C_PREFIX is not set"
        f = self.block_file(b, scratch, "c")
        exe = scratch / f"block_{b.line}"
        penv = dict(env, PKG_CONFIG_PATH=f"{prefix}/lib/pkgconfig")
        flags = subprocess.run(
            ["pkg-config", "--cflags", "--libs", "keyfence"], env=penv, capture_output=True, text=True, check=True
        ).stdout.split()
        cc = ["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", f.name, "-o", exe.name, *flags]
        cc.append(f"-Wl,-rpath,{prefix}/lib")
        err = self.run_program(b, scratch, penv, cc)
        return err or self.run_program(b, scratch, env, [f"./{exe.name}"])


class ShellSession:
    """One bash for a page, so `cd` and variables carry from block to block."""

    def __init__(self, scratch: pathlib.Path, env: dict[str, str]) -> None:
        self.scratch = scratch
        self.n = 0
        self.proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            cwd=scratch,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def run(self, cmd: str, cwd: pathlib.Path) -> tuple[int, str]:
        self.n += 1
        out = self.scratch / f".out.{self.n}"
        mark = f"__keyfence_done_{self.n}__"
        assert self.proc.stdin and self.proc.stdout
        script = (
            f"pushd {shlex.quote(str(cwd))} >/dev/null\n"
            f"{{\n{cmd}\n}} >{shlex.quote(str(out))} 2>&1 </dev/null\n"
            f"__kf_rc=$?; echo {mark} $__kf_rc\npopd >/dev/null\n"
        )
        self.proc.stdin.write(script)
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                return 255, "the shell ended"
            if line.startswith(mark):
                code = int(line.split()[1])
                return code, out.read_text(encoding="utf-8", errors="replace")

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()


def first_line(s: str) -> str:
    return s.split("\n")[0]


def indent(s: str) -> str:
    lines = s.rstrip("\n").split("\n")
    if len(lines) > 40:
        lines = lines[:20] + ["..."] + lines[-20:]
    return "\n".join("    " + x for x in lines)


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    pages = [pathlib.Path(a).resolve() for a in args] or [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    if "--list" in argv:
        for p in pages:
            for b in blocks(p):
                if b.lang in RUN_LANGS:
                    print(b.where, b.lang, b.tags)
        return 0
    if not shutil.which("bash"):
        print("run_blocks: bash is required", file=sys.stderr)
        return 2
    runner = Runner()
    out = Outcome()
    for p in pages:
        print(f"docs: {p.relative_to(REPO)}", flush=True)
        runner.page(p, out)
    for s in out.skipped:
        print(f"  not run: {s}")
    for f in out.failed:
        print(f"FAILED {f}")
    print(f"docs blocks: {out.ran} passed, {len(out.failed)} failed, {len(out.skipped)} skipped")
    return 1 if out.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
