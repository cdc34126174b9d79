"""Running the real `llmgw` CLI from tests, as an operator would, and the Redis they share."""

from __future__ import annotations

import os
import subprocess

from procs import llmgw

REDIS_URL = "redis://127.0.0.1:6379/0"


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run `llmgw ARGS` without the test run's LLMGW_* settings; its result, whatever it is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return subprocess.run(
        llmgw(*args), input=stdin, capture_output=True, text=True, timeout=60, check=False, env=env
    )


def made(*args: str, stdin: str = "") -> str:
    """Run `llmgw ARGS`, which must succeed; its standard output."""
    result = cli(*args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout
