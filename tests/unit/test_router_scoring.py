"""Routing scorers and their combination by the balancer, in virtual time."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from llmgw.config.routing import RoutingConfig, ScorerWeights
from llmgw.config.server import RouterConfig
from llmgw.engines.spec import EngineLoad
from llmgw.metrics.routing import RoutingMetrics
from llmgw.router.balancer import Balancer, build_scorers
from llmgw.router.endpoints import EjectionPolicy, Endpoint, EndpointSpec
from llmgw.router.requests import CHAT, COMPLETIONS, EMBEDDINGS, parse_request
from llmgw.router.scoring import RouteRequest
from llmgw.router.scoring.blocks import prompt_blocks
from llmgw.router.scoring.load import KVScorer, LoadBook, LoadScorer
from llmgw.router.scoring.prefix import PrefixIndex, PrefixScorer
from llmgw.router.scoring.rendezvous import RendezvousScorer
from llmgw.router.scoring.session import SessionScorer


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(n: int, clock: FakeClock, prefix: str = "e") -> list[Endpoint]:
    policy = EjectionPolicy(failure_threshold=3, base=1.0, maximum=8.0)
    return [
        Endpoint(EndpointSpec(f"{prefix}{i}", f"http://h{i}", ("m",)), policy=policy, clock=clock)
        for i in range(n)
    ]


def chat(system: str, *turns: str, **extra: object) -> bytes:
    messages = [{"role": "system", "content": system}]
    for i, turn in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": turn})
    return orjson.dumps({"model": "m", "messages": messages, **extra})


def balancer(
    clock: FakeClock, routing: RoutingConfig | None = None, seed: int = 0, **more: Any
) -> Balancer:
    routing = routing or RoutingConfig()
    if not routing.weighted:
        # These tests are of the weighted scorers (predicted TTFT: test_router_ttft.py).
        routing = routing.model_copy(update={"scorers": ScorerWeights()})
    book = LoadBook(clock=clock, stale_after=5.0)
    return Balancer(
        clock=clock,
        rng=random.Random(seed),
        routing=routing,
        scorers=build_scorers(routing, book=book, clock=clock),
        book=book,
        **more,
    )


def system(group: object) -> str:
    return f"You are a careful assistant for group {group}. " * 80


# --- block hashes -------------------------------------------------------------


def test_blocks_chain_so_shared_prefixes_match_block_for_block() -> None:
    a = parse_request(CHAT, chat(system(1), "hello", "hi there", "next question"))
    b = parse_request(CHAT, chat(system(1), "hello", "hi there", "other question"))
    c = parse_request(CHAT, chat(system(2), "hello"))
    (ba, head), (bb, _), (bc, _) = (
        prompt_blocks(r.body, block_bytes=64, max_bytes=1 << 20) for r in (a, b, c)
    )
    assert head == (len(system(1)) + len(b"\x00system\x00")) // 64
    common = next(i for i, (x, y) in enumerate(zip(ba, bb, strict=False)) if x != y)
    assert common >= len(system(1)) // 64
    assert len(bc) < len(ba)
    assert ba[0] != bc[0]
    # Chained: once they differ, they never match again.
    assert all(x != y for x, y in zip(ba[common:], bb[common:], strict=False))


def test_role_boundaries_and_tools_change_the_hashes() -> None:
    as_user = {"messages": [{"role": "user", "content": "abc"}]}
    as_system = {"messages": [{"role": "system", "content": "abc"}]}
    with_tools = {"tools": [{"type": "function"}], "messages": as_user["messages"]}
    hashes = [prompt_blocks(b, block_bytes=4, max_bytes=1024)[0] for b in (as_user, as_system)]
    hashes.append(prompt_blocks(with_tools, block_bytes=4, max_bytes=1024)[0])
    assert len({h[0] for h in hashes}) == 3


def test_only_whole_blocks_count() -> None:
    # Engines cache whole blocks: a prompt shorter than a block has nothing to be
    # affine to, and the tail of a longer one is left out.
    assert prompt_blocks({"prompt": "x" * 99}, block_bytes=100, max_bytes=1000) == ([], 0)
    assert len(prompt_blocks({"prompt": "x" * 250}, block_bytes=100, max_bytes=1000)[0]) == 2


def test_blocks_are_stable_capped_and_cover_completions_and_parts() -> None:
    body = {"prompt": "x" * 10_000}
    first, head = prompt_blocks(body, block_bytes=100, max_bytes=1000)
    assert head == 0
    assert first == prompt_blocks(body, block_bytes=100, max_bytes=1000)[0]
    assert len(first) == 10  # capped at max_bytes
    assert prompt_blocks({"prompt": ""}, block_bytes=100, max_bytes=1000) == ([], 0)
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    plain = {"messages": [{"role": "user", "content": "hi"}]}
    assert prompt_blocks(parts, block_bytes=64, max_bytes=1024) == prompt_blocks(
        plain, block_bytes=64, max_bytes=1024
    )


# --- prefix index --------------------------------------------------------------


def test_prefix_index_matches_longest_held_prefix_with_lru_and_ttl() -> None:
    clock = FakeClock()
    index = PrefixIndex(capacity=6, ttl=60.0, clock=clock)
    index.add("a", [1, 2, 3, 4])
    assert index.match("a", [1, 2, 3, 4, 5]) == 4
    assert index.match("a", [1, 2, 9]) == 2
    assert index.match("b", [1, 2]) == 0
    # Over capacity the tail of the older chain goes first, its start stays.
    index.add("a", [7, 8, 9])
    assert index.size("a") == 6
    assert index.match("a", [1, 2, 3, 4]) == 3
    clock.now += 61
    assert index.match("a", [7, 8, 9]) == 0
    index.keep_only(["b"])
    assert index.size("a") == 0


def test_prefix_scorer_scores_the_held_fraction() -> None:
    clock = FakeClock()
    eps = make(2, clock)
    scorer = PrefixScorer(index=PrefixIndex(capacity=100, ttl=60.0, clock=clock))
    route = RouteRequest(model="m", blocks=[1, 2, 3, 4])
    assert scorer.score(route, eps) == [0.0, 0.0]
    scorer.chosen(RouteRequest(model="m", blocks=[1, 2, 3]), eps[1])
    assert scorer.score(route, eps) == [0.0, 0.75]
    assert scorer.score(RouteRequest(model="m", blocks=[]), eps) == [0.0, 0.0]


# --- rendezvous, session, load ---------------------------------------------------


def test_rendezvous_agrees_across_independent_scorers_and_moves_little() -> None:
    clock = FakeClock()
    eps = make(4, clock)
    one, two = RendezvousScorer(key_blocks=2), RendezvousScorer(key_blocks=2)
    winners = {}
    for key in range(200):
        route = RouteRequest(model="m", blocks=[key, key + 1000, key + 2000])
        a, b = one.score(route, eps), two.score(route, eps)
        assert a == b and sorted(a) == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
        winners[key] = eps[a.index(1.0)].id
    assert len(set(winners.values())) == 4
    # Dropping one endpoint moves only the prefixes it won.
    for key, winner in winners.items():
        route = RouteRequest(model="m", blocks=[key, key + 1000])
        scores = one.score(route, eps[:3])
        if winner != "e3":
            assert eps[scores.index(1.0)].id == winner


def test_session_scorer_remembers_the_last_endpoint_within_ttl_and_capacity() -> None:
    clock = FakeClock()
    eps = make(3, clock)
    scorer = SessionScorer(capacity=2, ttl=30.0, clock=clock)
    s1 = RouteRequest(model="m", blocks=[], session="s1")
    assert scorer.score(s1, eps) == [0.0, 0.0, 0.0]
    scorer.chosen(s1, eps[2])
    assert scorer.score(s1, eps) == [0.0, 0.0, 1.0]
    for other in ("s2", "s3"):
        scorer.chosen(RouteRequest(model="m", blocks=[], session=other), eps[0])
    assert scorer.endpoint_of("s1") is None  # evicted
    clock.now += 31
    assert scorer.endpoint_of("s3") is None  # expired
    assert scorer.score(RouteRequest(model="m", blocks=[]), eps) == [0.0, 0.0, 0.0]


def test_load_uses_engine_reports_while_fresh_and_own_counts_otherwise() -> None:
    clock = FakeClock()
    eps = make(3, clock)
    book = LoadBook(clock=clock, stale_after=5.0)
    eps[0].in_flight = 2
    book.record("e1", EngineLoad(running=3, waiting=4, kv_cache_usage=0.9))
    assert [book.load_of(ep) for ep in eps] == [2, 7, 0]
    route = RouteRequest(model="m", blocks=[])
    assert LoadScorer(book=book).score(route, eps) == [1 - 2 / 8, 1 - 7 / 8, 1.0]
    assert KVScorer(book=book).score(route, eps) == [0.5, pytest.approx(0.1), 0.5]
    snapshot = book.snapshot()
    assert snapshot["e1"].waiting == 4 and snapshot["e1"].endpoint_id == "e1"
    clock.now += 6
    assert book.get("e1") is None and book.load_of(eps[1]) == 0
    book.keep_only([])
    assert book.snapshot() == {}


# --- the balancer ---------------------------------------------------------------


def test_conversations_of_a_group_meet_on_one_replica() -> None:
    clock = FakeClock()
    eps = make(4, clock)
    bal = balancer(clock)
    where: dict[int, set[str]] = {}
    for turn in range(3):
        for group in range(8):
            for user in range(3):
                history = [f"user {user} turn {t} " * 10 for t in range(turn + 1)]
                req = parse_request(CHAT, chat(system(group), *history))
                ep = bal.pick(eps, (), bal.route(req))
                assert ep is not None
                where.setdefault(group, set()).add(ep.id)
    assert all(len(ids) == 1 for ids in where.values()), where
    assert len({next(iter(ids)) for ids in where.values()}) > 1  # groups spread out


def test_two_routers_agree_on_cold_prefixes() -> None:
    clock = FakeClock()
    first, second = balancer(clock, seed=1), balancer(clock, seed=2)
    eps_a, eps_b = make(4, clock), make(4, clock)
    for group in range(20):
        req = parse_request(CHAT, chat(system(group), "hi"))
        a = first.pick(eps_a, (), first.route(req))
        b = second.pick(eps_b, (), second.route(req))
        assert a is not None and b is not None and a.id == b.id


def test_balance_guard_lets_load_win_over_a_hot_prefix() -> None:
    clock = FakeClock()
    eps = make(3, clock)
    bal = balancer(clock, RoutingConfig(balance_abs=2, balance_rel=1.5))
    picks: Counter[str] = Counter()
    for _ in range(30):
        req = parse_request(CHAT, chat(system("hot"), "same question"))
        ep = bal.pick(eps, (), bal.route(req))
        assert ep is not None
        ep.in_flight += 1  # nothing finishes
        picks[ep.id] += 1
    assert max(ep.in_flight for ep in eps) - min(ep.in_flight for ep in eps) <= 3
    assert len(picks) == 3


def test_a_replica_at_its_capacity_loses_a_hot_prefix_to_one_with_room() -> None:
    clock = FakeClock()
    eps = make(3, clock)
    # target_in_flight 2 (soft), max_in_flight 4 (hard); the spread guard stays out of it.
    bal = balancer(clock, capacity=lambda ep, model: (2, 4))
    order: list[str] = []
    for _ in range(12):
        req = parse_request(CHAT, chat(system("hot"), "same question"))
        ep = bal.pick(eps, (), bal.route(req))
        assert ep is not None
        ep.in_flight += 1  # nothing finishes
        order.append(ep.id)
    # Affinity fills a replica to the target, then the next; past every target, up to
    # the hard limit, and past that, anywhere (the queue's business).
    assert sorted(ep.in_flight for ep in eps) == [4, 4, 4]
    assert len(set(order[:2])) == 1 and len(set(order[:6])) == 3
    assert sorted(Counter(order[:6]).values()) == [2, 2, 2]
    for ep in eps:
        ep.in_flight = 0
    # Below the target, a hot prefix stays where it is.
    req = parse_request(CHAT, chat(system("hot"), "same question"))
    firsts = {bal.pick(eps, (), bal.route(req)) for _ in range(5)}
    assert len(firsts) == 1


def test_session_header_user_field_and_key_name_the_session() -> None:
    clock = FakeClock()
    bal = balancer(clock, RoutingConfig(session_header="X-Conv", session_from_key=True))
    req = parse_request(CHAT, chat("s", "q", user="alice"))
    assert bal.route(req, [(b"x-conv", b"c-1")]).session == "c-1"
    assert bal.route(req).session == "user:alice"
    plain = parse_request(CHAT, chat("s", "q"))
    assert bal.route(plain, (), "k1").session == "key:k1"
    assert balancer(clock).route(plain, (), "k1").session is None
    assert not bal.route(plain).explain
    # Only a key that may debug gets the explanation; the header is ignored for others.
    assert not bal.route(plain, [(b"x-llmgw-route", b"1")]).explain
    plain.may_debug = True
    assert bal.route(plain, [(b"x-llmgw-route", b"1")]).explain
    embed = parse_request(EMBEDDINGS, orjson.dumps({"model": "m", "input": "x" * 999}))
    assert bal.route(embed).blocks == []
    completion = parse_request(COMPLETIONS, orjson.dumps({"model": "m", "prompt": "x" * 999}))
    assert len(bal.route(completion).blocks) == 3  # 999 bytes: three whole 256-byte blocks


def test_explanation_names_each_scorer_and_the_choice() -> None:
    clock = FakeClock()
    eps = make(2, clock)
    bal = balancer(clock)
    req = parse_request(CHAT, chat(system(0), "q"))
    req.may_debug = True
    route = bal.route(req, [(b"x-llmgw-route", b"1")])
    ep = bal.pick(eps, (), route)
    assert ep is not None
    assert route.explanation.endswith(f"-> {ep.id}")
    for name in ("prefix=", "load=", "kv=", "session=", "rendezvous="):
        assert name in route.explanation
    # The second time the prefix is known where it went.
    route = bal.route(req, [(b"x-llmgw-route", b"1")])
    assert bal.pick(eps, (), route) is ep
    assert route.chosen_scores["prefix"] == 1.0


def test_weights_zero_and_per_model_weights() -> None:
    clock = FakeClock()
    eps = make(2, clock)
    eps[0].in_flight = 3
    off = RoutingConfig(scorers=ScorerWeights(prefix=0, load=0, kv=0, session=0, rendezvous=0))
    bal = balancer(clock, off)
    req = parse_request(CHAT, chat("s", "q"))
    # All off: least outstanding by two choices.
    assert {bal.pick(eps, (), bal.route(req)) for _ in range(20)} == {eps[1]}
    book = LoadBook(clock=clock, stale_after=5.0)
    per_model = Balancer(
        clock=clock,
        rng=random.Random(0),
        routing=RoutingConfig(),
        scorers=build_scorers(RoutingConfig(), book=book, clock=clock),
        book=book,
        model_weights={"m": ScorerWeights(prefix=0, load=1, kv=0, session=0, rendezvous=0)}.get,
    )
    own = ScorerWeights(prefix=0, load=1, kv=0, session=0, rendezvous=0)
    # A model without weights of its own follows the server: predicted TTFT by default.
    assert per_model.weights("m") == own and per_model.weights("other") is None
    assert per_model.pick(eps, (), per_model.route(req)) is eps[1]


def test_routing_config_rejects_bad_values_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"routing\.scorers\.prefix"):
        RouterConfig.model_validate({"routing": {"scorers": {"prefix": -1}}})
    with pytest.raises(ValidationError, match=r"routing\.scorers\.bogus"):
        RouterConfig.model_validate({"routing": {"scorers": {"bogus": 1}}})
    with pytest.raises(ValidationError, match=r"routing\.session_header"):
        RouterConfig.model_validate({"routing": {"session_header": "bad header"}})
    with pytest.raises(ValidationError, match=r"routing\.redis_url[\s\S]*not a redis://"):
        RouterConfig.model_validate({"routing": {"redis_url": "localhost:6379"}})
    with pytest.raises(ValidationError, match=r"routing\.share_interval"):
        RouterConfig.model_validate({"routing": {"share_interval": 0}})


def test_load_book_is_the_queues_load_source_and_expected_hits_are_counted() -> None:
    clock = FakeClock()
    book = LoadBook(clock=clock, stale_after=5.0)
    book.record("e0", EngineLoad(running=1, waiting=6, kv_cache_usage=0.7))
    load = book.load("e0")
    assert load is not None and (load.waiting, load.kv_cache) == (6, 0.7)
    assert book.load("e1") is None
    registry = CollectorRegistry()
    routing = RoutingConfig(block_bytes=64)
    bal = Balancer(
        clock=clock,
        rng=random.Random(0),
        routing=routing,
        scorers=build_scorers(routing, book=book, clock=clock),
        book=book,
        metrics=RoutingMetrics(registry=registry),
    )
    eps = make(2, clock)
    req = parse_request(CHAT, chat(system(0), "q"))
    for _ in range(2):
        bal.pick(eps, (), bal.route(req))
    blocks = len(bal.route(req).blocks)
    sample = registry.get_sample_value
    assert sample("llmgw_route_prompt_blocks_total", {"model": "m"}) == 2 * blocks
    assert sample("llmgw_route_expected_hit_blocks_total", {"model": "m"}) == blocks


def test_cold_prefixes_follow_rendezvous_within_a_bounded_share_of_new_prefixes() -> None:
    clock = FakeClock()
    eps = make(4, clock)
    bal = balancer(clock)
    req = parse_request(CHAT, chat(system("new"), "q"))
    winner = bal.pick(eps, (), bal.route(req))
    assert winner is not None
    # Another router agrees on the cold prefix whatever its in-flight counts say.
    other = balancer(clock, seed=9)
    fresh = make(4, clock)
    fresh[(eps.index(winner) + 1) % 4].in_flight = 2
    picked = other.pick(fresh, (), other.route(req))
    assert picked is not None and picked.id == winner.id
    # Warm requests do not count; new prefixes are spread evenly (cold_balance 1.1).
    third = balancer(clock, seed=3)
    loaded = make(4, clock)

    def place(group: object) -> str:
        ep = third.pick(loaded, (), third.route(parse_request(CHAT, chat(system(group), "q"))))
        assert ep is not None
        return ep.id

    first = place("hot")
    assert all(place("hot") == first for _ in range(20))
    spread = Counter(place(g) for g in range(39))
    spread[first] += 1
    # 40 new prefixes: none beyond 1.1x its share of 10.
    assert sum(spread.values()) == 40 and max(spread.values()) <= 11
    # Shares decay (cold_window 30 s): an hour later placement starts afresh.
    clock.now += 3600
    assert place("later") == place("later")
