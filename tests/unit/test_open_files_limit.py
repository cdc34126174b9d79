"""The server raises its open-files limit so that server.max_connections can be reached.

Each case runs in a child process: a lowered hard limit cannot be raised again.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import resource, sys
from llmgw.cli.serving import raise_open_files_limit
soft, hard = (int(v) for v in sys.argv[1:3])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
print(raise_open_files_limit(int(sys.argv[3])))
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def run(soft: int, hard: int, needed: int) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(soft), str(hard), str(needed)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    warning, soft = run(256, 4096, 1000)
    assert warning == "None"
    assert soft == "4096"


def test_a_hard_limit_below_the_need_is_a_warning_saying_what_to_do() -> None:
    warning, soft = run(256, 512, 1000)
    assert soft == "512"
    assert "may open 512 files" in warning and "fewer than the 1000" in warning
    assert "LimitNOFILE=" in warning and "server.max_connections" in warning
