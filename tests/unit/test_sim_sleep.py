"""The sim's sleep mode in-process: vLLM's endpoint shapes, refusals while asleep, memory.

Runs on the sim's injected sleep (recorded, not waited), so no test sleeps for real.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry
from test_sim_app import CHAT, Reply, _exit, call

from llmgw.cli.sim_wiring import build_app
from llmgw.sim.app import SimApp
from llmgw.sim.faults import FaultSettings
from llmgw.sim.settings import SimSettings


def _sleepy_app(waits: list[float], **settings: Any) -> SimApp:
    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    defaults: dict[str, Any] = {"models": ("sim-a",), "zero_delay": True}
    return build_app(
        SimSettings(**{**defaults, **settings}),
        faults=FaultSettings(),
        registry=CollectorRegistry(auto_describe=False),
        clock=lambda: 0.0,
        wall_clock=lambda: 1_700_000_000.0,
        sleep=sleep,
        exit_process=_exit,
    )


async def _post(app: SimApp, path: str, query: bytes = b"") -> Reply:
    reply = Reply()
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if not done.is_set():
            done.set()
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            reply.status = message["status"]
            return
        reply.chunks.append(message.get("body", b""))

    scope = {"type": "http", "method": "POST", "path": path, "query_string": query, "headers": []}
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    return reply


async def _stats(app: SimApp) -> Any:
    return (await call(app, "GET", "/sim/stats")).json()["sleep"]


async def test_level_1_sleep_refuses_inference_keeps_health_and_wakes() -> None:
    waits: list[float] = []
    app = _sleepy_app(waits, sleep_time=0.2, wake_time=0.7, weights_bytes=1000)
    assert (await call(app, "GET", "/is_sleeping")).json() == {"is_sleeping": False}
    assert (await _stats(app))["weights_gpu_bytes"] == 1000

    reply = await _post(app, "/sleep", b"level=1")
    assert (reply.status, reply.body) == (200, b"")
    assert waits == [0.2]
    assert (await call(app, "GET", "/is_sleeping")).json() == {"is_sleeping": True}
    refused = await call(app, "POST", "/v1/chat/completions", CHAT)
    assert refused.status == 503
    assert refused.json()["error"]["code"] == "sleeping"
    assert "sleeping" in refused.json()["error"]["message"]
    for path in ("/health", "/v1/models"):
        assert (await call(app, "GET", path)).status == 200
    assert (await call(app, "POST", "/tokenize", {"prompt": "hi"})).status == 200
    stats = await _stats(app)
    assert stats["phase"] == "asleep"
    assert (stats["weights_gpu_bytes"], stats["weights_host_bytes"]) == (0, 1000)

    assert (await _post(app, "/wake_up")).status == 200
    assert waits == [0.2, 0.7]
    assert (await call(app, "POST", "/v1/chat/completions", CHAT)).status == 200
    stats = await _stats(app)
    assert (stats["sleeps"], stats["wakes"], stats["weights_gpu_bytes"]) == (1, 1, 1000)


async def test_level_2_discards_weights_and_wake_reloads_them() -> None:
    waits: list[float] = []
    app = _sleepy_app(waits, sleep_time=0.1, wake_time=0.5, weights_bytes=1000)
    assert (await _post(app, "/sleep", b"level=2")).status == 200
    stats = await _stats(app)
    assert (stats["level"], stats["weights_gpu_bytes"], stats["weights_host_bytes"]) == (2, 0, 0)
    assert (await _post(app, "/wake_up")).status == 200
    assert waits == [0.1, 0.5]


async def test_sleep_is_idempotent_and_wake_of_awake_engine_is_a_no_op() -> None:
    waits: list[float] = []
    app = _sleepy_app(waits)
    assert (await _post(app, "/wake_up")).status == 200
    assert waits == []
    assert (await _post(app, "/sleep")).status == 200
    assert (await _post(app, "/sleep")).status == 200
    assert len(waits) == 1
    assert (await _stats(app))["level"] == 1


async def test_bad_level_is_400_and_wrong_method_405() -> None:
    app = _sleepy_app([])
    reply = await _post(app, "/sleep", b"level=3")
    assert reply.status == 400
    assert "level must be 1 or 2" in reply.json()["error"]["message"]
    assert (await call(app, "GET", "/is_sleeping")).json() == {"is_sleeping": False}
    assert (await call(app, "GET", "/sleep")).status == 405
