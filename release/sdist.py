#!/usr/bin/env python3
"""Writes the Python source distribution, keyfence-VERSION.tar.gz: what
`pip install keyfence-VERSION.tar.gz` builds from source exactly as
`pip install ./bindings/python` does in a checkout (a Rust toolchain, CMake
and a C++ compiler needed).

bindings/python cannot be built alone: its CMake project builds libkeyfence
through the repository's CMake project and Cargo workspace two levels up,
and scikit-build-core packs only the project's own directory. So the sdist
is packed from a staged tree: the files of bindings/python at its root, and
under `workspace/` the tracked files of the repository that the build
reads (the Cargo workspace and its lock file, the top-level CMake project,
the crates, the C ABI and the OpenSSL provider, licences, notices and the
changelog). bindings/python/CMakeLists.txt builds against `workspace/` when
it is there. Left out: what only the repository's own tests and tools use
(vectors/, fuzz/, docs/, release/, the Python tests, which need vectors/
and the CIRCL oracle).

Usage: sdist.py OUT_DIR   (run with the Python that has scikit-build-core;
prints the path of the sdist it wrote)
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "bindings/python"
# Tracked paths the build never reads.
NOT_SHIPPED = ("fuzz/", "vectors/", "docs/", "release/", ".ci/")
NOT_SHIPPED_FILES = {"x", ".gitignore"}
VERSION_INPUT = 'input = "../../Cargo.toml"'


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def stage(root: pathlib.Path) -> None:
    files = tracked()
    for path in files:
        if path.startswith(PACKAGE + "/"):
            rel = path[len(PACKAGE) + 1:]
            if rel.startswith("tests/"):
                continue
            dest = root / rel
        elif path in NOT_SHIPPED_FILES or path.startswith(NOT_SHIPPED):
            continue
        else:
            dest = root / "workspace" / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, dest)
    # The version is the workspace's Cargo.toml's, which sits in workspace/ here.
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    if VERSION_INPUT not in text:
        sys.exit(f"sdist: {PACKAGE}/pyproject.toml no longer reads the version with {VERSION_INPUT!r}")
    pyproject.write_text(text.replace(VERSION_INPUT, 'input = "workspace/Cargo.toml"'))


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    from scikit_build_core.build import build_sdist

    with tempfile.TemporaryDirectory(prefix="keyfence-sdist.") as tmp:
        root = pathlib.Path(tmp) / "keyfence"
        stage(root)
        # scikit-build-core builds from the current directory, as pip
        # would run it in the package's root.
        cwd = pathlib.Path.cwd()
        try:
            os.chdir(root)
            name = build_sdist(str(out))
        finally:
            os.chdir(cwd)
    print(out / name)


if __name__ == "__main__":
    main()
