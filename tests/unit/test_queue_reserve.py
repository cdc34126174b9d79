"""The queue's reserve: a model's last places are kept for keys under their fair share."""

from __future__ import annotations

import asyncio

from llmgw.router.endpoints import EjectionPolicy, EndpointPool, EndpointSpec
from llmgw.router.queue import RequestQueue, Ticket
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


async def test_a_flood_leaves_the_reserve_and_a_light_key_finds_it_free() -> None:
    model = Model(limit=10)
    await model.send("light0", "light")
    await model.finish("light0")
    for i in range(20):
        await model.send(f"flood{i}", "flood")
    # One place in ten is kept: the flood fills nine, the rest wait.
    assert len(model.running) == 9
    assert model.queue.describe(MODEL)["reserve"] == 1
    await model.send("light1", "light")
    assert model.waits["light1"] == 0.0
    assert len(model.running) == 10
    # A flood request ending frees a place the flood may not take back: the
    # light key's next request finds it.
    await model.finish("flood0")
    assert len(model.running) == 9
    await model.send("light2", "light")
    assert model.running[-1] == "light2" and model.waits["light2"] == 0.0
    await model.close()


async def test_a_light_request_waiting_behind_the_flood_takes_the_reserve_first() -> None:
    model = Model(limit=10)
    await model.send("light0", "light")
    for i in range(20):
        await model.send(f"flood{i}", "flood")
    await model.send("light1", "light")  # takes the reserve
    await model.send("light2", "light")  # the model is full: it waits with the flood
    assert len(model.running) == 10 and "light2" not in model.running
    await model.finish("flood0")
    # The place freed is the reserve again (9 in flight): the light key is under
    # its share of 5, the flood over it.
    assert model.running[-1] == "light2"
    await model.close()


async def test_a_key_alone_fills_every_place() -> None:
    model = Model(limit=10)
    for i in range(12):
        await model.send(f"flood{i}", "flood")
    assert len(model.running) == 10
    await model.close()


async def test_the_reserve_is_released_once_the_other_keys_go_quiet() -> None:
    model = Model(limit=10)
    await model.send("light0", "light")
    await model.finish("light0")
    for i in range(12):
        await model.send(f"flood{i}", "flood")
    assert len(model.running) == 9
    model.clock.now = 61.0  # the light key was last seen over a minute ago
    await model.send("flood12", "flood")
    assert len(model.running) == 10
    await model.close()


async def test_weights_set_the_share_and_small_models_keep_no_reserve() -> None:
    model = Model(limit=10)
    await model.send("light0", "light", weight=1.0)
    await model.finish("light0")
    # Weight 9 of 10: a share of 9 places; at 9 in flight it is over it.
    for i in range(12):
        await model.send(f"heavy{i}", "heavy", weight=9.0)
    assert len(model.running) == 9
    await model.close()
    # One place: nothing is kept, so two keys still take turns at it.
    tiny = Model(limit=1)
    await tiny.send("light0", "light")
    await tiny.finish("light0")
    await tiny.send("flood0", "flood")
    assert tiny.running == ["flood0"]
    assert tiny.queue.describe(MODEL)["reserve"] == 0
    await tiny.close()


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
    await model.send("light0", "light")
    for i in range(20):
        await model.send(f"flood{i}", "flood")
    await model.send("light1", "light")  # takes the reserve
    # A light request waiting is cancelled (its client left): it is no longer
    # counted, and the flood still may not take the reserve when a place frees.
    await model.send("light2", "light")
    model.tasks[-1].cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert model.queue.describe(MODEL)["waiting"] == 20 - 8
    await model.finish("flood0")
    assert len(model.running) == 9
    await model.send("light3", "light")
    assert model.running[-1] == "light3" and model.waits["light3"] == 0.0
    await model.close()
