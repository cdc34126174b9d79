"""The fleet end to end: real `llmgw agent` processes against the control plane's agent service.

The control plane runs in the test process (inventory + agent service on a real
gRPC listener, the dispatcher driven directly, as the reconciler does: each start
recorded in the placement records of a real SQLite store first); agents,
engines (`llmgw sim`, real llama.cpp) and sockets are real.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from placement_fixtures import open_book, place
from procs import Proc, free_port_block, llmgw

from llmgw import __version__
from llmgw.control.agentsvc import (
    AgentListener,
    AgentServicer,
    CommandFailed,
    run_sweeper,
    serve_agents,
)
from llmgw.control.inventory import Inventory, Node, ShardSpec, UnknownNode
from llmgw.control.placements import PlacementBook
from llmgw.store import Store, utc_now


@dataclass
class ControlPlane:
    inventory: Inventory
    servicer: AgentServicer
    listener: AgentListener
    sweeper: asyncio.Task[None]
    store: Store
    placements: PlacementBook

    async def start(self, node_id: str, spec: ShardSpec) -> None:
        """Record the placement, then send the start (what the reconciler does)."""
        await place(self.placements, node_id, spec)
        await self.servicer.start_shard(node_id, spec)

    async def stop(self) -> None:
        self.sweeper.cancel()
        await self.listener.stop(1.0)
        await self.store.close()


async def start_control_plane(data: Path, port: int = 0) -> ControlPlane:
    """A control plane whose placement records live in `data` (a restart reads them)."""
    store, placements = await open_book(data)
    inventory = Inventory(
        clock=time.monotonic, wall_clock=utc_now, unreachable_after=1.0, lost_after=2.5
    )
    servicer = AgentServicer(
        inventory=inventory, placements=placements, heartbeat_interval=0.25,
        leader_id="test-server", server_version=__version__, command_timeout=20.0,
    )  # fmt: skip
    listener = await serve_agents(servicer=servicer, host="127.0.0.1", port=port)
    sweeper = asyncio.create_task(
        run_sweeper(inventory=inventory, interval=0.1, sleep=asyncio.sleep)
    )
    return ControlPlane(inventory, servicer, listener, sweeper, store, placements)


def start_agent(node: str, port: int, tmp: Path, *extra: str) -> Proc:
    low = free_port_block(21)
    return Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{port}", "--node-id", node,
            "--gpus", "2x24GiB", "--labels", "zone=a", "--fabric", "ib-domain=pod3",
            "--weights-dir", str(tmp / node / "weights"),
            "--port-range", f"{low}-{low + 20}", *extra,
        )
    )  # fmt: skip


async def eventually(check: Callable[[], object], what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def find_node(inventory: Inventory, node: str) -> Node | None:
    try:
        return inventory.node(node)
    except UnknownNode:
        return None


def shard_state(inventory: Inventory, node: str, shard: str) -> str | None:
    found = find_node(inventory, node)
    if found is None or shard not in found.shards:
        return None
    return found.shards[shard].state


def port_of(inventory: Inventory, node: str) -> int:
    found = inventory.node(node)
    assert found is not None
    return found.port_range[0] + 1


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[ControlPlane, Proc, Proc]]:
    plane = await start_control_plane(tmp_path / "data")
    one = start_agent("node-1", plane.listener.port, tmp_path)
    two = start_agent("node-2", plane.listener.port, tmp_path)
    try:
        await eventually(lambda: len(plane.inventory.nodes()) == 2, "both nodes to register")
        yield plane, one, two
    finally:
        one.stop()
        two.stop()
        await plane.stop()


async def test_nodes_register_with_hardware_and_run_shards(
    fleet: tuple[ControlPlane, Proc, Proc], tmp_path: Path
) -> None:
    plane, _, _ = fleet
    for node in plane.inventory.nodes():
        assert node.state == "ready"
        assert [g.memory_total for g in node.gpus] == [24 * 2**30] * 2
        assert node.fabric == {"ib-domain": "pod3"}
        assert node.labels == {"zone": "a"}
        assert node.gpu_source == "declared"

    port = port_of(plane.inventory, "node-1")
    spec = ShardSpec(shard_id="s1", model="m1", engine="sim", weights="", port=port)
    await plane.start("node-1", spec)
    await eventually(
        lambda: shard_state(plane.inventory, "node-1", "s1") == "ready", "the sim to be ready"
    )
    node = plane.inventory.node("node-1")
    assert node is not None
    shard = node.shards["s1"]
    assert shard.endpoint_url == f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        models = (await client.get(shard.endpoint_url + "/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["m1"]
    pid = shard.pid

    # An engine that exits reports failed, with its output tail.
    bad = ShardSpec(
        shard_id="s2",
        model="m2",
        engine="sim",
        weights="",
        port=port + 1,
        engine_args=("--no-such-flag",),
    )
    await plane.start("node-1", bad)
    await eventually(
        lambda: shard_state(plane.inventory, "node-1", "s2") == "failed", "the bad engine to fail"
    )
    node = plane.inventory.node("node-1")
    assert node is not None
    assert any("no-such-flag" in line for line in node.shards["s2"].output_tail)

    # A bad profile is refused before anything starts.
    with pytest.raises(CommandFailed, match="engine"):
        await plane.start(
            "node-1", ShardSpec(shard_id="s3", model="m", engine="nope", weights="", port=port + 2)
        )

    # Weights removal never leaves the weights directory.
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    with pytest.raises(CommandFailed):
        await plane.servicer.remove_weights("node-1", str(outside))
    with pytest.raises(CommandFailed):
        await plane.servicer.remove_weights("node-1", "../../precious.txt")
    assert outside.read_text() == "keep me"

    await plane.servicer.stop_shard("node-1", "s1", 5.0)
    await eventually(
        lambda: shard_state(plane.inventory, "node-1", "s1") == "stopped", "the sim to stop"
    )
    await eventually(lambda: not _alive(pid), "the engine process to be gone")


async def test_a_killed_agent_goes_unreachable_then_lost_and_its_engine_outlives_it(
    fleet: tuple[ControlPlane, Proc, Proc],
) -> None:
    plane, _, two = fleet
    port = port_of(plane.inventory, "node-2")
    await plane.start(
        "node-2", ShardSpec(shard_id="k1", model="m1", engine="sim", weights="", port=port)
    )
    await eventually(
        lambda: shard_state(plane.inventory, "node-2", "k1") == "ready", "the sim to be ready"
    )
    node = plane.inventory.node("node-2")
    assert node is not None
    pid = node.shards["k1"].pid
    two.signal(signal.SIGKILL)
    await eventually(
        lambda: _node_state(plane, "node-2") == "unreachable", "node-2 to be unreachable"
    )
    await eventually(lambda: _node_state(plane, "node-2") == "lost", "node-2 to be lost")
    # Engines outlive their agent (a restarted agent adopts them); this one is
    # killed by the test's teardown (tests/conftest.py).
    assert _alive(pid)


async def test_agents_reconnect_to_a_restarted_server_and_shards_are_adopted(
    tmp_path: Path,
) -> None:
    plane = await start_control_plane(tmp_path / "data")
    port = plane.listener.port
    agent = start_agent("node-1", port, tmp_path)
    try:
        await eventually(lambda: find_node(plane.inventory, "node-1") is not None, "registration")
        engine_port = port_of(plane.inventory, "node-1")
        await plane.start(
            "node-1",
            ShardSpec(shard_id="a1", model="m1", engine="sim", weights="", port=engine_port),
        )
        await eventually(lambda: shard_state(plane.inventory, "node-1", "a1") == "ready", "ready")
        node = plane.inventory.node("node-1")
        assert node is not None
        url, pid = node.shards["a1"].endpoint_url, node.shards["a1"].pid

        await plane.stop()
        # The engine keeps serving while the control plane is away.
        async with httpx.AsyncClient() as client:
            assert (await client.get(url + "/v1/models")).status_code == 200
        plane = await start_control_plane(tmp_path / "data", port)
        await eventually(
            lambda: shard_state(plane.inventory, "node-1", "a1") == "ready", "adoption", within=40
        )
        node = plane.inventory.node("node-1")
        assert node is not None
        assert list(node.shards) == ["a1"]
        assert node.shards["a1"].pid == pid  # the same process: adopted, not restarted
        async with httpx.AsyncClient() as client:
            assert (await client.get(url + "/v1/models")).status_code == 200
    finally:
        agent.stop()
        await plane.stop()


@pytest.mark.engine
async def test_llamacpp_shard_serves_the_real_model(tmp_path: Path) -> None:
    engine_python = os.environ.get("LLMGW_ENGINE_PYTHON")
    model_file = os.environ.get("LLMGW_MODEL_FILE")
    assert engine_python and model_file, (
        "LLMGW_ENGINE_PYTHON and LLMGW_MODEL_FILE are unset: run `make test`"
    )
    plane = await start_control_plane(tmp_path / "data")
    agent = start_agent("node-1", plane.listener.port, tmp_path, "--engine-python", engine_python)
    try:
        await eventually(lambda: find_node(plane.inventory, "node-1") is not None, "registration")
        port = port_of(plane.inventory, "node-1")
        spec = ShardSpec(
            shard_id="g1", model="gemma-3-270m", engine="llamacpp", weights=model_file, port=port
        )
        await plane.start("node-1", spec)
        await eventually(
            lambda: shard_state(plane.inventory, "node-1", "g1") in ("ready", "failed"),
            "llama.cpp ready",
            within=60,
        )
        shard = plane.inventory.node("node-1").shards["g1"]
        assert shard.state == "ready", (shard.message, shard.output_tail)
        async with httpx.AsyncClient(timeout=60) as client:
            resp = await client.post(
                f"http://127.0.0.1:{port}/v1/completions",
                json={
                    "model": "gemma-3-270m",
                    "prompt": "The capital of France is the city of",
                    "max_tokens": 6,
                    "temperature": 0,
                },
            )
        assert "Paris" in resp.json()["choices"][0]["text"]
    finally:
        agent.stop()
        await plane.stop()


def _node_state(plane: ControlPlane, node_id: str) -> str | None:
    node = find_node(plane.inventory, node_id)
    return node.state if node is not None else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
