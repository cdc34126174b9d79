"""A node's certificate serves only what the leader placed on that node: tried as an attacker.

A real `llmgw server` with its default agent listener (mTLS, the cluster CA);
two nodes join with tokens through real agents: `gpu-a` (token labels
pool=real) serves model `sim-a`, `evil` (token labels pool=evil, fabric
ib-domain=pod1) is the only node model `sim-c` may be placed on. Then `evil`'s
agent stops and the attacker, holding `evil`'s own certificate and key, speaks
the agent protocol itself (the proto stubs over grpc.aio) and announces:

- at Register, a Ready replica of `sim-a` at its own fake engine (a real `llmgw
  sim` serving `sim-a`) and `gpu-a`'s real replica id at that address; later,
  in a ShardStatus, another one;
- for a replica the leader really placed on it (`sim-c`): Ready at another
  address, then at another port, then as another model.

Every one is refused: the routers send `sim-a` to `gpu-a`'s engine only, the
fake engines get no request, the events say what was refused (naming the
URL), the forged node gets a StopShard for each, and nothing reaches the
published endpoints. The node also keeps its token's labels whatever it
declares. Waits poll with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import httpx
import pytest
from procs import Proc, Server, free_port, free_port_block, llmgw

from llmgw.proto import agent_pb2, agent_pb2_grpc

CONFIG = """\
control: {heartbeat_interval: 0.3, unreachable_after: 1.5, lost_after: 3, reconcile_interval: 0.5,
          retry_base: 1, retry_max: 2, activation_timeout: 20, stop_grace: 1}
router: {health: {interval: 0.5}}
models:
  - name: sim-a
    weights: none
    profiles: [{name: sim, engine: sim, gpus: 1, labels: {pool: real}}]
  - name: sim-c
    weights: none
    profiles: [{name: sim, engine: sim, gpus: 1, labels: {pool: evil}}]
"""

Call = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ServerMessage]


async def eventually(
    check: Callable[[], Awaitable[object]], what: str, within: float = 60
) -> object:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class ForgedNode:
    """The attacker: a joined node's certificate and key, and the agent protocol spoken by hand."""

    def __init__(self, address: str, tls: Path) -> None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=(tls / "ca.crt").read_bytes(),
            private_key=(tls / "node.key").read_bytes(),
            certificate_chain=(tls / "node.crt").read_bytes(),
        )
        self.channel = grpc.aio.secure_channel(
            address, credentials, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.call: Call = agent_pb2_grpc.AgentServiceStub(self.channel).Connect()
        self.received: list[agent_pb2.ServerMessage] = []
        self._tasks: list[asyncio.Task[None]] = []
        # grpc.aio allows one write at a time on a stream: heartbeats and reports take turns.
        self._writing = asyncio.Lock()

    async def register(self, message: agent_pb2.Register) -> None:
        await self.call.write(agent_pb2.AgentMessage(register=message))
        reply = await asyncio.wait_for(self.call.read(), 30)
        assert isinstance(reply, agent_pb2.ServerMessage) and reply.HasField("registered"), reply
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._beat())]

    async def _read(self) -> None:
        while True:
            message = await self.call.read()
            if message is grpc.aio.EOF:
                return
            assert isinstance(message, agent_pb2.ServerMessage)
            self.received.append(message)

    async def _beat(self) -> None:
        sequence = 0
        while True:
            sequence += 1
            await self.send(
                agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sequence=sequence))
            )
            await asyncio.sleep(0.2)

    def stopped(self) -> set[str]:
        return {m.stop_shard.shard_id for m in self.received if m.HasField("stop_shard")}

    async def next_start(self, seen: int) -> agent_pb2.ServerMessage:
        async def found() -> agent_pb2.ServerMessage | None:
            starts = [m for m in self.received if m.HasField("start_shard")]
            return starts[seen] if len(starts) > seen else None

        start = await eventually(found, f"start command #{seen + 1} for the forged node")
        assert isinstance(start, agent_pb2.ServerMessage)
        return start

    async def started(self, start: agent_pb2.ServerMessage, report: agent_pb2.ShardStatus) -> None:
        """Answer a start as an agent does: the shard's status first, then the result."""
        await self.send(agent_pb2.AgentMessage(shard_status=report))
        await self.send(
            agent_pb2.AgentMessage(
                command_result=agent_pb2.CommandResult(command_id=start.command_id, ok=True)
            )
        )

    async def send(self, message: agent_pb2.AgentMessage) -> None:
        async with self._writing:
            await self.call.write(message)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await task
        self.call.cancel()
        await self.channel.close()


def status(
    shard_id: str, model: str, url: str, state: int = agent_pb2.SHARD_STATE_READY
) -> agent_pb2.ShardStatus:
    return agent_pb2.ShardStatus(
        shard_id=shard_id, model=model, state=state, pid=4242, endpoint_url=url,
        since_unix=time.time(),
        spec=agent_pb2.ShardSpec(shard_id=shard_id, model=model, engine="sim", port=0),
    )  # fmt: skip


def fake_engine(host: str, port: int, model: str) -> Proc:
    """The attacker's engine: a real `llmgw sim`, which counts every request it gets."""
    proc = Proc(llmgw("sim", "--host", host, "--port", str(port), "--model", model))
    proc.wait_http(f"http://{host}:{port}/sim/stats")
    return proc


def requests_to(host: str, port: int) -> int:
    stats = httpx.get(f"http://{host}:{port}/sim/stats", timeout=5).json()
    return int(stats["requests_total"])


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.agent_port = free_port()
        config = tmp / "llmgw.yaml"
        config.write_text(CONFIG)
        self.server = Server(
            "--agent-listen", self.address, "--config", str(config),
            data_dir=tmp / "data", insecure_agents=False,
        )  # fmt: skip
        self.procs: list[Proc] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    def token(self, *args: str) -> str:
        done = subprocess.run(
            llmgw("nodes", "token", "create", "--json", *args, "--admin", self.server.admin),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return str(json.loads(done.stdout)["token"])

    def agent(self, name: str, *args: str) -> Proc:
        low = free_port_block(4)
        proc = Proc(
            llmgw(
                "agent", "--server", self.address, "--gpus", "1x24GiB", "--node-id", name,
                "--state-dir", str(self.tmp / "state" / name),
                "--weights-dir", str(self.tmp / "weights" / name),
                "--port-range", f"{low}-{low + 3}", *args,
            )
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    async def nodes(self) -> dict[str, dict[str, object]]:
        async with httpx.AsyncClient(timeout=10) as client:
            listed = (await client.get(self.server.admin + "/admin/api/nodes")).json()["nodes"]
        return {str(n["id"]): n for n in listed}

    async def events(self, node: str) -> list[str]:
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.get(
                self.server.admin + "/admin/api/events", params={"node": node, "limit": "500"}
            )
        return [str(e["message"]) for e in answer.json()["events"]]

    async def endpoint_urls(self) -> set[str]:
        async with httpx.AsyncClient(timeout=10) as client:
            listed = (await client.get(self.server.admin + "/admin/api/endpoints")).json()
        return {str(e["url"]) for e in listed["endpoints"]}

    async def chat(self, model: str) -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as client:
            return await client.post(
                f"{self.server.url}/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 4},
            )  # fmt: skip


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    made = Fleet(tmp_path)
    try:
        yield made
    except BaseException:
        print(made.server.proc.output())
        raise
    finally:
        for proc in made.procs:
            proc.stop()
        made.server.proc.stop()


async def registered(fleet: Fleet, node: str) -> bool:
    found = (await fleet.nodes()).get(node)
    return found is not None and found["state"] == "ready" and bool(found["connected"])


@pytest.mark.timeout(300)
async def test_a_node_certificate_serves_only_what_was_placed_on_that_node(fleet: Fleet) -> None:
    fleet.agent("gpu-a", "--token", fleet.token("--labels", "pool=real"))
    evil_token = fleet.token("--labels", "pool=evil", "--fabric", "ib-domain=pod1")
    # Its agent declares the other pool: the token's label binds.
    evil_agent = fleet.agent("evil", "--token", evil_token, "--labels", "pool=real")
    await eventually(lambda: registered(fleet, "gpu-a"), "gpu-a to join")
    await eventually(lambda: registered(fleet, "evil"), "evil to join")
    assert (await fleet.nodes())["evil"]["labels"] == {"pool": "evil"}
    assert "--labels pool=real is ignored" in evil_agent.output()

    answer = await fleet.chat("sim-a")
    assert answer.status_code == 200, answer.text
    [real] = [s for s in (await fleet.nodes())["gpu-a"]["shards"] if s["model"] == "sim-a"]  # type: ignore[attr-defined]
    evil_agent.stop()

    async def evil_gone() -> bool:
        return not (await fleet.nodes())["evil"]["connected"]

    await eventually(evil_gone, "evil's agent stream to close")

    # The attacker: evil's own certificate, a port range of its choosing, a fake engine in it.
    low = free_port_block(4)
    fake = await asyncio.to_thread(fake_engine, "127.0.0.1", low, "sim-a")
    fleet.procs.append(fake)
    fake_url = f"http://127.0.0.1:{low}"
    forged = ForgedNode(fleet.address, fleet.tmp / "state" / "evil" / "tls")
    try:
        register = agent_pb2.Register(
            node_id="evil", hostname="evil.lab", agent_version="9.9.9",
            hardware=agent_pb2.Hardware(
                gpus=[agent_pb2.Gpu(index=0, uuid="GPU-evil", name="NVIDIA H100",
                                    memory_total_bytes=80 << 30, memory_free_bytes=80 << 30)],
                cpu_count=8, memory_total_bytes=64 << 30, gpu_source="declared",
            ),
            labels={"pool": "real", "extra": "x"}, fabric={"ib-domain": "pod9"},
            port_range_start=low, port_range_end=low + 3, weights_dir="/w",
            advertise_host="127.0.0.1",
            running_shards=[status("stolen-1", "sim-a", fake_url), status(str(real["id"]), "sim-a", fake_url)],
        )  # fmt: skip
        await forged.register(register)
        await eventually(
            lambda: asyncio.sleep(0, {"stolen-1", str(real["id"])} <= forged.stopped()),
            "StopShard for both shards it announced at Register",
        )
        await forged.send(
            agent_pb2.AgentMessage(shard_status=status("stolen-2", "sim-a", fake_url))
        )
        await eventually(
            lambda: asyncio.sleep(0, "stolen-2" in forged.stopped()), "StopShard for stolen-2"
        )
        evil = (await fleet.nodes())["evil"]
        assert evil["shards"] == []
        assert evil["labels"] == {"pool": "evil", "extra": "x"}
        assert evil["fabric"] == {"ib-domain": "pod1"}

        # Tenants' prompts for sim-a go to gpu-a's engine only.
        for _ in range(5):
            served = await fleet.chat("sim-a")
            assert served.status_code == 200, served.text
        assert await asyncio.to_thread(requests_to, "127.0.0.1", low) == 0
        assert fake_url not in await fleet.endpoint_urls()
        events = await fleet.events("evil")
        for shard in ("stolen-1", str(real["id"]), "stolen-2"):
            assert (
                f"node evil reported shard {shard} of model sim-a that was never placed there; "
                "not served"
            ) in events, events
        assert any("declared label pool=real (its join token fixes pool=evil)" in e for e in events)

        # A replica the leader does place on evil (the only node for sim-c), reported Ready
        # at another address, then at another port, then as another model.
        request = asyncio.create_task(fleet.chat("sim-c"))
        start = await forged.next_start(0)
        spec = start.start_shard.spec
        assert spec.model == "sim-c" and low <= spec.port <= low + 3
        other = await asyncio.to_thread(fake_engine, "127.0.0.2", spec.port, "sim-c")
        fleet.procs.append(other)
        elsewhere = f"http://127.0.0.2:{spec.port}"
        await forged.started(start, status(spec.shard_id, "sim-c", elsewhere))
        refused = await request
        # The start failed (its URL is not where the node is): the client is told the model
        # failed, the operator why (the events, below); addresses never reach clients.
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "model_failed"
        assert "127.0.0.2" not in refused.text

        retry = await forged.next_start(1)
        placed_port = retry.start_shard.spec.port
        wrong_port = placed_port + 1 if placed_port < low + 3 else low
        await forged.started(
            retry,
            status(retry.start_shard.spec.shard_id, "sim-c", f"http://127.0.0.1:{wrong_port}"),
        )
        third = await forged.next_start(2)
        await forged.started(third, status(third.start_shard.spec.shard_id, "sim-a", fake_url))
        placed = {spec.shard_id, retry.start_shard.spec.shard_id, third.start_shard.spec.shard_id}
        await eventually(lambda: asyncio.sleep(0, placed <= forged.stopped()), "StopShard for each")

        events = await fleet.events("evil")
        assert any(
            f"at {elsewhere}, which is not where the node is: its host 127.0.0.2 is not the "
            "node's address (127.0.0.1)" in e
            for e in events
        ), events
        assert any(
            f"its port {wrong_port} is not the port the shard was placed on ({placed_port})" in e
            for e in events
        ), events
        assert any(
            f"shard {third.start_shard.spec.shard_id} of model sim-a, but it was placed there "
            "for model sim-c" in e
            for e in events
        ), events
        urls = await fleet.endpoint_urls()
        assert not any(url.startswith(("http://127.0.0.2", fake_url)) for url in urls), urls
        assert await asyncio.to_thread(requests_to, "127.0.0.2", spec.port) == 0
        assert await asyncio.to_thread(requests_to, "127.0.0.1", low) == 0
        metrics = fleet.server.metrics()
        for reason in ("unplaced", "endpoint", "model"):
            line = next(
                line for line in metrics.splitlines()
                if line.startswith(f'llmgw_agent_shard_reports_refused_total{{reason="{reason}"}}')
            )  # fmt: skip
            assert float(line.split()[-1]) >= 1, line
    finally:
        await forged.close()
