"""A leader pacing a registration storm: agents it cannot take now come back later.

A real `llmgw server` that takes one registration every 5 seconds (burst 1), and
three real agents started together: the first registers at once, the others are
told to come back after a delay (RESOURCE_EXHAUSTED with `llmgw-retry-after-ms`),
say so in their log, obey, and register. No agent's stream is ended any other
way, and every node ends up ready.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for

CONFIG = (
    "control: {heartbeat_interval: 0.5, unreachable_after: 15, lost_after: 60, "
    "registrations_per_second: 0.2, registration_burst: 1}\n"
    "models:\n"
    "  - name: idle\n    weights: none\n    min_replicas: 0\n"
    "    profiles: [{name: sim, engine: sim, gpus: 1}]\n"
)
NODES = ("node-p1", "node-p2", "node-p3")


def nodes(server: Server) -> dict[str, dict[str, Any]]:
    listed = httpx.get(server.admin + "/admin/api/nodes", timeout=10).json()["nodes"]
    return {n["id"]: n for n in listed}


def registers(server: Server, outcome: str) -> float:
    pattern = rf'^llmgw_agent_registers_total\{{outcome="{outcome}"\}} (\S+)$'
    found = re.search(pattern, server.metrics(), re.MULTILINE)
    assert found is not None, f"no llmgw_agent_registers_total{{outcome={outcome!r}}}"
    return float(found.group(1))


def test_agents_the_server_cannot_take_now_come_back_and_register(tmp_path: Path) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agents: list[Proc] = []
    try:
        for node in NODES:
            low = free_port_block(5)
            agents.append(
                Proc(
                    llmgw(
                        "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", node,
                        "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / node),
                        "--port-range", f"{low}-{low + 4}",
                    )
                )
            )  # fmt: skip
        wait_for(
            lambda: all(
                n.get("connected") and n.get("state") == "ready"
                for n in (nodes(server).get(node, {}) for node in NODES)
            ),
            "all three agents to register",
            within=120,
        )
        deferred = registers(server, "deferred")
        assert deferred >= 1, server.metrics()
        assert registers(server, "accepted") == len(NODES)
        told = [a for a in agents if "is busy" in a.output()]
        assert told, [a.output() for a in agents]
        for agent in told:
            out = agent.output()
            assert re.search(r"come back in \d+\.\d s", out), out
        # Every agent is still running and was told to wait, never dropped.
        assert all(a.popen.poll() is None for a in agents)
        assert "CANCELLED" not in "".join(a.output() for a in agents)
    except BaseException:
        print(server.proc.output())
        for agent in agents:
            print(agent.output())
        raise
    finally:
        for agent in agents:
            agent.stop()
        server.proc.stop()
