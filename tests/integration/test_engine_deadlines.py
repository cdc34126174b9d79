"""Engine deadlines through the whole control plane: a real server, agent and sim.

`load_timeout`: a replica that does not turn ready in time fails with the reason,
its shard is stopped and gone (GPU free), and the retry waits for the backoff.
`unhealthy_after`: a ready replica whose engine hangs (SIGSTOP: it accepts and
answers nothing) is stopped, recorded as failed with the reason, and replaced.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import httpx
from procs import Proc, Server, free_port, free_port_block, llmgw
from test_agent_restart import node, wait_for


def test_a_replica_that_does_not_load_in_time_fails_frees_its_gpu_and_backs_off(
    tmp_path: Path,
) -> None:
    (tmp_path / "llmgw.yaml").write_text(
        "control: {heartbeat_interval: 0.3, unreachable_after: 15, lost_after: 30, "
        "reconcile_interval: 0.5, retry_base: 30, retry_max: 60, activation_timeout: 60, "
        "stop_grace: 5}\n"
        "models:\n"
        "  - name: slow\n    weights: none\n    min_replicas: 1\n    keep_alive: -1\n"
        "    profiles: [{name: sim, engine: sim, gpus: 1, load_timeout: 2s, drain_grace: 1,\n"
        "                engine_args: [--zero-delay, --load-time, '600']}]\n"
    )
    agent_port = free_port()
    low = free_port_block(5)
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-r",
            "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / "weights"),
            "--port-range", f"{low}-{low + 4}",
        )
    )  # fmt: skip
    try:

        def status() -> dict[str, Any]:
            answer = httpx.get(f"{server.admin}/admin/api/models/slow", timeout=10).json()
            found: dict[str, Any] = answer["status"]
            return found

        wait_for(lambda: status()["failures"] >= 1, "the load deadline to fail the replica")
        failure = status()["last_failure"]
        assert failure["message"].startswith("did not become ready within 2s"), failure
        assert failure["exit_code"] == -15  # stopped by the agent (SIGTERM)
        # Its GPU is free again (the process is gone), and the retry waits for the backoff.
        wait_for(lambda: not node(server)["shards"], "the failed shard to be gone")
        assert status()["retry_in_seconds"] > 0
        events = httpx.get(
            f"{server.admin}/admin/api/events", params={"model": "slow"}, timeout=10
        ).json()["events"]
        failed = [e for e in events if e["kind"] == "failed"]
        assert failed and "retrying in" in failed[0]["message"], events
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_a_hung_ready_replica_is_restarted_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "llmgw.yaml").write_text(
        "control: {heartbeat_interval: 0.3, unreachable_after: 15, lost_after: 30, "
        "reconcile_interval: 0.5, retry_base: 1, retry_max: 4, activation_timeout: 60, "
        "stop_grace: 2}\n"
        "models:\n"
        "  - name: hangs\n    weights: none\n    min_replicas: 1\n    keep_alive: -1\n"
        "    profiles: [{name: sim, engine: sim, gpus: 1, unhealthy_after: 2s, drain_grace: 1,\n"
        "                engine_args: [--zero-delay]}]\n"
    )
    agent_port = free_port()
    low = free_port_block(5)
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-r",
            "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / "weights"),
            "--port-range", f"{low}-{low + 4}",
        )
    )  # fmt: skip
    stopped: list[int] = []
    try:

        def ready() -> list[dict[str, Any]]:
            return [s for s in node(server)["shards"] if s["state"] == "ready"]

        wait_for(lambda: len(ready()) == 1, "the replica to be ready")
        [first] = ready()
        os.kill(first["pid"], signal.SIGSTOP)
        stopped.append(first["pid"])
        wait_for(
            lambda: [s["id"] for s in ready()] not in ([], [first["id"]]),
            "a replacement to be ready",
            within=120,
        )
        # The reason is recorded (the replica is ready again, so it is in the events).
        events = httpx.get(
            f"{server.admin}/admin/api/events", params={"model": "hangs"}, timeout=10
        ).json()["events"]
        [failed] = [e for e in events if e["kind"] == "failed"]
        assert first["id"] in failed["message"], failed
        assert "health probe failing for 2s: /health" in failed["message"], failed
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        agent.stop()
        server.proc.stop()
