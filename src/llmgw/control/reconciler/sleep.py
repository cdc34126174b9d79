"""Idle replicas sleep before they stop; the first request wakes one.

A model with `sleep_after` is started with its engine in sleep mode (the adapter
adds the flags). Once the model has had no request in flight for `sleep_after`
seconds, each of its Ready single-node replicas is taken out of the routers and
put to sleep (`Dispatcher.sleep_shard`, level 1: the engine keeps its weights in
host memory and releases its GPU memory). A sleeping replica still counts as a
replica of the model, so `plan()` starts no other and `keep_alive` later stops
it as it would a Ready one. When a request waits for a model whose replicas all
sleep (an activation, here or on another server), one of them is woken
(`Dispatcher.wake_shard`) instead of a start; the agent reports it Ready again
and it is published as usual. The time each wake took is an event, a metric and
a span.

A sleeping replica keeps host memory: at level 1 its weights, the size of its
snapshot on the node. A replica is put to sleep only when the node can hold
that: no more than the node's available host memory (its agent's heartbeat), and
within the agent's `--sleep-memory-max` together with what the node's sleeping
replicas (and those falling asleep) already hold. Otherwise it stays awake and
serves (an event says why, once); `keep_alive` stops it later as usual.

A sleeping replica's GPUs count as free for placement: when only they let another
model's replica be placed, `plan()` stops the sleeping replica first (`make_room`)
and places the other once they are free; a model idle past `sleep_after` is on
hold meanwhile (`dozing`: not started again elsewhere until a request asks).

`SleepBook` keeps what is in flight: replicas being put to sleep (kept out of
the routers until they report `sleeping`) and replicas being woken. It decides
only when the controller calls `step` (each reconcile), and sends each sleep or
wake as a task of its own.

Not guaranteed: multi-node replicas never sleep (their ranks would have to sleep
together); an engine adopted after an agent restart is known to be asleep only
where it says so (vLLM's and the sim's `/is_sleeping`; SGLang has no such path, so
an adopted sleeping SGLang engine is taken as Ready).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import StatusCode, Tracer

from llmgw.control.agentsvc.dispatcher import Dispatcher
from llmgw.control.agentsvc.errors import AgentServiceError
from llmgw.control.catalog.model import CatalogModel
from llmgw.control.inventory import Node, Shard
from llmgw.control.reconciler.demand import DemandBook
from llmgw.control.reconciler.disk import decimal_size
from llmgw.control.reconciler.state import routable
from llmgw.metrics.activations import ActivationMetrics

log = logging.getLogger("llmgw.control.reconciler.sleep")

# Level 1: weights to host RAM, so a wake copies them back instead of reloading.
SLEEP_LEVEL = 1


@dataclass(frozen=True, slots=True)
class Wake:
    """A wake in flight: which replica, where, since when (monotonic clock)."""

    shard_id: str
    node_id: str
    model: str
    started: float


class SleepBook:
    """Replicas falling asleep and waking; decides both on each reconcile."""

    def __init__(
        self,
        *,
        dispatcher: Dispatcher,
        clock: Callable[[], float],
        tracer: Tracer,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        event: Callable[[str, str, str, str], None],
        wake_loop: Callable[[], None],
        command_timeout: float,
        metrics: ActivationMetrics | None = None,
    ) -> None:
        """`event(kind, model, node, message)` records an event; `wake_loop()` asks
        for a reconcile; `command_timeout` bounds a sleep or wake on the engine."""
        self._dispatcher = dispatcher
        self._clock = clock
        self._tracer = tracer
        self._spawn = spawn
        self._event = event
        self._wake_loop = wake_loop
        self._timeout = command_timeout
        self._metrics = metrics
        self._falling: dict[str, str] = {}
        # Per replica falling asleep: its node and the host memory it will hold.
        self._holding: dict[str, tuple[str, int]] = {}
        # Replicas kept awake for want of host memory, with the reason (said once).
        self._kept_awake: dict[str, str] = {}
        self._waking: dict[str, Wake] = {}
        self._last_wake: dict[str, tuple[str, float]] = {}

    @property
    def falling(self) -> frozenset[str]:
        """Replicas sent to sleep that still report Ready: kept out of the routers."""
        return frozenset(self._falling)

    def last_wake(self, model: str) -> tuple[str, float] | None:
        """The model's last finished wake: (replica id, seconds it took)."""
        return self._last_wake.get(model)

    def waking(self, model: str) -> Wake | None:
        """The wake in flight for `model`, if any."""
        for wake in self._waking.values():
            if wake.model == model:
                return wake
        return None

    def step(
        self,
        models: Sequence[CatalogModel],
        nodes: Sequence[Node],
        demand: DemandBook,
        wanted: Collection[str],
        now: float,
    ) -> None:
        """Put idle models' Ready replicas to sleep; wake one replica of each model in
        `wanted` (waited for by a request) that has no Ready replica but a sleeping one."""
        by_model: dict[str, list[tuple[Node, Shard]]] = {}
        for node in nodes:
            if not routable(node):
                continue
            for shard in node.shards.values():
                spec = shard.spec
                if spec is None or not spec.sleep_mode or spec.nodes > 1:
                    continue
                by_model.setdefault(shard.model, []).append((node, shard))
        for model in models:
            replicas = by_model.get(model.name, [])
            if not replicas:
                continue
            if model.name in wanted:
                self._wake_one(model, replicas, now)
            elif model.sleep_after is not None and _idle(demand, model, now):
                for node, shard in replicas:
                    if shard.state == "ready" and shard.id not in self._falling:
                        self._sleep_if_room(model, node, shard)

    def _wake_one(
        self, model: CatalogModel, replicas: list[tuple[Node, Shard]], now: float
    ) -> None:
        if any(s.state == "ready" and s.id not in self._falling for _, s in replicas):
            return
        if any(s.id in self._waking or s.id in self._falling for _, s in replicas):
            return  # one is already on its way (a sleep finishes before its wake)
        sleeping = sorted(
            ((n, s) for n, s in replicas if s.state == "sleeping"), key=lambda ns: ns[1].id
        )
        if not sleeping:
            return
        node, shard = sleeping[0]
        wake = Wake(shard.id, node.id, model.name, now)
        self._waking[shard.id] = wake
        log.info("model %s: waking replica %s on node %s", model.name, shard.id, node.id)
        self._event("wake", model.name, node.id, f"waking replica {shard.id} for a request")
        self._spawn(self._run_wake(wake), f"wake {shard.id}")

    def _sleep_if_room(self, model: CatalogModel, node: Node, shard: Shard) -> None:
        assert shard.spec is not None  # only shards with a spec are candidates
        size = node.snapshot_bytes(shard.spec.weights)
        reason = self._no_memory(node, size)
        if reason is None:
            self._kept_awake.pop(shard.id, None)
            self._holding[shard.id] = (node.id, size)
            self._sleep(model, node, shard)
            return
        if self._kept_awake.get(shard.id) == reason:
            return
        self._kept_awake[shard.id] = reason
        message = f"replica {shard.id} on node {node.id} stays awake: {reason}"
        log.info("model %s: %s", model.name, message)
        self._event("sleep", model.name, node.id, message)

    def _no_memory(self, node: Node, size: int) -> str | None:
        """Why `node` cannot hold a sleeping replica of `size` bytes in host memory,
        or None when it can (or the size is not known)."""
        if size <= 0:
            return None
        falling = sum(b for n, b in self._holding.values() if n == node.id)
        available = node.host.memory_available
        if node.host.memory_total and size + falling > available:
            return (
                f"asleep it would hold {decimal_size(size)} of host memory and the node has "
                f"{decimal_size(max(available - falling, 0))} available"
            )
        limit = node.limits.sleep_memory_max
        held = node.sleeping_memory() + falling
        if limit and held + size > limit:
            return (
                f"asleep it would hold {decimal_size(size)} of host memory, past the node's "
                f"--sleep-memory-max {decimal_size(limit)} ({decimal_size(held)} held by "
                "sleeping replicas)"
            )
        return None

    def _sleep(self, model: CatalogModel, node: Node, shard: Shard) -> None:
        self._falling[shard.id] = model.name
        idle = f"{model.sleep_after:g}s" if model.sleep_after is not None else "a while"
        message = (
            f"putting replica {shard.id} on node {node.id} to sleep: no request for {idle} "
            "(sleep_after); its GPU memory is released and the next request wakes it"
        )
        log.info("model %s: %s", model.name, message)
        self._event("sleep", model.name, node.id, message)
        self._spawn(self._run_sleep(model.name, node.id, shard.id), f"sleep {shard.id}")

    async def _run_sleep(self, model: str, node_id: str, shard_id: str) -> None:
        span = self._tracer.start_span(
            "llmgw.shard.sleep",
            attributes={
                "llmgw.model": model,
                "llmgw.replica": shard_id,
                "llmgw.node": node_id,
                "llmgw.sleep.level": SLEEP_LEVEL,
            },
        )
        began = self._clock()
        try:
            await self._dispatcher.sleep_shard(node_id, shard_id, SLEEP_LEVEL, self._timeout)
        except AgentServiceError as exc:
            log.warning("could not put replica %s to sleep: %s", shard_id, exc.message)
            self._event("sleep", model, node_id, f"replica {shard_id} did not sleep: {exc.message}")
            span.set_status(StatusCode.ERROR, exc.message)
        else:
            span.set_attribute("llmgw.sleep.seconds", self._clock() - began)
            if self._metrics is not None:
                self._metrics.slept(model)
        finally:
            span.end()
            self._falling.pop(shard_id, None)
            self._holding.pop(shard_id, None)
            self._wake_loop()

    async def _run_wake(self, wake: Wake) -> None:
        model = wake.model
        span = self._tracer.start_span(
            "llmgw.shard.wake",
            attributes={
                "llmgw.model": model,
                "llmgw.replica": wake.shard_id,
                "llmgw.node": wake.node_id,
            },
        )
        try:
            await self._dispatcher.wake_shard(wake.node_id, wake.shard_id, self._timeout)
        except AgentServiceError as exc:
            log.warning("could not wake replica %s: %s", wake.shard_id, exc.message)
            self._event(
                "wake", model, wake.node_id, f"replica {wake.shard_id} did not wake: {exc.message}"
            )
            span.set_status(StatusCode.ERROR, exc.message)
        else:
            seconds = self._clock() - wake.started
            span.set_attribute("llmgw.wake.seconds", seconds)
            self._last_wake[model] = (wake.shard_id, seconds)
            self._event(
                "woke",
                model,
                wake.node_id,
                f"replica {wake.shard_id} woke in {seconds:.2f} s",
            )
            if self._metrics is not None:
                self._metrics.woke(model, seconds)
        finally:
            span.end()
            self._waking.pop(wake.shard_id, None)
            self._wake_loop()


def dozing(demand: DemandBook, model: CatalogModel, now: float) -> bool:
    """Whether `model` is past its `sleep_after` with no request in flight: its
    replicas sleep, and one stopped to make room for another model is not replaced
    until a request asks for the model again (beyond its min_replicas)."""
    return _idle(demand, model, now)


def _idle(demand: DemandBook, model: CatalogModel, now: float) -> bool:
    if model.sleep_after is None or demand.in_flight(model.name) > 0:
        return False
    idle = demand.idle_for(model.name, now)
    return idle is not None and idle >= model.sleep_after
