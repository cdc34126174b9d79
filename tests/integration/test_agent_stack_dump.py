"""SIGUSR1 to a real `llmgw agent`: its threads' and tasks' stacks go to its log, and it
carries on (still connected to a real `llmgw server`, still heartbeating)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for

pytestmark = pytest.mark.timeout(180)

DUMP_LINE = "SIGUSR1: every thread's stack is written above (faulthandler); the asyncio tasks:"


def test_sigusr1_dumps_stacks_to_the_log_and_the_agent_keeps_heartbeating(
    tmp_path: Path,
) -> None:
    agent_port = free_port()
    server = Server(
        "--endpoint", "x=http://127.0.0.1:1=unused", "--agent-listen", f"127.0.0.1:{agent_port}",
        data_dir=tmp_path / "data", wait_ready=False,
    )  # fmt: skip
    low = free_port_block(5)
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-1",
            "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / "weights"),
            "--state-dir", str(tmp_path / "state"), "--port-range", f"{low}-{low + 4}",
        )
    )  # fmt: skip

    def node() -> dict[str, Any] | None:
        answer = httpx.get(server.admin + "/admin/api/nodes/node-1", timeout=10)
        return answer.json() if answer.status_code == 200 else None

    def heartbeat_after(previous: str) -> str | None:
        seen = node()
        if seen is None or not seen["connected"] or seen["last_heartbeat_at"] == previous:
            return None
        return str(seen["last_heartbeat_at"])

    try:
        first = wait_for(lambda: (n := node()) is not None and n["connected"] and n, "register")
        beat = str(first["last_heartbeat_at"])
        for round_ in (1, 2):
            agent.signal(signal.SIGUSR1)
            wait_for(lambda r=round_: agent.output().count(DUMP_LINE) == r, f"dump {round_}")
            # The agent is still there, still connected, still heartbeating.
            beat = wait_for(lambda b=beat: heartbeat_after(b), f"a heartbeat after dump {round_}")
            assert agent.popen.poll() is None
        log = agent.output()
        # The threads, from faulthandler: the event loop's among them.
        assert "Current thread 0x" in log
        assert "(most recent call first):" in log
        assert "in run_until_complete" in log
        # The tasks, grouped: the agent's connection loop and its supervisor.
        tasks = log.split(DUMP_LINE, 1)[1]
        assert "distinct stack" in tasks
        assert "llmgw/agent/connection.py:" in tasks
        assert "llmgw/agent/supervisor.py:" in tasks
        assert "Traceback" not in log
        assert agent.stop() == 0
    except BaseException:
        print(server.proc.output()[-3000:])
        print(agent.output()[-5000:])
        raise
    finally:
        agent.stop()
        server.proc.stop()
