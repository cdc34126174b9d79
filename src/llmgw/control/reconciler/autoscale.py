"""How many replicas a model's load asks for: the load targets and their signals.

A model may set three targets of the kind "this much per replica":

- `target_in_flight`: requests in flight (every server's router, queued ones too);
- `target_queue_depth`: requests waiting, as the engines report them (vLLM's and
  the sim's `num_requests_waiting`, SGLang's `num_queue_reqs`) plus those waiting in
  the routers' own queues;
- `target_kv_use`: the mean KV-cache use over the Ready replicas (0..1).

Each set target asks for enough replicas to bring its signal to the target or
below; the model gets the most any target asks for, up to `max_replicas`. So one
target above its mark scales up, and only all of them below scales down (the
controller holds the higher count for `scale_down_delay` first).

A fourth, `target_queue_wait` (seconds), is a band around the longest wait in any
router's queue rather than a rate: a wait over the target asks for one replica
more than are Ready, a wait between half the target and the target asks for the
Ready ones (hold), and below half it asks for nothing. How much one more replica
shortens a wait is not known in advance, so the model steps up one replica at a
time, each once the last added one is Ready and requests still wait too long.

`merge_signals` builds the signals from what every server's router reported:
the freshest engine read per Ready replica, reads older than `max_age` ignored,
so a replica nobody reads any more (its router gone, its scrapes failing) stops
counting instead of holding the model up.

Not guaranteed: a missing signal asks for nothing. Engines that export no
metrics (llama.cpp's server by default) leave only the routers' queues for
`target_queue_depth`, and nothing for `target_kv_use`; the signal shows as
missing in the model's status.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

from llmgw.control.catalog.model import CatalogModel
from llmgw.store import ModelLoad, ReplicaLoad

# Float noise must not ask for a replica: 2 x 0.35 / 0.7 is 1.0000000000000002.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class LoadSignals:
    """One model's load, over every server, as the leader sees it now.

    `engine_waiting` and `kv_use` are None when no Ready replica reports them;
    `waiting_reported` and `kv_reported` count the replicas that do.
    """

    in_flight: int
    ready: int
    router_queued: int = 0
    queue_wait: float = 0.0
    engine_waiting: int | None = None
    waiting_reported: int = 0
    kv_use: float | None = None
    kv_reported: int = 0

    @property
    def waiting(self) -> int:
        """Requests waiting: in the engines (those that report it) and in the routers."""
        return (self.engine_waiting or 0) + self.router_queued

    @property
    def queue_depth(self) -> float:
        """Waiting requests per Ready replica (all of them when none is Ready)."""
        return self.waiting / max(1, self.ready)


NO_LOAD = LoadSignals(in_flight=0, ready=0)


@dataclass(frozen=True, slots=True)
class LoadNeed:
    """Replicas one target asks for, and why (for the `scale` event)."""

    target: str
    replicas: int
    reason: str


def merge_signals(
    *,
    in_flight: int,
    ready: Collection[str],
    loads: Iterable[ModelLoad],
    now: datetime,
    max_age: float,
) -> LoadSignals:
    """The signals of one model from every server's `ModelLoad` (this server's too).

    `ready` are the ids of the model's Ready replicas: reads of other replicas
    (stopped, still loading, static endpoints) are left out. Queues add up over
    routers; the wait is the longest.
    """
    queued = 0
    wait = 0.0
    freshest: dict[str, ReplicaLoad] = {}
    for load in loads:
        queued += load.queued
        wait = max(wait, load.queue_wait)
        for read in load.replicas:
            if read.replica not in ready or (now - read.read_at).total_seconds() > max_age:
                continue
            seen = freshest.get(read.replica)
            if seen is None or read.read_at > seen.read_at:
                freshest[read.replica] = read
    waiting = [r.waiting for r in freshest.values() if r.waiting is not None]
    kv = [r.kv_cache_usage for r in freshest.values() if r.kv_cache_usage is not None]
    return LoadSignals(
        in_flight=in_flight,
        ready=len(ready),
        router_queued=queued,
        queue_wait=wait,
        engine_waiting=sum(waiting) if waiting else None,
        waiting_reported=len(waiting),
        kv_use=sum(kv) / len(kv) if kv else None,
        kv_reported=len(kv),
    )


def load_needs(model: CatalogModel, signals: LoadSignals) -> list[LoadNeed]:
    """What each of the model's set targets asks for (before max_replicas); a target
    whose signal is missing asks for nothing and is left out."""
    needs: list[LoadNeed] = []
    if model.target_in_flight:
        target = model.target_in_flight
        needs.append(
            LoadNeed(
                "in_flight",
                _ceil(signals.in_flight / target),
                f"{signals.in_flight} requests in flight at {target} per replica",
            )
        )
    if model.target_queue_depth:
        target = model.target_queue_depth
        engines = (
            f"{signals.engine_waiting} in engines"
            if signals.engine_waiting is not None
            else "engines report none"
        )
        needs.append(
            LoadNeed(
                "queue_depth",
                _ceil(signals.waiting / target),
                f"{signals.waiting} requests waiting ({engines}, {signals.router_queued} in "
                f"routers) at {target} per replica",
            )
        )
    if model.target_queue_wait:
        needs.append(_queue_wait_need(model.target_queue_wait, signals))
    if model.target_kv_use and signals.kv_use is not None and signals.ready:
        target_kv = model.target_kv_use
        needs.append(
            LoadNeed(
                "kv_use",
                _ceil(signals.ready * signals.kv_use / target_kv),
                f"KV cache {signals.kv_use:.0%} used on {signals.ready} "
                f"replica{'' if signals.ready == 1 else 's'} at {target_kv:.0%} per replica",
            )
        )
    return needs


def _queue_wait_need(target: float, signals: LoadSignals) -> LoadNeed:
    """One replica more than are Ready while a request has waited longer than
    `target`, the Ready ones down to half of it, none below."""
    wait, ready = signals.queue_wait, signals.ready
    said = f"longest queue wait {wait:.2f} s"
    if wait > target:
        replicas, band = ready + 1, "over"
    elif wait >= target / 2:
        replicas, band = ready, "within"
    else:
        return LoadNeed("queue_wait", 0, f"{said}, under half the {target:g} s target")
    return LoadNeed(
        "queue_wait",
        replicas,
        f"{said} {band} the {target:g} s target with {ready} "
        f"replica{'' if ready == 1 else 's'} Ready",
    )


def replicas_for_load(model: CatalogModel, signals: LoadSignals) -> tuple[int, str]:
    """The replicas the load asks for (the most any target asks, up to
    max_replicas) and the reasons, the deciding target first."""
    needs = load_needs(model, signals)
    if not needs:
        return 0, "no load signal"
    needs.sort(key=lambda n: -n.replicas)
    need = min(needs[0].replicas, model.max_replicas)
    return need, "; ".join(n.reason for n in needs)


def missing_signals(model: CatalogModel, signals: LoadSignals) -> list[str]:
    """What the model's targets cannot see, for people (empty when nothing is missing
    or no replica is Ready to be read)."""
    if not signals.ready:
        return []
    missing = []
    if model.target_queue_depth and signals.engine_waiting is None:
        missing.append(
            "no Ready replica reports waiting requests (its engine exports no metrics, "
            "or they were not read lately): target_queue_depth counts the routers' "
            "queues only"
        )
    if model.target_kv_use and signals.kv_use is None:
        missing.append(
            "no Ready replica reports KV-cache use (its engine exports no metrics, or "
            "they were not read lately): target_kv_use asks for no replicas"
            + (", target_in_flight still applies" if model.target_in_flight else "")
        )
    return missing


def signals_view(model: CatalogModel, signals: LoadSignals) -> dict[str, object]:
    """The signals as the admin API shows them (a model's `status.load`)."""
    return {
        "in_flight": signals.in_flight,
        "ready_replicas": signals.ready,
        "waiting": signals.waiting,
        "engine_waiting": signals.engine_waiting,
        "router_queued": signals.router_queued,
        "queue_depth": round(signals.queue_depth, 2),
        "queue_wait_seconds": round(signals.queue_wait, 1),
        "kv_use": None if signals.kv_use is None else round(signals.kv_use, 3),
        "replicas_reporting": {
            "waiting": signals.waiting_reported,
            "kv_use": signals.kv_reported,
        },
        "missing": missing_signals(model, signals),
    }


def _ceil(value: float) -> int:
    return max(0, math.ceil(value - _EPSILON))
