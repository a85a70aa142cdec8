"""docs/python.md: the example program is shown unchanged and runs, the
API block runs as a script top to bottom, the floor block refuses a
rolled-back store, the key agent's block runs
against a real agent, the token block signs in a SoftHSM2 token, the fork
block forks and signs, and every other
Python block says why it is not run."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import KeyAgent  # the key_agent fixture's type

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "bindings" / "python" / "examples" / "service.py"
DOC = REPO / "docs" / "python.md"


def blocks() -> list[tuple[str, str]]:
    """(info string, code) of every fenced Python block of the page."""
    text = DOC.read_text(encoding="utf-8")
    return re.findall(r"```(python[^\n]*)\n(.*?)```", text, re.S)


def section_block(title: str) -> str:
    """The first Python block of the section `## title`."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"\n## {title}\n", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, f"docs/python.md's section {title!r} has no python block"
    return found.group(1)


def api_block() -> str:
    return section_block("The API")


def floor_block() -> str:
    return section_block("Keeping the floor across restarts")


def agent_block() -> str:
    return section_block("Through a key agent")


def fork_block() -> str:
    return section_block("After fork()")


def token_block() -> str:
    return section_block("Keys in a PKCS#11 token")


def test_doc_shows_the_example() -> None:
    assert EXAMPLE.read_text(encoding="utf-8") in [code for _, code in blocks()]


def test_example_runs() -> None:
    r = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "200 signatures verified" in r.stdout


def test_the_api_block_runs_top_to_bottom(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "api.py"
    script.write_text(api_block(), encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_the_floor_block_refuses_a_rolled_back_store(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "floor.py"
    script.write_text(floor_block(), encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["REPLAYED_OBJECT", "REPLAYED_OBJECT"]


def test_the_agent_block_runs_against_an_agent(key_agent: KeyAgent) -> None:
    """The page's shell block makes the same files (key.env, key.pub) and
    agent (agent.sock) that the key_agent fixture does; docs/run_blocks.py
    runs the page's blocks as they are."""
    script = key_agent.dir / "agent_block.py"
    script.write_text(agent_block(), encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=key_agent.dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False"]


def test_the_fork_block_forks_and_signs(tmp_path: pathlib.Path) -> None:
    """A pool's workers sign with the parent's engine; the child of
    os.fork() is refused the parent's isolated key, with ShutDown naming
    the fork, and loads it again."""
    script = tmp_path / "fork.py"
    script.write_text(fork_block(), encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(
        r"this key was made in process \d+, before this process \(\d+\) forked from it: .*load the key again in this process\n",
        r.stdout,
    ), r.stdout


def test_the_token_block_signs_in_a_token(tmp_path: pathlib.Path) -> None:
    """The page's shell block makes what vectors/softhsm-fixture.sh makes
    (softhsm2.conf, pin, the token `edge` with the key `tls-p256`);
    docs/run_blocks.py runs the page's blocks as they are."""
    r = subprocess.run(
        ["bash", str(REPO / "vectors" / "softhsm-fixture.sh"), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    if r.returncode == 77:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
    script = tmp_path / "token_block.py"
    script.write_text(token_block(), encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "INVALID_PRIVATE_KEY"]


def test_every_python_block_is_run_or_says_why_not() -> None:
    example, api, agent, fork = EXAMPLE.read_text(encoding="utf-8"), api_block(), agent_block(), fork_block()
    for info, code in blocks():
        if code in (example, api, agent, fork, token_block(), floor_block()):
            continue
        # A block that needs what a test cannot give it says why in its info
        # string, as docs/run_blocks.py reads it: `no-run (the reason)`.
        assert re.search(r"\bno-run \(.+\)", info), f"a python block that no test runs:\n{code}"
