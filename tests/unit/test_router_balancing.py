"""Balancer choices and passive ejection, in virtual time."""

from __future__ import annotations

import random
from collections import Counter

from llmgw.router.balancer import Balancer
from llmgw.router.endpoints import (
    EjectionPolicy,
    Endpoint,
    EndpointPool,
    EndpointSpec,
    publish_static,
)
from llmgw.router.scoring import RouteRequest


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(n: int, clock: FakeClock, threshold: int = 2) -> list[Endpoint]:
    policy = EjectionPolicy(failure_threshold=threshold, base=1.0, maximum=8.0)
    return [
        Endpoint(EndpointSpec(f"e{i}", f"http://h{i}", ("m",)), policy=policy, clock=clock)
        for i in range(n)
    ]


def test_two_choices_prefer_the_less_loaded() -> None:
    clock = FakeClock()
    eps = make(2, clock)
    eps[0].in_flight = 5
    balancer = Balancer(clock=clock, rng=random.Random(1))
    assert {balancer.pick(eps, ()) for _ in range(50)} == {eps[1]}


def test_load_spreads_over_equal_endpoints() -> None:
    clock = FakeClock()
    eps = make(4, clock)
    balancer = Balancer(clock=clock, rng=random.Random(7))
    picks: Counter[str] = Counter()
    for _ in range(400):
        ep = balancer.pick(eps, ())
        assert ep is not None
        ep.in_flight += 1  # requests stay in flight: the balancer must spread them
        picks[ep.id] += 1
    assert set(picks) == {"e0", "e1", "e2", "e3"}
    assert max(picks.values()) - min(picks.values()) <= 2


def test_excluded_and_unhealthy_endpoints_are_skipped() -> None:
    clock = FakeClock()
    eps = make(3, clock)
    eps[1].probe_ok = False
    balancer = Balancer(clock=clock, rng=random.Random(0))
    assert balancer.pick(eps, [eps[0]]) is eps[2]
    assert balancer.pick(eps, [eps[0], eps[2]]) is None


def test_ejection_after_threshold_and_backed_off_readmission() -> None:
    clock = FakeClock()
    (ep,) = make(1, clock, threshold=2)
    ep.record_failure("boom")
    assert ep.available(clock())
    ep.record_failure("boom")
    assert not ep.available(clock())
    clock.now += 1.0
    assert ep.available(clock())  # re-admitted after the first ejection (1 s)
    ep.record_failure("again")
    ep.record_failure("again")
    clock.now += 1.5
    assert not ep.available(clock())  # second ejection lasts 2 s
    clock.now += 0.5
    assert ep.available(clock())
    ep.record_success()
    ep.record_failure("x")
    ep.record_failure("x")
    clock.now += 1.0
    assert ep.available(clock())  # success reset the backoff to the base


def test_ejection_time_is_capped() -> None:
    clock = FakeClock()
    (ep,) = make(1, clock, threshold=1)
    for _ in range(10):
        ep.record_failure("x")
        clock.now = ep.ejected_until
    ep.record_failure("x")
    assert ep.ejected_until - clock.now == 8.0


def test_pool_keeps_endpoint_state_across_updates_and_forgets_removed() -> None:
    clock = FakeClock()
    pool = EndpointPool(policy=EjectionPolicy(2, 1.0, 8.0), clock=clock)
    publish_static(
        pool, [EndpointSpec("a", "http://a", ("m1", "m2")), EndpointSpec("b", "http://b", ("m1",))]
    )
    assert pool.models() == ["m1", "m2"]
    a = pool.by_model["m1"][0]
    a.in_flight = 3
    pool.set_model_endpoints("m1", [EndpointSpec("a", "http://a2", ("m1", "m2"))])
    assert pool.by_model["m1"][0] is a and a.in_flight == 3 and a.url == "http://a2"
    assert {e.id for e in pool.endpoints()} == {"a"}
    pool.remove_model("m1")
    pool.remove_model("m2")
    assert pool.endpoints() == [] and pool.models() == []


def versioned(clock: FakeClock) -> list[Endpoint]:
    """Two endpoints of a model's own version (weight 90) and one of its canary (10)."""
    policy = EjectionPolicy(failure_threshold=1, base=1.0, maximum=8.0)
    return [
        Endpoint(
            EndpointSpec(name, f"http://{name}", ("m",), version=version, weight=weight),
            policy=policy,
            clock=clock,
        )
        for name, version, weight in (("s1", "v1", 90), ("s2", "v1", 90), ("c1", "v2", 10))
    ]


def test_a_canary_takes_its_share_of_conversations_and_each_keeps_its_version() -> None:
    clock = FakeClock()
    eps = versioned(clock)
    balancer = Balancer(clock=clock, rng=random.Random(3))

    def version_of(conversation: int) -> str:
        body = {"messages": [{"role": "user", "content": f"conversation {conversation}"}]}
        picked = balancer.pick(eps, (), RouteRequest(model="m", blocks=[], body=body))
        assert picked is not None
        return picked.version

    firsts = [version_of(i) for i in range(1000)]
    assert 0.07 <= firsts.count("v2") / 1000 <= 0.13, firsts.count("v2")
    assert [version_of(i) for i in range(1000)] == firsts


def test_a_request_goes_to_the_other_version_when_its_own_has_no_endpoint_left() -> None:
    clock = FakeClock()
    eps = versioned(clock)
    balancer = Balancer(clock=clock, rng=random.Random(3))
    route = RouteRequest(model="m", blocks=[], named_session="s")
    first = balancer.pick(eps, (), route)
    assert first is not None
    own = [ep for ep in eps if ep.version == first.version]
    other = balancer.pick(eps, own, route)
    assert other is not None and other.version != first.version
    # A model without versions is routed as before.
    plain = make(2, clock)
    assert balancer.pick(plain, (), RouteRequest(model="m", blocks=[])) in plain
