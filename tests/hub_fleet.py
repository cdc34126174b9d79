"""A fleet's hub weights in tests: a small repo on the hub stand-in, agents that use it.

Shared by the hub weights tests (tests/integration/test_hub_weights.py,
test_weights_pull.py): the `hub` fixture (a `hub_standin` server for one test;
loaded as a plugin by tests/conftest.py), a 30 MB repo whose download moves in
visible steps while the stand-in paces it, a control-plane config with one
model `tiny`, agents whose `HF_ENDPOINT` is the stand-in, and readers of the
admin API's node and shard views and of `llmgw models show`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hub_standin import HubRepo, HubStandin, make_repo, serve_hub
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


@pytest.fixture
def hub() -> Iterator[HubStandin]:
    """A hub stand-in for the test, stopped after it."""
    with serve_hub() as standin:
        yield standin


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
