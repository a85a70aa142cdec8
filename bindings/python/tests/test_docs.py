"""docs/python.md shows the example program unchanged, and it runs."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "bindings" / "python" / "examples" / "service.py"


def test_doc_shows_the_example() -> None:
    doc = (REPO / "docs" / "python.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert EXAMPLE.read_text(encoding="utf-8") in blocks


def test_example_runs() -> None:
    r = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "200 signatures verified" in r.stdout
