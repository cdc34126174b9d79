"""The shared prefix index: its wire format, two balancers learning from each other, and
the publisher and subscriber against the real Redis (and a Redis that is not there)."""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Callable, Sequence

import orjson
import pytest
from prometheus_client import CollectorRegistry

from llmgw.config.routing import RoutingConfig
from llmgw.metrics.routing import RoutingMetrics
from llmgw.router.balancer import Balancer, build_scorers
from llmgw.router.endpoints import EjectionPolicy, Endpoint, EndpointSpec
from llmgw.router.requests import CHAT, parse_request
from llmgw.router.scoring.load import LoadBook
from llmgw.router.scoring.prefix import PrefixIndex
from llmgw.router.scoring.share import PrefixShare, decode_batch, encode_batch

REDIS_URL = "redis://127.0.0.1:6379/0"


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def endpoints(clock: Clock, n: int = 4) -> list[Endpoint]:
    policy = EjectionPolicy(failure_threshold=3, base=1.0, maximum=8.0)
    return [
        Endpoint(EndpointSpec(f"ep-{i}", f"http://h{i}", ("m",)), policy=policy, clock=clock)
        for i in range(n)
    ]


def router(clock: Clock, publish: list[tuple[str, Sequence[int], bool]] | None = None) -> Balancer:
    routing = RoutingConfig()
    book = LoadBook(clock=clock, stale_after=5.0)
    index = PrefixIndex(capacity=routing.index_blocks, ttl=routing.index_ttl, clock=clock)
    return Balancer(
        clock=clock,
        rng=random.Random(0),
        routing=routing,
        scorers=build_scorers(routing, book=book, clock=clock, index=index),
        book=book,
        index=index,
        publish=(lambda *entry: publish.append(entry)) if publish is not None else None,
    )


def prompt(group: int, user: str) -> bytes:
    system = f"You help the people of group {group} with their questions. " * 40
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return orjson.dumps({"model": "m", "messages": messages})


def test_batches_round_trip_and_malformed_ones_are_refused() -> None:
    sender = b"12345678"
    entries = [("ep-1", [0, 1, 2**64 - 1], True), ("gpu-é", [], False), ("r", [42] * 300, False)]
    assert decode_batch(encode_batch(sender, entries)) == (sender, entries)
    assert decode_batch(sender) == (sender, [])
    data = encode_batch(sender, entries)
    for broken in (b"short", data[:-1], data[:12]):
        with pytest.raises(ValueError):
            decode_batch(broken)


def test_a_router_that_applies_anothers_placements_sends_its_groups_to_the_same_replicas() -> None:
    clock = Clock()
    sent: list[tuple[str, Sequence[int], bool]] = []
    first, second = router(clock, sent), router(clock)
    eps_a, eps_b = endpoints(clock), endpoints(clock)
    placed = {}
    for group in range(12):
        chosen = first.pick(eps_a, (), first.route(parse_request(CHAT, prompt(group, "hi"))))
        assert chosen is not None
        placed[group] = chosen.id
    # Every placement is published; the first of each group is a new prefix.
    assert [new for _, _, new in sent] == [True] * 12
    for endpoint_id, chain, new in sent:
        second.learn(endpoint_id, chain, new)
    for group in range(12):
        route = second.route(parse_request(CHAT, prompt(group, "and another question")))
        route.explain = True
        chosen = second.pick(eps_b, (), route)
        assert chosen is not None and chosen.id == placed[group], route.explanation
        assert route.chosen_scores["prefix"] > 0.5


async def test_routers_share_placements_through_redis_and_ignore_their_own() -> None:
    channel = f"llmgw:test:{secrets.token_hex(4)}"
    registry = CollectorRegistry()
    metrics = RoutingMetrics(registry=registry)
    one = PrefixShare(redis_url=REDIS_URL, channel=channel, interval=0.01, metrics=metrics)
    two = PrefixShare(redis_url=REDIS_URL, channel=channel, interval=0.01)
    got_one: list[tuple[str, tuple[int, ...], bool]] = []
    got_two: list[tuple[str, tuple[int, ...], bool]] = []
    seen_one, seen_two = asyncio.Event(), asyncio.Event()

    def collect(
        into: list[tuple[str, tuple[int, ...], bool]], seen: asyncio.Event
    ) -> Callable[[str, Sequence[int], bool], None]:
        def apply(endpoint_id: str, chain: Sequence[int], new: bool) -> None:
            into.append((endpoint_id, tuple(chain), new))
            seen.set()

        return apply

    tasks = [
        asyncio.create_task(one.run(collect(got_one, seen_one))),
        asyncio.create_task(two.run(collect(got_two, seen_two))),
    ]
    try:
        # Subscribing takes a moment: send until the other side has seen one.
        async with asyncio.timeout(30):
            while not seen_two.is_set():
                one.note("ep-1", [1, 2, 3], True)
                await asyncio.sleep(0.05)
        two.note("ep-2", [7], False)
        async with asyncio.timeout(30):
            await seen_one.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert set(got_two) == {("ep-1", (1, 2, 3), True)}
    assert got_one == [("ep-2", (7,), False)]
    sent = registry.get_sample_value("llmgw_route_index_shared_total", {"outcome": "sent"})
    applied = registry.get_sample_value("llmgw_route_index_shared_total", {"outcome": "applied"})
    assert sent is not None and sent >= 1 and applied == 1


async def test_without_redis_placements_are_dropped_and_noting_stays_an_append(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    share = PrefixShare(
        redis_url="redis://127.0.0.1:1/0",
        channel="llmgw:test:down",
        interval=0.01,
        max_pending=3,
        reconnect=0.05,
        metrics=RoutingMetrics(registry=registry),
    )
    for i in range(5):
        share.note("ep-1", [i], False)  # two over the backlog's bound
    task = asyncio.create_task(share.run(lambda *entry: None))
    try:
        async with asyncio.timeout(30):
            while True:
                dropped = registry.get_sample_value(
                    "llmgw_route_index_shared_total", {"outcome": "dropped"}
                )
                if dropped is not None and dropped >= 5:
                    break
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    # Logged once per direction, not once per batch or reconnect.
    assert sum("Redis publish failed" in m for m in warnings) == 1, warnings
    assert sum("Redis subscribe failed" in m for m in warnings) == 1, warnings
    assert all("own index until Redis answers again" in m for m in warnings)
