"""The predicted-TTFT chooser (the default routing) and what it learns, in virtual time."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pydantic import ValidationError
from test_router_scoring import FakeClock, chat, make, system

from llmgw.config.errors import ConfigError
from llmgw.config.loading import load_server_config
from llmgw.config.routing import RoutingConfig, TtftConfig
from llmgw.config.server import RouterConfig
from llmgw.engines.spec import EngineLoad
from llmgw.router.balancer import Balancer, build_scorers
from llmgw.router.endpoints import Endpoint
from llmgw.router.requests import CHAT, parse_request
from llmgw.router.scoring import RouteRequest
from llmgw.router.scoring.load import LoadBook
from llmgw.router.scoring.ttft import Rates, TtftPredictor


def balancer(clock: FakeClock, routing: RoutingConfig | None = None) -> Balancer:
    routing = routing or RoutingConfig()
    assert not routing.weighted
    book = LoadBook(clock=clock, stale_after=5.0)
    return Balancer(
        clock=clock,
        rng=random.Random(0),
        routing=routing,
        scorers=build_scorers(routing, book=book, clock=clock),
        book=book,
    )


def send(bal: Balancer, eps: list[Endpoint], body: bytes, **headers: str) -> Endpoint:
    req = parse_request(CHAT, body)
    hs = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    ep = bal.pick(eps, (), bal.route(req, hs))
    assert ep is not None
    return ep


def engines(bal: Balancer, eps: list[Endpoint], running: list[int], waiting: list[int]) -> None:
    for ep, run, wait in zip(eps, running, waiting, strict=True):
        bal.book.record(ep.id, EngineLoad(running=run, waiting=wait, kv_cache_usage=0.5))


def test_ttft_is_the_default_and_scorers_are_an_explicit_override() -> None:
    # Survives the loader's round trip through model_dump (flags laid over the file).
    dumped = RouterConfig.model_validate({"routing": {"metrics_interval": 0.2}}).model_dump()
    assert not RouterConfig.model_validate(dumped).routing.weighted
    assert not RoutingConfig().weighted
    assert RoutingConfig.model_validate({"scorers": {}}).weighted
    assert RouterConfig.model_validate({"routing": {"scorers": {"load": 1}}}).routing.weighted
    assert not RouterConfig.model_validate(
        {"routing": {"ttft": {"max_num_seqs": 8}}}
    ).routing.weighted


def test_bad_ttft_settings_name_the_field() -> None:
    for bad, field in [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"prefill_seconds_per_block": 0}, "prefill_seconds_per_block"),
        ({"tie_fraction": 2}, "tie_fraction"),
        ({"learn_weight": 0}, "learn_weight"),
        ({"service_seconds": -1}, "service_seconds"),
        ({"assumed_num_seqs": 0}, "assumed_num_seqs"),
        ({"bogus": 1}, "bogus"),
    ]:
        with pytest.raises(ValidationError, match=rf"routing\.ttft\.{field}"):
            RouterConfig.model_validate({"routing": {"ttft": bad}})


def test_a_bad_ttft_setting_in_a_file_names_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("router:\n  routing:\n    ttft:\n      max_num_seqs: 0\n")
    with pytest.raises(ConfigError) as info:
        load_server_config(path, {})
    assert str(path) in str(info.value)
    assert "router.routing.ttft.max_num_seqs" in str(info.value)


def test_a_conversation_stays_on_its_replica_while_it_has_a_free_slot() -> None:
    clock = FakeClock()
    eps = make(3, clock)
    bal = balancer(clock)
    first = send(bal, eps, chat(system("g"), "hello"))
    for i in range(5):
        # Busy but not full: the cached replica wins on prefill.
        first.in_flight = 10
        assert send(bal, eps, chat(system("g"), "hello", f"answer {i}", "more")) is first


def test_a_saturated_replica_is_passed_over_for_one_with_a_free_slot() -> None:
    clock = FakeClock()
    eps = make(2, clock)
    bal = balancer(clock, RoutingConfig(ttft=TtftConfig(max_num_seqs=4)))
    home = send(bal, eps, chat(system("g"), "hello"))
    other = eps[1] if home is eps[0] else eps[0]
    # Full, one waiting: a wait of 2 slot times / 4 = 1 s against about 0.1 s of prefill.
    home.in_flight = 5
    question = "a question of the second user, long enough to fill blocks " * 10
    assert send(bal, eps, chat(system("g"), question)) is other
    # The prefix now lives in both places; with room in both, affinity decides again.
    home.in_flight = 0
    other.in_flight = 0
    assert send(bal, eps, chat(system("g"), question, "an answer", "and?")) is other


def test_a_busy_replica_with_room_is_not_worth_computing_the_prefix_again() -> None:
    clock = FakeClock()
    eps = make(2, clock)
    # Slots turn over every 0.5 s / 8; prefill 5 ms a block (defaults otherwise).
    bal = balancer(clock, RoutingConfig(ttft=TtftConfig(max_num_seqs=8, service_seconds=0.5)))
    home = send(bal, eps, chat(system("g"), "hello"))
    other = eps[1] if home is eps[0] else eps[0]
    # Home is full with one waiting (wait 2 x 0.5 / 8 = 125 ms); the other has room but
    # runs 6: its prefill (about 60 ms) would stall those 6 too. Stay and wait.
    home.in_flight, other.in_flight = 9, 6
    assert send(bal, eps, chat(system("g"), "second user")) is home
    # Idle, the other replica costs only the prefill: go there.
    other.in_flight = 0
    assert send(bal, eps, chat(system("g"), "third user")) is other
    # Counting only the request's own time, the busy replica would have taken it too.
    own_only = RoutingConfig(
        ttft=TtftConfig(max_num_seqs=8, service_seconds=0.5, prefill_interference=0)
    )
    bal = balancer(clock, own_only)
    home = send(bal, eps, chat(system("h"), "hello"))
    other = eps[1] if home is eps[0] else eps[0]
    home.in_flight, other.in_flight = 9, 6
    assert send(bal, eps, chat(system("h"), "second user")) is other


def test_a_short_wait_beats_a_long_prefill() -> None:
    clock = FakeClock()
    eps = make(2, clock)
    # Prefill is expensive (1 s a block) and slots turn over fast (0.1 s).
    ttft = TtftConfig(max_num_seqs=4, prefill_seconds_per_block=1.0, service_seconds=0.1)
    bal = balancer(clock, RoutingConfig(ttft=ttft))
    home = send(bal, eps, chat(system("g"), "hello"))
    home.in_flight = 4
    assert send(bal, eps, chat(system("g"), "hello again")) is home


def test_a_cold_prefix_goes_to_the_least_loaded_replica() -> None:
    clock = FakeClock()
    eps = make(4, clock)
    bal = balancer(clock)
    for ep, load in zip(eps, [3, 1, 0, 2], strict=True):
        ep.in_flight = load
    assert send(bal, eps, chat(system("new"), "hi")) is eps[2]
    # The engines' own reports count too (other routers' requests).
    engines(bal, eps, [0, 5, 5, 5], [0, 0, 0, 0])
    for ep in eps:
        ep.in_flight = 1
    assert send(bal, eps, chat(system("newer"), "hi")) is eps[0]


def test_a_burst_of_new_groups_spreads_evenly() -> None:
    clock = FakeClock()
    eps = make(4, clock)
    bal = balancer(clock)
    for group in range(12):
        send(bal, eps, chat(system(group), "hi")).in_flight += 1
    assert [ep.in_flight for ep in eps] == [3, 3, 3, 3]


def test_routers_with_the_same_view_agree_on_a_cold_prefix() -> None:
    clock = FakeClock()
    eps_a, eps_b = make(4, clock), make(4, clock)
    a, b = balancer(clock), balancer(clock)
    for group in range(20):
        body = chat(system(f"x{group}"), "hi")
        assert send(a, eps_a, body).id == send(b, eps_b, body).id


def test_ties_go_to_the_session_then_the_longest_prefix() -> None:
    clock = FakeClock()
    eps = make(3, clock)
    bal = balancer(clock)
    short = "hi"  # under one block: no prefix to match, only the session
    first = send(bal, eps, chat(short, "q"), x_session_id="s1")
    assert send(bal, eps, chat(short, "q"), x_session_id="s1") is first


def test_a_hot_prompt_spreads_when_no_batch_size_is_known() -> None:
    clock = FakeClock()
    eps = make(3, clock)
    bal = balancer(clock, RoutingConfig(ttft=TtftConfig(assumed_num_seqs=4)))
    for _ in range(30):
        send(bal, eps, chat(system("hot"), "same question")).in_flight += 1
    loads = sorted(ep.in_flight for ep in eps)
    assert loads[-1] - loads[0] <= 2, loads


def test_the_batch_size_is_learned_from_the_engines_reports() -> None:
    clock = FakeClock()
    eps = make(2, clock)
    bal = balancer(clock)
    predictor = bal.predictor
    # Never seen waiting: the assumed size, raised to the most seen running.
    engines(bal, eps, [20, 3], [0, 0])
    assert predictor.batch_size(eps[0], "m") == 20
    assert predictor.batch_size(eps[1], "m") == 16
    # Seen waiting: the engine's batch was full.
    engines(bal, eps, [20, 6], [0, 2])
    assert predictor.batch_size(eps[1], "m") == 6
    # Full with requests waiting inside the engine: predicted to wait.
    engines(bal, eps, [10, 6], [0, 3])
    route = RouteRequest(model="m", blocks=[1, 2, 3])
    predictions, _ = predictor.predict(route, eps, [0, 0])
    assert predictions[0].wait == 0
    assert predictions[1].wait == pytest.approx(4 * 2.0 / 6)


def test_prefill_and_slot_times_are_learned_per_replica() -> None:
    clock = FakeClock()
    eps = make(2, clock)
    book = LoadBook(clock=clock, stale_after=5.0)
    predictor = TtftPredictor(config=TtftConfig(learn_weight=0.2), book=book, key_blocks=8)
    for uncached in [2, 40, 10, 80, 5, 60, 20, 30, 70, 1] * 3:
        # 20 ms of overhead plus 10 ms a block; 3 s in a slot.
        ttft = 0.02 + 0.01 * uncached
        predictor.observe("e0", "m", uncached=uncached, waited=False, first_byte=ttft, total=3.0)
    route = RouteRequest(model="m", blocks=list(range(50)))
    predictions, _ = predictor.predict(route, eps, [0, 0])
    # From the requests with many uncached blocks: the overhead is a small share.
    assert 0.5 < predictions[0].prefill < 0.6
    # The other replica has no observations of its own yet: the model's stand in.
    assert predictions[1].prefill == predictions[0].prefill
    book.record("e0", EngineLoad(running=4, waiting=1, kv_cache_usage=None))
    eps[0].in_flight = 5
    predictions, _ = predictor.predict(route, eps, [50, 0])
    assert predictions[0].prefill == 0
    assert predictions[0].wait == pytest.approx(2 * 3.0 / 4)
    # A request that waited teaches the slot time without its wait in the queue.
    predictor.observe("e1", "m", uncached=0, waited=True, first_byte=5.0, total=6.0)
    predictor.refresh({"e1"})
    predictions, _ = predictor.predict(route, eps, [0, 0])
    assert 0.5 < predictions[0].prefill < 0.6


def test_rates_fall_back_to_a_ratio_without_spread() -> None:
    rates = Rates()
    assert rates.per_block() is None and rates.slot() is None
    for _ in range(10):
        rates.add_prefill(10, 0.2, 0.1)
        rates.add_slot(1.5, 0.1)
    assert rates.per_block() == pytest.approx(0.02)
    assert rates.slot() == pytest.approx(1.5)


def test_explanation_gives_the_prediction() -> None:
    clock = FakeClock()
    eps = make(2, clock)
    bal = balancer(clock)
    req = parse_request(CHAT, chat(system("g"), "q"))
    req.may_debug = True
    route = bal.route(req, [(b"x-llmgw-route", b"1")])
    ep = bal.pick(eps, (), route)
    assert ep is not None
    assert route.explanation.startswith("ttft=")
    assert "cached=0/" in route.explanation and route.explanation.endswith(f"-> {ep.id}")
