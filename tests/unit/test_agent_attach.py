"""Adopting engines from a state file whose processes are gone."""

from __future__ import annotations

import subprocess
import sys

from llmgw.agent.process import ProcessIdentity, attach


def test_a_pid_with_no_process_is_not_adopted() -> None:
    # A state file can outlive its engines (a reboot, an engine killed by hand):
    # its pid then names no process, and the agent must carry on, not crash.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert attach(gone.pid, expected=ProcessIdentity(1, "0" * 64)) is None
