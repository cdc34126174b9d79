"""A fleet that downloads hub weights: a real `llmgw server`, real agents with
`HF_ENDPOINT` on a hub stand-in (`hub_standin`), and `llmgw sim` engines.

Shared by the tests of hub weights (integration and browser): the small repo,
the catalog config, starting an agent on its own weights directory, and reading
shards, nodes, events and `llmgw models show` back. `hub_fleet` starts a server
and its agents, prints their output when the block fails, and stops them on
every exit.

Not guaranteed: anything about the engines beyond starting (the sim runs with
`--zero-delay`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from hub_standin import HubRepo, HubStandin, make_repo
from procs import Proc, Server, free_port, free_port_block, llmgw

# The hub client writes in 10 MB pieces: three of them make a download whose progress
# moves in steps (33%, 66%) while the stand-in paces it.
WEIGHT_BYTES = 30_000_000
RATE = 6_000_000


def tiny_repo(repo_id: str = "org/tiny", **kwargs: Any) -> HubRepo:
    return make_repo(
        repo_id,
        {
            "config.json": b'{"model_type": "llama"}',
            "model.safetensors": os.urandom(WEIGHT_BYTES),
        },
        **kwargs,
    )


def config(weights: str, *, min_replicas: int = 1, max_replicas: int = 1) -> str:
    return (
        "control: {heartbeat_interval: 0.3, reconcile_interval: 0.3, retry_base: 0.5, "
        "retry_max: 2, activation_timeout: 120, activation_keepalive: 0.5}\n"
        "models:\n"
        f"  - name: tiny\n    weights: {weights}\n    min_replicas: {min_replicas}\n"
        f"    max_replicas: {max_replicas}\n    keep_alive: -1\n"
        "    profiles: [{name: sim, engine: sim, engine_args: [--zero-delay]}]\n"
    )


SEED = (
    "control: {reconcile_interval: 0.3}\n"
    "models:\n  - name: seed\n    weights: none\n    profiles: [{name: p, engine: sim}]\n"
)  # a control plane needs one model to start; the tests add theirs through the admin API


def start_agent(
    agent_port: int, tmp: Path, hub: HubStandin, node: str = "node-a", *extra: str
) -> Proc:
    low = free_port_block(4)
    return Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", node,
            "--weights-dir", str(tmp / node / "weights"), "--state-dir", str(tmp / node / "state"),
            "--port-range", f"{low}-{low + 3}", "--stop-engines-on-exit", *extra,
        ),
        env={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1"},
    )  # fmt: skip


def shards(server: Server) -> list[dict[str, Any]]:
    nodes = httpx.get(server.admin + "/admin/api/nodes", timeout=10).json()["nodes"]
    return [s for n in nodes for s in n["shards"]]


def node_view(server: Server, node: str = "node-a") -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"{server.admin}/admin/api/nodes/{node}", timeout=10).json()
    return found


def events(server: Server, **params: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.get(
        f"{server.admin}/admin/api/events", params=params, timeout=10
    ).json()["events"]
    return found


def models_show(server: Server, name: str = "tiny") -> str:
    shown = subprocess.run(
        llmgw("models", "show", name, "--admin", server.admin),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return shown.stdout + shown.stderr


@dataclass
class HubFleet:
    server: Server
    agents: list[Proc]
    agent_port: int


@contextmanager
def hub_fleet(
    tmp: Path, hub: HubStandin, config_text: str, nodes: Sequence[str] = ("node-a",)
) -> Iterator[HubFleet]:
    """A server on `config_text` and one agent per node (weights under `tmp/NODE`)."""
    (tmp / "llmgw.yaml").write_text(config_text)
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp / "llmgw.yaml"),
        data_dir=tmp / "data",
    )  # fmt: skip
    fleet = HubFleet(server, [], agent_port)
    try:
        fleet.agents += [start_agent(agent_port, tmp, hub, node) for node in nodes]
        yield fleet
    except BaseException:
        print(server.proc.output())
        for agent in fleet.agents:
            print(agent.output())
        raise
    finally:
        for agent in fleet.agents:
            agent.stop()
        server.proc.stop()
