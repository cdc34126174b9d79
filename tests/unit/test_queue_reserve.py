"""The queue's reserve: a model's last places are kept for keys under their fair share."""

from __future__ import annotations

import asyncio
import math

import pytest

from llmgw.router.endpoints import EjectionPolicy, EndpointPool, EndpointSpec
from llmgw.router.queue import RequestQueue, Ticket, reserve_miss
from llmgw.router.saturation import Saturation

MODEL = "m"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Model:
    """One replica with `limit` places; requests hold a place until `finish`."""

    def __init__(self, *, limit: int | None = 10, reserve: float = 0.1) -> None:
        self.clock = Clock()
        pool = EndpointPool(policy=EjectionPolicy(3, 1.0, 8.0), clock=self.clock)
        pool.set_model_endpoints(MODEL, [EndpointSpec("e0", "http://127.0.0.1:9000", (MODEL,))])
        self.endpoint = pool.by_model[MODEL][0]
        saturation = Saturation(pool=pool, clock=self.clock, default_limit=limit)
        self.queue = RequestQueue(
            saturation=saturation,
            clock=self.clock,
            max_size=1000,
            aging=0,
            recheck=60,
            retry_after=5,
            reserve=reserve,
            active_for=60,
        )
        self.running: list[str] = []
        self.waits: dict[str, float] = {}
        self.tasks: list[asyncio.Task[None]] = []

    async def _one(self, name: str, ticket: Ticket) -> None:
        self.waits[name] = await self.queue.wait_turn(MODEL, ticket, keepalive=None, interval=60)
        self.endpoint.in_flight += 1
        self.running.append(name)

    async def send(self, name: str, key: str, **kw: object) -> None:
        self.tasks.append(asyncio.ensure_future(self._one(name, Ticket(key, **kw))))  # type: ignore[arg-type]
        for _ in range(5):
            await asyncio.sleep(0)

    async def finish(self, name: str) -> None:
        self.running.remove(name)
        self.endpoint.in_flight -= 1
        self.queue.done(MODEL, name.rstrip("0123456789"))
        for _ in range(5):
            await asyncio.sleep(0)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def flood_then_light(model: Model, floods: int = 20) -> None:
    """The flood fills every place (nobody else has asked: nothing is kept), then
    a light request comes, waits for one flood request to end and takes its place."""
    for i in range(floods):
        await model.send(f"flood{i}", "flood")
    assert len(model.running) == 10
    assert model.queue.describe(MODEL)["reserve"] == 0
    await model.send("light0", "light")
    assert "light0" not in model.running
    await model.finish("flood0")
    assert model.running[-1] == "light0"


async def test_a_flood_leaves_the_reserve_and_a_light_key_finds_it_free() -> None:
    model = Model(limit=10)
    await flood_then_light(model)
    # A light key came: one place in ten is kept now. A flood request ending frees
    # a place the flood may not take back.
    assert model.queue.describe(MODEL)["reserve"] == 1
    await model.finish("flood1")
    assert len(model.running) == 9
    await model.send("light1", "light")
    assert model.running[-1] == "light1" and model.waits["light1"] == 0.0
    assert len(model.running) == 10
    await model.finish("flood2")
    assert len(model.running) == 9
    await model.send("light2", "light")
    assert model.running[-1] == "light2" and model.waits["light2"] == 0.0
    await model.close()


async def test_a_light_request_waiting_behind_the_flood_takes_the_reserve_first() -> None:
    model = Model(limit=10)
    await flood_then_light(model)
    await model.send("light1", "light")  # the model is full: it waits with the flood
    assert len(model.running) == 10 and "light1" not in model.running
    await model.finish("flood1")
    # The place freed is the reserve: the light key is under its share of 5, the
    # flood over it.
    assert model.running[-1] == "light1"
    await model.close()


async def test_a_key_alone_fills_every_place() -> None:
    model = Model(limit=10)
    for i in range(12):
        await model.send(f"flood{i}", "flood")
    assert len(model.running) == 10
    await model.close()


async def test_the_reserve_is_released_once_the_other_keys_go_quiet() -> None:
    model = Model(limit=10)
    await flood_then_light(model)
    await model.finish("light0")
    await model.finish("flood1")
    assert len(model.running) == 9  # the freed place is kept
    model.clock.now = 61.0  # the light key was last seen over a minute ago
    await model.send("flood20", "flood")
    assert len(model.running) == 10
    assert model.queue.describe(MODEL)["reserve"] == 0
    await model.close()


async def test_weights_set_the_share_and_small_models_keep_no_reserve() -> None:
    model = Model(limit=10)
    for i in range(12):
        await model.send(f"heavy{i}", "heavy", weight=9.0)
    await model.send("light0", "light", weight=1.0)
    await model.finish("heavy0")
    assert model.running[-1] == "light0"
    # Weight 9 of 10: a share of 9 places; holding 9 it is over it.
    await model.finish("light0")
    assert len(model.running) == 9
    await model.finish("heavy1")
    assert len(model.running) == 9  # holding 8, it was under: it took the place
    await model.close()
    # One place: nothing is kept, so two keys still take turns at it.
    tiny = Model(limit=1)
    await tiny.send("flood0", "flood")
    await tiny.send("light0", "light")
    await tiny.finish("flood0")
    assert tiny.running == ["light0"]
    await tiny.send("flood1", "flood")
    await tiny.finish("light0")
    assert tiny.running == ["flood1"]
    assert tiny.queue.describe(MODEL)["reserve"] == 0
    await tiny.close()


async def test_as_many_places_are_kept_as_light_requests_need() -> None:
    """Places kept follow how often under-share requests come per request that
    ends: rarely, one place; as often as requests end, the most (reserve 0.1 of 30
    places: 3)."""
    model = Model(limit=30)
    for i in range(40):
        await model.send(f"flood{i}", "flood")
    await model.send("light0", "light")
    sent = 40

    async def end_one_flood() -> None:
        nonlocal sent
        await model.finish(next(n for n in model.running if n.startswith("flood")))
        await model.send(f"flood{sent}", "flood")
        sent += 1

    light = 1
    for second in range(1, 21):  # 20 s: 6 flood requests end a second
        model.clock.now = float(second)
        if second % 10 == 0:
            await model.send(f"light{light}", "light")
            light += 1
        for _ in range(6):
            await end_one_flood()
    described = model.queue.describe(MODEL)
    assert described["reserve_max"] == 3
    # A light request every 10 s, 60 endings in between: one place is kept.
    assert described["reserve"] == 1
    # Now one light request comes for every request that ends: all three are kept.
    for second in range(21, 41):
        model.clock.now = float(second)
        for _ in range(3):
            await model.send(f"light{light}", "light")
            light += 1
            await end_one_flood()
            for name in [n for n in model.running if n.startswith("light")]:
                await model.finish(name)  # the light key stays under its share
    assert model.queue.describe(MODEL)["reserve"] == 3
    await model.close()


def test_the_share_of_takers_that_find_every_kept_place_taken() -> None:
    # M/M/1/K blocking: (1 - r) r^K / (1 - r^(K+1)).
    assert reserve_miss(0.3, 1) == pytest.approx(0.7 * 0.3 / (1 - 0.09))
    assert reserve_miss(0.3, 2) == pytest.approx(0.7 * 0.09 / (1 - 0.027))
    assert reserve_miss(1.0, 3) == pytest.approx(0.25)
    assert reserve_miss(2.0, 1) == pytest.approx(2 / 3)
    assert reserve_miss(0.0, 1) == 0.0
    assert reserve_miss(math.inf, 4) == 1.0


async def test_no_reserve_when_a_replica_has_no_limit() -> None:
    model = Model(limit=None)
    await model.send("light0", "light")
    await model.finish("light0")
    for i in range(30):
        await model.send(f"flood{i}", "flood")
    assert len(model.running) == 30
    assert model.queue.describe(MODEL)["reserve"] == 0
    await model.close()


async def test_a_cancelled_request_gives_its_key_place_back() -> None:
    model = Model(limit=10)
    await flood_then_light(model)
    # A light request waiting is cancelled (its client left): it is no longer
    # counted, and the flood still may not take the reserve when a place frees.
    await model.send("light1", "light")
    model.tasks[-1].cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert model.queue.describe(MODEL)["waiting"] == 10
    await model.finish("flood1")
    assert len(model.running) == 9
    await model.send("light2", "light")
    assert model.running[-1] == "light2" and model.waits["light2"] == 0.0
    await model.close()
