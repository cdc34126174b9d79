"""The load targets: what each asks for, how the signals of several routers merge,
and how demand rows carry them between servers."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from store_fixtures import START, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.config import ConfigError, load_server_config
from llmgw.control.catalog.model import CatalogModel, Profile
from llmgw.control.reconciler.autoscale import (
    LoadNeed,
    LoadSignals,
    load_needs,
    merge_signals,
    missing_signals,
    replicas_for_load,
    signals_view,
)
from llmgw.control.reconciler.demand import NEVER, DemandBook
from llmgw.store import Demand, ModelLoad, ReplicaLoad, Store

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def model(**targets: object) -> CatalogModel:
    fields: dict[str, object] = {"max_replicas": 4, **targets}
    return CatalogModel(
        name="m",
        weights="none",
        profiles=(Profile(name="sim", engine="sim", gpus=1),),
        **fields,  # type: ignore[arg-type]
    )


def read(
    replica: str, *, waiting: int | None = 0, kv: float | None = None, age: float = 0
) -> ReplicaLoad:
    return ReplicaLoad(replica, waiting, 1, kv, NOW - timedelta(seconds=age))


# ---- what each target asks for ----


@pytest.mark.parametrize(
    ("signals", "need"),
    [
        (LoadSignals(in_flight=0, ready=1, engine_waiting=0, waiting_reported=1), 0),
        (LoadSignals(in_flight=0, ready=1, engine_waiting=3, waiting_reported=1), 1),
        (LoadSignals(in_flight=0, ready=1, engine_waiting=4, waiting_reported=1), 2),
        # The routers' queues count with the engines'.
        (LoadSignals(in_flight=0, ready=1, engine_waiting=2, router_queued=5), 3),
        # Engines that report nothing: the routers' queues alone.
        (LoadSignals(in_flight=0, ready=2, router_queued=7), 3),
        # Capped at max_replicas.
        (LoadSignals(in_flight=0, ready=2, engine_waiting=40, waiting_reported=2), 4),
    ],
)
def test_queue_depth_asks_one_replica_per_target_waiting(signals: LoadSignals, need: int) -> None:
    assert replicas_for_load(model(target_queue_depth=3), signals)[0] == need


@pytest.mark.parametrize(
    ("ready", "kv", "need"),
    [
        (1, 0.5, 1),
        (1, 0.9, 2),
        (2, 0.35, 1),  # 2 x 0.35 / 0.7 is 1 (not 1.0000000000000002)
        (2, 0.8, 3),
        (3, 1.0, 4),
    ],
)
def test_kv_use_asks_for_enough_replicas_to_bring_the_mean_to_the_target(
    ready: int, kv: float, need: int
) -> None:
    signals = LoadSignals(in_flight=0, ready=ready, kv_use=kv, kv_reported=ready)
    assert replicas_for_load(model(target_kv_use=0.7), signals)[0] == need


@pytest.mark.parametrize(
    ("wait", "ready", "asked", "reason"),
    [
        # Over the target: one replica more than are Ready.
        (2.5, 1, 2, "longest queue wait 2.50 s over the 2 s target with 1 replica Ready"),
        (2.01, 2, 3, "longest queue wait 2.01 s over the 2 s target with 2 replicas Ready"),
        # Nothing Ready yet and requests waiting too long: at least one.
        (9.0, 0, 1, "longest queue wait 9.00 s over the 2 s target with 0 replicas Ready"),
        # From half the target to the target: the Ready ones are kept.
        (2.0, 2, 2, "longest queue wait 2.00 s within the 2 s target with 2 replicas Ready"),
        (1.0, 3, 3, "longest queue wait 1.00 s within the 2 s target with 3 replicas Ready"),
        # Below half: nothing asked, the other targets (or min_replicas) decide.
        (0.99, 3, 0, "longest queue wait 0.99 s, under half the 2 s target"),
        (0.0, 1, 0, "longest queue wait 0.00 s, under half the 2 s target"),
        # Asks for five, capped at max_replicas (4), however long requests wait.
        (30.0, 4, 5, "longest queue wait 30.00 s over the 2 s target with 4 replicas Ready"),
    ],
)
def test_queue_wait_asks_one_more_over_the_target_holds_to_half_and_nothing_below(
    wait: float, ready: int, asked: int, reason: str
) -> None:
    waits = model(target_queue_wait=2.0)
    signals = LoadSignals(in_flight=ready, ready=ready, router_queued=3, queue_wait=wait)
    assert load_needs(waits, signals) == [LoadNeed("queue_wait", asked, reason)]
    assert replicas_for_load(waits, signals) == (min(asked, waits.max_replicas), reason)


def test_queue_wait_steps_up_one_replica_at_a_time_while_requests_wait_too_long() -> None:
    # The added replica is not Ready yet: the count asked for stays, nothing more.
    waits = model(target_queue_wait=1.0, max_replicas=8)
    loading = LoadSignals(in_flight=9, ready=1, router_queued=8, queue_wait=6.0)
    assert replicas_for_load(waits, loading)[0] == 2
    assert replicas_for_load(waits, dataclasses.replace(loading, ready=2))[0] == 3
    # With target_in_flight too, the higher ask wins and the in-flight count (queued
    # requests included) keeps the replicas once the wait has fallen back.
    both = model(target_queue_wait=1.0, target_in_flight=3)
    need, reason = replicas_for_load(both, loading)
    assert need == 3
    assert reason.startswith("9 requests in flight at 3 per replica; longest queue wait 6.00 s")
    drained = LoadSignals(in_flight=9, ready=3, queue_wait=0.0)
    assert replicas_for_load(both, drained)[0] == 3
    # The model scales on load at all only with a target set.
    assert waits.scales_on_load and not model().scales_on_load


def test_the_highest_target_wins_and_leads_the_reason() -> None:
    both = model(target_in_flight=4, target_queue_depth=2, target_kv_use=0.8)
    busy_queue = LoadSignals(
        in_flight=5, ready=1, engine_waiting=6, waiting_reported=1, kv_use=0.5, kv_reported=1
    )
    need, reason = replicas_for_load(both, busy_queue)
    assert need == 3
    assert reason == (
        "6 requests waiting (6 in engines, 0 in routers) at 2 per replica; "
        "5 requests in flight at 4 per replica; KV cache 50% used on 1 replica at 80% per replica"
    )
    # All below: the most any asks is what is left.
    quiet = LoadSignals(in_flight=3, ready=3, engine_waiting=0, waiting_reported=3, kv_use=0.1)
    assert replicas_for_load(both, quiet)[0] == 1


def test_only_target_in_flight_keeps_its_reason() -> None:
    need, reason = replicas_for_load(model(target_in_flight=2), LoadSignals(in_flight=7, ready=1))
    assert (need, reason) == (4, "7 requests in flight at 2 per replica")


def test_a_missing_signal_asks_for_nothing_and_says_so() -> None:
    kv_only = model(target_kv_use=0.5)
    unread = LoadSignals(in_flight=9, ready=2)
    assert replicas_for_load(kv_only, unread) == (0, "no load signal")
    (message,) = missing_signals(kv_only, unread)
    assert message.startswith("no Ready replica reports KV-cache use")
    assert message.endswith("target_kv_use asks for no replicas")
    # With target_in_flight too, that one still scales.
    both = model(target_kv_use=0.5, target_in_flight=3)
    assert replicas_for_load(both, unread)[0] == 3
    assert missing_signals(both, unread)[0].endswith(", target_in_flight still applies")
    queue = model(target_queue_depth=2)
    assert missing_signals(queue, unread) == [
        "no Ready replica reports waiting requests (its engine exports no metrics, or they "
        "were not read lately): target_queue_depth counts the routers' queues only"
    ]
    # Nothing Ready: nothing to read, nothing said.
    assert missing_signals(queue, LoadSignals(in_flight=1, ready=0)) == []
    view = signals_view(queue, unread)
    assert (view["engine_waiting"], view["kv_use"], view["queue_depth"]) == (None, None, 0.0)


# ---- merging what the routers read ----


def test_the_freshest_read_per_ready_replica_counts_and_old_ones_expire() -> None:
    leader = ModelLoad(queued=2, queue_wait=1.5, replicas=(read("a", waiting=9, age=3),))
    standby = ModelLoad(
        queued=1,
        queue_wait=4.0,
        replicas=(
            read("a", waiting=1, kv=0.4, age=1),  # fresher than the leader's read of a
            read("b", waiting=5, kv=0.8, age=20),  # nobody read b lately: ignored
            read("gone", waiting=50, kv=1.0),  # not a Ready replica: ignored
        ),
    )
    signals = merge_signals(
        in_flight=4, ready={"a", "b"}, loads=[leader, standby], now=NOW, max_age=15
    )
    assert signals == LoadSignals(
        in_flight=4,
        ready=2,
        router_queued=3,
        queue_wait=4.0,
        engine_waiting=1,
        waiting_reported=1,
        kv_use=0.4,
        kv_reported=1,
    )
    assert signals.waiting == 4 and signals.queue_depth == 2.0


def test_demand_rows_carry_the_routers_load_and_load_only_rows_keep_nothing_alive() -> None:
    wall = [NOW]
    local = {"m": ModelLoad(queued=0, replicas=(read("a", waiting=2),))}
    book = DemandBook(clock=lambda: 100.0, wall_clock=lambda: wall[0], local_load=lambda: local)
    # No request went through this server: its row carries only the load.
    (row,) = book.local_rows("s1")
    assert (row.last_active, row.in_flight, row.load) == (NEVER, 0, local["m"])

    leader = DemandBook(clock=lambda: 100.0, wall_clock=lambda: wall[0])
    leader.set_remote([row, Demand("m", "s2", NOW, 0, None, ModelLoad(queued=3))])
    assert leader.idle_for("m", 100.0) == 0.0  # s2 served a request just now
    leader.set_remote([row])
    assert leader.idle_for("m", 100.0) is None
    assert not leader.wants(model(keep_alive=300.0), 100.0, activating=False)
    signals = leader.signals("m", {"a"})
    assert (signals.engine_waiting, signals.router_queued) == (2, 0)
    # The read ages out when its server stops refreshing it.
    wall[0] = NOW + timedelta(seconds=60)
    assert leader.signals("m", {"a"}).engine_waiting is None


def test_bad_targets_in_a_config_file_name_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text(
        "models:\n"
        "  - name: m\n"
        "    weights: none\n"
        "    target_queue_depth: 0\n"
        "    target_kv_use: 80\n"
        "    target_queue_wait: -1\n"
        "    profiles: [{engine: sim}]\n"
        "  - name: n\n"
        "    weights: none\n"
        "    target_queue_wait: 2s\n"
        "    profiles: [{engine: sim}]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_server_config(path, {})
    lines = str(info.value).splitlines()
    assert any(
        line.startswith(f"{path}: models[0].target_queue_depth: ")
        and "greater than or equal to 1" in line
        for line in lines
    ), lines
    assert any(
        line.startswith(f"{path}: models[0].target_kv_use: ") and "less than or equal to 1" in line
        for line in lines
    ), lines
    assert any(
        line.startswith(f"{path}: models[0].target_queue_wait: ") and "greater than 0" in line
        for line in lines
    ), lines
    assert any(
        line.startswith(f"{path}: models[1].target_queue_wait: ") and "valid number" in line
        for line in lines
    ), lines


async def test_demand_rows_keep_their_load_through_the_store(store: Store) -> None:
    load = ModelLoad(
        queued=3,
        queue_wait=2.5,
        replicas=(
            ReplicaLoad("a", 4, 1, 0.25, START),
            ReplicaLoad("b", None, None, None, START - timedelta(seconds=2)),
        ),
    )
    await store.leadership.report_demand(
        "s1", [Demand("m", "s1", START, 1, None, load), Demand("n", "s1", NEVER, 0, None)]
    )
    rows = sorted(await store.leadership.demand(), key=lambda d: d.model)
    assert [(d.model, d.load) for d in rows] == [("m", load), ("n", ModelLoad())]
    assert rows[1].last_active == NEVER
