"""The reachability gate: only endpoints this server can dial reach its router."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime

import pytest

from llmgw.control.reachability import (
    ProbeFailed,
    ReachabilityGate,
    ReplicaUnreachable,
    tcp_probe,
)
from llmgw.control.reconciler.state import ReadyEndpoint

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Local:
    """The router's publisher: records what it was given."""

    def __init__(self) -> None:
        self.models: dict[str, tuple[str, ...]] = {}
        self.withdrawn: list[str] = []

    def publish(self, names: Sequence[str], endpoints: Sequence[ReadyEndpoint]) -> None:
        for name in names:
            self.models[name] = tuple(e.id for e in endpoints)

    def withdraw(self, names: Sequence[str]) -> None:
        for name in names:
            self.models.pop(name, None)
            self.withdrawn.append(name)


class Probe:
    """Fails for the URLs in `down` (with the given error), succeeds otherwise."""

    def __init__(self) -> None:
        self.down: dict[str, str] = {}
        self.calls: list[str] = []
        self.hanging: set[str] = set()  # never answer (a black hole) until released
        self.release = asyncio.Event()

    async def __call__(self, url: str) -> None:
        self.calls.append(url)
        await asyncio.sleep(0)
        if url in self.hanging:
            await self.release.wait()
        if url in self.down:
            raise ProbeFailed(self.down[url])


async def until(check: Callable[[], object], what: str) -> None:
    for _ in range(3000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture
async def gate() -> AsyncIterator[tuple[ReachabilityGate, Local, Probe]]:
    local, probe = Local(), Probe()
    loop = asyncio.get_running_loop()
    gate = ReachabilityGate(
        local=local, probe=probe, clock=loop.time, wall_clock=lambda: NOW, recheck_interval=0.05
    )
    task = asyncio.create_task(gate.run())
    yield gate, local, probe
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_endpoint_is_published_only_once_checked(
    gate: tuple[ReachabilityGate, Local, Probe],
) -> None:
    gate_, local, probe = gate
    gate_.publish(("chat", "chat-alias"), [ReadyEndpoint("r1", "http://10.0.0.2:20000")])
    # At once: the model is known to the router, with no endpoint yet.
    assert local.models == {"chat": (), "chat-alias": ()}
    assert gate_.reach("r1") is not None
    await gate_.wait_routable("chat-alias")
    assert local.models == {"chat": ("r1",), "chat-alias": ("r1",)}
    reach = gate_.reach("r1")
    assert reach is not None and reach.state == "reachable" and reach.checked_at == NOW
    # Published again unchanged: not checked again.
    gate_.publish(("chat", "chat-alias"), [ReadyEndpoint("r1", "http://10.0.0.2:20000")])
    await asyncio.sleep(0.1)
    assert probe.calls == ["http://10.0.0.2:20000"]
    assert local.models["chat"] == ("r1",)


async def test_an_unreachable_endpoint_is_shown_and_kept_out_until_it_answers(
    gate: tuple[ReachabilityGate, Local, Probe],
) -> None:
    gate_, local, probe = gate
    probe.down["http://127.0.0.1:20000"] = "cannot connect to 127.0.0.1:20000: Connection refused"
    gate_.publish(
        ("chat",),
        [ReadyEndpoint("far", "http://127.0.0.1:20000"), ReadyEndpoint("near", "http://h:1")],
    )
    await until(lambda: local.models.get("chat") == ("near",), "the reachable one")
    await until(lambda: (r := gate_.reach("far")) and r.state == "unreachable", "the check")
    reach = gate_.reach("far")
    assert reach is not None
    assert gate_.reaches("chat") == [gate_.reach("far"), gate_.reach("near")]
    assert reach.view() == {
        "replica": "far",
        "state": "unreachable",
        "url": "http://127.0.0.1:20000",
        "error": "cannot connect to 127.0.0.1:20000: Connection refused",
        "checked_at": NOW.isoformat(),
    }
    # Checked again until it answers, then published.
    await until(lambda: probe.calls.count("http://127.0.0.1:20000") >= 3, "re-checks")
    del probe.down["http://127.0.0.1:20000"]
    await until(lambda: local.models.get("chat") == ("far", "near"), "the recovered one")
    # A new URL for the same replica is checked afresh.
    probe.down["http://10.0.0.9:1"] = "no answer from 10.0.0.9:1 within 1 s"
    gate_.publish(
        ("chat",),
        [ReadyEndpoint("far", "http://10.0.0.9:1"), ReadyEndpoint("near", "http://h:1")],
    )
    assert local.models["chat"] == ("near",)


async def test_a_request_waits_for_the_check_and_gets_a_clear_refusal(
    gate: tuple[ReachabilityGate, Local, Probe],
) -> None:
    gate_, local, probe = gate
    probe.down["http://127.0.0.1:20000"] = "cannot connect to 127.0.0.1:20000: Connection refused"
    # Nothing published for a model: nothing to wait for (the router decides).
    await gate_.wait_routable("other")
    gate_.publish(("chat",), [ReadyEndpoint("r1", "http://127.0.0.1:20000")])
    with pytest.raises(ReplicaUnreachable) as refused:
        await gate_.wait_routable("chat")
    message = str(refused.value)
    assert "model 'chat' has 1 ready replica but this server cannot reach it" in message
    assert "replica r1 at http://127.0.0.1:20000: cannot connect to 127.0.0.1:20000" in message
    assert "--advertise-host" in message
    # API clients get the replica's id and what to do, not its address.
    public = refused.value.public
    assert "model 'chat' has 1 ready replica (r1) but this server cannot reach it" in public
    assert "--advertise-host" in public and "127.0.0.1" not in public
    assert local.models["chat"] == ()


async def test_an_address_that_never_answers_does_not_hold_up_others(
    gate: tuple[ReachabilityGate, Local, Probe],
) -> None:
    gate_, local, probe = gate
    probe.hanging.add("http://10.9.9.9:1")
    gate_.publish(("a",), [ReadyEndpoint("slow", "http://10.9.9.9:1")])
    await until(lambda: "http://10.9.9.9:1" in probe.calls, "the slow check to start")
    gate_.publish(("b",), [ReadyEndpoint("fast", "http://h:2")])
    await gate_.wait_routable("b")
    assert local.models == {"a": (), "b": ("fast",)}
    slow = gate_.reach("slow")
    assert slow is not None and slow.state == "checking"
    probe.release.set()
    await until(lambda: local.models["a"] == ("slow",), "the slow one, once it answers")


async def test_withdrawn_models_are_forgotten(gate: tuple[ReachabilityGate, Local, Probe]) -> None:
    gate_, local, _ = gate
    gate_.publish(("chat", "alias"), [ReadyEndpoint("r1", "http://h:1")])
    await gate_.wait_routable("chat")
    gate_.withdraw(["chat", "alias"])
    assert gate_.reach("r1") is None
    assert local.models == {}
    await gate_.wait_routable("chat")  # nothing to wait for


async def test_tcp_probe_against_real_sockets() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        await tcp_probe(f"http://127.0.0.1:{port}", seconds=5)
    with pytest.raises(ProbeFailed, match=rf"cannot connect to 127.0.0.1:{port}: "):
        await tcp_probe(f"http://127.0.0.1:{port}", seconds=5)
    with pytest.raises(ProbeFailed, match="names no host"):
        await tcp_probe("http://:80", seconds=5)
