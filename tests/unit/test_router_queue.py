"""The saturation detector and the per-model fair queue, on the event loop."""

from __future__ import annotations

import asyncio
import random
from collections.abc import MutableMapping
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from llmgw.config import RouterConfig
from llmgw.metrics import RouterMetrics
from llmgw.metrics.queue import QueueMetrics
from llmgw.router.balancer import Balancer
from llmgw.router.endpoints import EjectionPolicy, EndpointPool, EndpointSpec
from llmgw.router.errors import InvalidRequest
from llmgw.router.proxy import Proxy
from llmgw.router.queue import QueueRefused, RequestQueue, Ticket, ticket_for
from llmgw.router.requests import CHAT, parse_request
from llmgw.router.saturation import EngineLoad, Saturation
from llmgw.router.upstream import Upstream

MODEL = "m"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Loads:
    def __init__(self) -> None:
        self.reports: dict[str, EngineLoad] = {}

    def load(self, endpoint_id: str) -> EngineLoad | None:
        return self.reports.get(endpoint_id)


def _pool(clock: Clock, count: int = 1) -> EndpointPool:
    pool = EndpointPool(policy=EjectionPolicy(3, 1.0, 8.0), clock=clock)
    pool.set_model_endpoints(
        MODEL,
        [EndpointSpec(f"e{i}", f"http://127.0.0.1:{9000 + i}", (MODEL,)) for i in range(count)],
    )
    return pool


def _queue(
    pool: EndpointPool,
    clock: Clock,
    *,
    limit: int | None = 1,
    max_size: int = 100,
    aging: float = 0.0,
    load: Loads | None = None,
    registry: CollectorRegistry | None = None,
) -> RequestQueue:
    saturation = Saturation(
        pool=pool, clock=clock, default_limit=limit, load=load, max_waiting=2, max_kv_cache=0.9
    )
    return RequestQueue(
        saturation=saturation,
        clock=clock,
        max_size=max_size,
        aging=aging,
        recheck=60.0,
        retry_after=7,
        metrics=QueueMetrics(registry=registry) if registry is not None else None,
    )


class Fleet:
    """Requests that hold a place on endpoint e0 until released, in the order let out."""

    def __init__(self, pool: EndpointPool, queue: RequestQueue) -> None:
        self.endpoint = pool.by_model[MODEL][0]
        self.queue = queue
        self.order: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def _run(self, name: str, ticket: Ticket) -> None:
        await self.queue.wait_turn(MODEL, ticket, keepalive=None, interval=60.0)
        self.endpoint.in_flight += 1  # the proxy's dispatch
        self.order.append(name)

    def send(self, name: str, ticket: Ticket) -> asyncio.Task[None]:
        task = asyncio.ensure_future(self._run(name, ticket))
        self.tasks.append(task)
        return task

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    async def finish_one(self) -> None:
        self.endpoint.in_flight -= 1
        self.queue.done(MODEL, "k")
        await self.settle()


async def test_nothing_known_never_holds_back() -> None:
    clock = Clock()
    pool = _pool(clock)
    queue = _queue(pool, clock, limit=None)
    pool.by_model[MODEL][0].in_flight = 10_000
    assert await queue.wait_turn(MODEL, Ticket("k"), keepalive=None, interval=1) == 0.0
    # A model without any replica is not saturated either (activation decides).
    assert await queue.wait_turn("other", Ticket("k"), keepalive=None, interval=1) == 0.0


async def test_saturated_model_lets_requests_out_one_per_free_place_in_order() -> None:
    clock = Clock()
    pool = _pool(clock)
    fleet = Fleet(pool, _queue(pool, clock, limit=2))
    for name in "abcd":
        fleet.send(name, Ticket("k"))
    await fleet.settle()
    assert fleet.order == ["a", "b"]
    assert fleet.queue.describe(MODEL)["waiting"] == 2
    await fleet.finish_one()
    assert fleet.order == ["a", "b", "c"]
    await fleet.finish_one()
    assert fleet.order == ["a", "b", "c", "d"]
    assert fleet.queue.describe(MODEL)["waiting"] == 0


async def test_higher_class_goes_first_and_a_header_only_lowers() -> None:
    clock = Clock()
    pool = _pool(clock)
    fleet = Fleet(pool, _queue(pool, clock))
    fleet.send("first", Ticket("k"))
    await fleet.settle()
    fleet.send("batch", Ticket("b", priority="batch"))
    fleet.send("default", Ticket("d"))
    fleet.send("interactive", Ticket("i", priority="interactive"))
    await fleet.settle()
    for _ in range(3):
        await fleet.finish_one()
    assert fleet.order == ["first", "interactive", "default", "batch"]


async def test_ageing_lets_a_long_waiting_lower_class_through() -> None:
    clock = Clock()
    pool = _pool(clock)
    fleet = Fleet(pool, _queue(pool, clock, aging=10.0))
    fleet.send("first", Ticket("k"))
    await fleet.settle()
    fleet.send("batch", Ticket("b", priority="batch"))
    await fleet.settle()
    clock.now = 31.0  # three classes' worth of waiting: it now counts above interactive
    fleet.send("interactive", Ticket("i", priority="interactive"))
    await fleet.settle()
    await fleet.finish_one()
    assert fleet.order == ["first", "batch"]


async def test_a_flooding_key_gets_its_share_not_more() -> None:
    clock = Clock()
    pool = _pool(clock)
    fleet = Fleet(pool, _queue(pool, clock))
    fleet.send("hold", Ticket("x"))
    await fleet.settle()
    for i in range(10):
        fleet.send(f"flood{i}", Ticket("flood"))
    await fleet.settle()
    fleet.send("light0", Ticket("light"))
    fleet.send("light1", Ticket("light"))
    await fleet.settle()
    for _ in range(4):
        await fleet.finish_one()
    # Alternating from the light key's arrival on, though the flood queued first.
    assert fleet.order == ["hold", "flood0", "light0", "flood1", "light1"]


async def test_weights_give_proportional_shares() -> None:
    clock = Clock()
    pool = _pool(clock)
    fleet = Fleet(pool, _queue(pool, clock))
    fleet.send("hold", Ticket("x"))
    await fleet.settle()
    for i in range(6):
        fleet.send(f"heavy{i}", Ticket("heavy", weight=2.0))
        fleet.send(f"light{i}", Ticket("light", weight=1.0))
    await fleet.settle()
    for _ in range(6):
        await fleet.finish_one()
    served = fleet.order[1:]
    assert sum(name.startswith("heavy") for name in served) == 4
    assert sum(name.startswith("light") for name in served) == 2
    for task in fleet.tasks:
        task.cancel()
    await asyncio.gather(*fleet.tasks, return_exceptions=True)


async def test_token_shares_let_more_short_requests_through() -> None:
    clock = Clock()
    pool = _pool(clock)
    saturation = Saturation(pool=pool, clock=clock, default_limit=1)
    queue = RequestQueue(
        saturation=saturation,
        clock=clock,
        max_size=100,
        aging=0,
        recheck=60,
        retry_after=7,
        share="tokens",
    )
    endpoint = pool.by_model[MODEL][0]
    endpoint.in_flight = 1
    order: list[str] = []

    async def one(name: str, key: str, tokens: int) -> None:
        await queue.wait_turn(
            MODEL, Ticket(key), keepalive=None, interval=60, tokens=lambda: tokens
        )
        endpoint.in_flight += 1
        order.append(name)

    tasks = [asyncio.ensure_future(one(f"long{i}", "long", 4000)) for i in range(3)]
    tasks += [asyncio.ensure_future(one(f"short{i}", "short", 1000)) for i in range(10)]
    for _ in range(5):
        await asyncio.sleep(0)
    for _ in range(10):
        endpoint.in_flight -= 1
        queue.done(MODEL, "k")
        for _ in range(5):
            await asyncio.sleep(0)
    # Equal tokens: four short requests for each long one (by requests: five each).
    assert sum(name.startswith("short") for name in order) == 8
    assert sum(name.startswith("long") for name in order) == 2
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_full_queue_refuses_at_once_with_retry_after() -> None:
    clock = Clock()
    pool = _pool(clock)
    registry = CollectorRegistry()
    fleet = Fleet(pool, _queue(pool, clock, max_size=2, registry=registry))
    for name in "abc":
        fleet.send(name, Ticket("k"))
    await fleet.settle()
    with pytest.raises(QueueRefused) as info:
        await fleet.queue.wait_turn(MODEL, Ticket("k"), keepalive=None, interval=60)
    error = info.value
    assert error.status == 429
    assert error.code == "queue_full"
    assert (b"retry-after", b"7") in error.headers()
    assert "2 requests waiting" in error.message
    assert (
        registry.get_sample_value(
            "llmgw_queue_refused_total",
            {"model": MODEL, "class": "default", "reason": "queue_full"},
        )
        == 1.0
    )
    assert registry.get_sample_value("llmgw_queue_depth", {"model": MODEL, "class": "default"}) == 2
    for task in fleet.tasks:
        task.cancel()
    await asyncio.gather(*fleet.tasks, return_exceptions=True)


async def test_wait_budget_runs_out_with_a_429_naming_the_queue_length() -> None:
    loop = asyncio.get_running_loop()
    pool = _pool(Clock())
    saturation = Saturation(pool=pool, clock=loop.time, default_limit=1)
    queue = RequestQueue(
        saturation=saturation, clock=loop.time, max_size=10, aging=0, recheck=60, retry_after=3
    )
    pool.by_model[MODEL][0].in_flight = 1
    with pytest.raises(QueueRefused) as info:
        await queue.wait_turn(MODEL, Ticket("k", max_wait=0.05), keepalive=None, interval=60)
    assert info.value.code == "queue_wait_expired"
    assert "wait budget of 0.05 s (1 requests waiting" in info.value.message
    assert queue.describe(MODEL)["waiting"] == 0


async def test_streams_get_keepalives_while_waiting() -> None:
    loop = asyncio.get_running_loop()
    pool = _pool(Clock())
    saturation = Saturation(pool=pool, clock=loop.time, default_limit=1)
    queue = RequestQueue(
        saturation=saturation, clock=loop.time, max_size=10, aging=0, recheck=60, retry_after=3
    )
    pool.by_model[MODEL][0].in_flight = 1
    beats: list[int] = []

    async def keepalive(waiting: int) -> None:
        beats.append(waiting)
        if len(beats) == 3:
            pool.by_model[MODEL][0].in_flight = 0
            queue.done(MODEL, "k")

    waited = await queue.wait_turn(MODEL, Ticket("k"), keepalive=keepalive, interval=0.01)
    assert beats == [1, 1, 1]
    assert waited > 0


async def test_a_cancelled_waiter_leaves_at_once() -> None:
    clock = Clock()
    pool = _pool(clock)
    registry = CollectorRegistry()
    fleet = Fleet(pool, _queue(pool, clock, registry=registry))
    fleet.send("hold", Ticket("k"))
    gone = fleet.send("gone", Ticket("k"))
    fleet.send("next", Ticket("k"))
    await fleet.settle()
    gone.cancel()
    await fleet.settle()
    assert fleet.queue.describe(MODEL)["waiting"] == 1
    assert (
        registry.get_sample_value(
            "llmgw_queue_abandoned_total", {"model": MODEL, "class": "default"}
        )
        == 1.0
    )
    await fleet.finish_one()
    assert fleet.order == ["hold", "next"]


async def test_engine_reports_saturate_and_free_replicas() -> None:
    clock = Clock()
    pool = _pool(clock, count=2)
    loads = Loads()
    saturation = Saturation(
        pool=pool, clock=clock, default_limit=None, load=loads, max_waiting=2, max_kv_cache=0.9
    )
    assert saturation.room(MODEL) == float("inf")
    loads.reports["e0"] = EngineLoad(waiting=5)
    assert saturation.room(MODEL) == float("inf")  # e1: nothing known, room
    loads.reports["e1"] = EngineLoad(kv_cache=0.95)
    assert saturation.room(MODEL) <= 0
    assert saturation.describe(MODEL)["saturated"] is True
    loads.reports["e1"] = EngineLoad(kv_cache=0.5, waiting=0)
    assert saturation.with_room(MODEL, pool.by_model[MODEL]) == [pool.by_model[MODEL][1]]


def test_saturation_limits_come_from_endpoint_then_model_then_default() -> None:
    clock = Clock()
    pool = _pool(clock, count=2)
    e0, e1 = pool.by_model[MODEL]
    saturation = Saturation(
        pool=pool,
        clock=clock,
        default_limit=8,
        endpoint_limits={"e0": 2},
        model_limit=lambda name: 4 if name == MODEL else None,
    )
    assert saturation.limit(e0, MODEL) == 2
    assert saturation.limit(e1, MODEL) == 4
    assert saturation.limit(e1, "other") == 8
    e0.in_flight, e1.in_flight = 2, 1
    assert saturation.room(MODEL) == 3
    assert saturation.room(MODEL, reserved=3) == 0
    assert saturation.with_room(MODEL, [e0, e1]) == [e1]


def test_headers_lower_the_class_and_the_wait_never_raise_them() -> None:
    def ticket(*headers: tuple[bytes, bytes]) -> Ticket:
        return ticket_for(key="k", priority="default", weight=1, max_wait=30, headers=headers)

    assert ticket((b"x-llmgw-priority", b"batch")).priority == "batch"
    assert ticket((b"x-llmgw-priority", b"interactive")).priority == "default"
    assert ticket((b"x-llmgw-max-queue-wait", b"5")).max_wait == 5
    assert ticket((b"x-llmgw-max-queue-wait", b"90")).max_wait == 30
    assert ticket((b"x-stainless-timeout", b"12")).max_wait == 12
    assert ticket((b"x-stainless-timeout", b"soon")).max_wait == 30
    with pytest.raises(InvalidRequest) as info:
        ticket((b"x-llmgw-priority", b"urgent"))
    assert info.value.param == "x-llmgw-priority"
    assert "interactive, default, batch" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        ticket((b"x-llmgw-max-queue-wait", b"-1"))
    assert info.value.param == "x-llmgw-max-queue-wait"


class Demand:
    """An activator that only counts the requests it is told about."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0
        self.full: list[str] = []

    def knows(self, model: str) -> bool:
        return True

    def engines(self, model: str) -> tuple[str, ...]:
        return ()

    async def activate(self, model: str) -> None:
        return None

    def request_started(self, model: str) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def activity(self, model: str) -> str:
        return f"is starting model {model}"

    def request_finished(self, model: str) -> None:
        self.in_flight -= 1

    def saturated(self, model: str) -> None:
        self.full.append(model)


async def test_a_queued_request_counts_as_demand_and_a_stream_gets_its_refusal_as_an_event() -> (
    None
):
    loop = asyncio.get_running_loop()
    pool = _pool(Clock())
    pool.by_model[MODEL][0].in_flight = 1
    saturation = Saturation(pool=pool, clock=loop.time, default_limit=1)
    queue = RequestQueue(
        saturation=saturation, clock=loop.time, max_size=10, aging=0, recheck=60, retry_after=3
    )
    demand = Demand()
    proxy = Proxy(
        pool=pool,
        balancer=Balancer(clock=loop.time, rng=random.Random(0)),
        upstream=Upstream(connect_timeout=1, idle_timeout=1),
        metrics=RouterMetrics(registry=CollectorRegistry()),
        config=RouterConfig(),
        clock=loop.time,
        activator=demand,
        activation_keepalive=0.01,
        queue=queue,
        saturation=saturation,
    )
    sent: list[dict[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))
        assert demand.in_flight == 1  # counted while it waits

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    req = parse_request(CHAT, orjson.dumps(body))
    outcome = await proxy.handle(req, b"r", send, loop.time(), [], ticket=Ticket("k", max_wait=0.1))
    assert outcome.status == 429
    assert demand.peak == 1 and demand.in_flight == 0
    # The control plane was told the model is full (an adapter would be spread).
    assert demand.full == [MODEL]
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert any(b": llmgw queued for model m (1 waiting)" in m.get("body", b"") for m in sent)
    last = sent[-1]["body"]
    assert last.startswith(b"event: error\ndata: ") and b"queue_wait_expired" in last


async def test_room_that_appears_without_a_request_ending_lets_waiters_out() -> None:
    """An engine's load report clears (no request ended): the model's one recheck
    timer lets every waiter out, and it stops once nobody waits."""
    loop = asyncio.get_running_loop()
    pool = _pool(Clock(), count=1)
    loads = Loads()
    loads.reports["e0"] = EngineLoad(waiting=5)  # over max_waiting: saturated
    saturation = Saturation(
        pool=pool, clock=loop.time, default_limit=None, load=loads, max_waiting=2
    )
    queue = RequestQueue(
        saturation=saturation, clock=loop.time, max_size=50, aging=0, recheck=0.05, retry_after=3
    )
    before = len(asyncio.all_tasks())
    waiters = [
        asyncio.ensure_future(
            queue.wait_turn(MODEL, Ticket(f"k{i}"), keepalive=None, interval=60.0)
        )
        for i in range(20)
    ]
    for _ in range(5):
        await asyncio.sleep(0)
    assert queue.describe(MODEL)["waiting"] == 20
    # The 20 waiters and one timer for the model, not one per waiter.
    assert len(asyncio.all_tasks()) == before + 20 + 1
    loads.reports["e0"] = EngineLoad(waiting=0)
    waited = await asyncio.wait_for(asyncio.gather(*waiters), 30)
    assert all(w > 0 for w in waited)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before
