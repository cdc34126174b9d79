"""A fleet of real agents that download hub weights from a hub stand-in, for tests.

What tests of the weights path share: the small repo (`tiny_repo`), an agent with
its own weights and state directories and `HF_ENDPOINT` on the stand-in
(`start_agent`), and reading the fleet back through the admin API and the CLI.
The `hub` fixture itself is in tests/conftest.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
from hub_standin import HubRepo, HubStandin, make_repo
from procs import Proc, Server, free_port_block, llmgw

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


def models_show(server: Server, name: str = "tiny") -> str:
    shown = subprocess.run(
        llmgw("models", "show", name, "--admin", server.admin),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return shown.stdout + shown.stderr
