"""A venv with a plain, non-editable `pip install` of a copy of this tree and nothing
else: what a user gets from `pip install .` (tests/integration/test_install.py).

It takes a minute or more (pip's cache makes it faster), so it is built once per
session, in the background from the start of the session (`tests/warm.py`), with the
environment the session began with (`procs.child_env`), never a running test's.
A failed step fails the test that waits for it, with pip's output.

Not guaranteed: that the install works offline. pip needs the package index (or its
cache) for the dependencies, as the README's `make run` does.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from procs import child_env

ROOT = Path(__file__).resolve().parents[1]
# What `pip install .` reads: the build config, the readme it names, the sources.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "src")
PIP_TIMEOUT = 900.0


def build_plain_install(stack: contextlib.ExitStack[bool | None]) -> Path:
    """Build the venv in a temporary directory (removed when `stack` closes); its bin."""
    work = Path(tempfile.mkdtemp(prefix="llmgw-plain-install-"))
    stack.callback(shutil.rmtree, work, ignore_errors=True)
    source = work / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(
                path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        elif path.exists():
            shutil.copy2(path, source / name)
    venv = work / "venv"
    # The base interpreter, not this venv's: the fresh venv must not see the test extra.
    base = getattr(sys, "_base_executable", sys.executable)
    # At a lower priority (nice 10): it overlaps tests that wait on real processes, and
    # takes the CPU they leave idle rather than slowing them.
    low = ["nice", "-n", "10"]
    python = str(venv / "bin" / "python")
    steps = [
        [*low, base, "-m", "venv", str(venv)],
        [*low, python, "-m", "pip", "install", "-q", str(source)],
    ]
    env = child_env()
    for argv in steps:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT,
            check=False,
            cwd=work,
            env=env,
        )
        if done.returncode != 0:
            pytest.fail(
                f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}",
                pytrace=False,
            )
    test_only = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import pytest"],
        capture_output=True,
        check=False,
        env=env,
    )
    assert test_only.returncode != 0, "the fresh venv has the test extra; it must not"
    return venv / "bin"
