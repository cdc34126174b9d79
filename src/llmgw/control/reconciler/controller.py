"""The reconciler's executor: keeps the fleet where the catalog and the demand say.

One `Controller` per server. Each step is synchronous and never awaits: it reads
the catalog and an inventory snapshot, works out how many replicas each model
wants now (`min_replicas`, raised to one while the model is in use or within
its `keep_alive`, and to what its load targets ask for: see `autoscale`), calls
the pure `plan()`, and starts one task per action (start, stop, drain) through
the `Dispatcher`. Steps run on an interval and at
once on every inventory or catalog change and every activation.

It also publishes Ready replicas to the router (through `EndpointPublisher`)
and takes them out *before* a stop is sent, and at once when their node is in
doubt (heartbeats missed): requests then wait as in an activation, while a
replacement starts elsewhere (see `plan`). A node whose agent's stream merely
closed keeps its replicas in the routers (`state.routable`): engines outlive
their agent, and the routers' health checks and connect errors take out one
whose engine is really gone. It keeps the failure history that
drives exponential backoff (retrying on another node where one fits), and
answers activations: concurrent requests for a model share one start. A
failure refuses waiting requests at once (with the engine's output) only when
it was a start that failed; when a replica that had served crashes, requests
wait for its replacement, within the activation timeout.

Every start is recorded first (`PlacementLedger`, the placement records in the
store), all the starts of one reconcile in one write, and only sent once the
record is written; a start whose record cannot be written is not sent (the
next reconcile places it again). A shard that ended takes its record with it,
and so does a node the operator removed. Only recorded shards reach the
inventory (the agent service refuses the others), so only they are published.

A model with `sleep_after` has its idle replicas put to sleep and woken by the
next request instead of a start (`sleep.SleepBook`); `keep_alive` stops them later.

A change to what a model's replicas run rolls them (`rollout`, inside `plan`):
new replicas first, old ones drain once new ones are Ready and routed to. A
replica of the new spec that fails stops the rollout (a `Halt`, kept in the
store through `RolloutLedger` so the next leader keeps it stopped); the old
replicas serve on until the spec changes again (an undo, a fix). A replica of a
model's canary that fails (crash, load timeout, refused start) stops the canary
the same way: it is not started again, its other replicas drain once the model's
own are Ready, until the canary changes or is aborted.

With a tracer, a reconcile step that acted is a span, with a child per start,
stop and drain and its result; an activation is a trace of its own (events when
a replica is placed and each state it reports: starting, downloading, loading,
ready), and the span of each request that waits for it gets a link to it.

Not guaranteed:
- Persistence. Replicas are what the agents report; demand and failure history
  live in this process and restart empty (running replicas are adopted, and
  their idle clock restarts).
- Scaling on the engines' latency (time to first token, time per token); the
  only wait a target reads is the routers' queues'. With no load target set a
  model runs `min_replicas`, or one while in use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Container, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry.trace import (
    Link,
    NoOpTracer,
    Span,
    StatusCode,
    Tracer,
    get_current_span,
    use_span,
)

from llmgw.control.agentsvc.dispatcher import Dispatcher
from llmgw.control.agentsvc.errors import AgentServiceError, CommandFailed
from llmgw.control.catalog.model import CatalogModel, canary_model
from llmgw.control.inventory import Change, Node, Shard, ShardSpec, UnknownNode
from llmgw.control.placements import Placement, PlacementError
from llmgw.control.reconciler.adapters import AdapterLoads
from llmgw.control.reconciler.autoscale import LoadSignals, replicas_for_load
from llmgw.control.reconciler.demand import DemandBook
from llmgw.control.reconciler.downloads import DownloadWatch
from llmgw.control.reconciler.errors import (
    ActivationDisabled,
    ActivationRefused,
    ActivationTimeout,
    NotInCatalog,
    ReplicaFailed,
    Unplaceable,
)
from llmgw.control.reconciler.plan import explain, plan
from llmgw.control.reconciler.rollbook import RolloutBook, RolloutLedger
from llmgw.control.reconciler.rollout import runs_current
from llmgw.control.reconciler.sleep import SleepBook, dozing
from llmgw.control.reconciler.state import (
    EndpointPublisher,
    Event,
    Failure,
    ModelState,
    ReadyEndpoint,
    Rollout,
    routable,
)
from llmgw.control.reconciler.types import (
    Actual,
    Desired,
    Explanation,
    Pending,
    PlacementPolicy,
    Start,
    Stop,
)
from llmgw.lifecycle import wait_for_event
from llmgw.metrics.activations import ActivationMetrics
from llmgw.store import ModelLoad

log = logging.getLogger("llmgw.control.reconciler")

# How long a client is told to wait when nothing can take its model: capacity
# rarely appears within seconds, and a tight retry loop only adds load.
UNPLACEABLE_RETRY_AFTER = 30
# An unplaceable model whose reason changes is recorded again, at most this often
# (reasons can name free memory that moves with every heartbeat).
UNPLACEABLE_REPEAT_SECONDS = 10.0
MAX_EVENTS = 500
# After a step, wait this many times its duration before the next (see `_coalesce`),
# never longer than MAX_COALESCE_S: 0.1 s at most added to an activation's wait.
STEP_SHARE = 3.0
MAX_COALESCE_S = 0.1
# The end of a failed start's message to API clients, which are not told why
# (the reason and engine output stay with operators).
_ASK_OPERATOR = (
    "an operator sees why with `llmgw models show {model}` or on the dashboard; retry later"
)


class CatalogView(Protocol):
    def models(self) -> list[CatalogModel]: ...

    def get(self, name: str) -> CatalogModel | None: ...

    def adapters(self, base: str | None = None) -> list[CatalogModel]: ...

    def entry(self, name: str) -> CatalogModel | None: ...

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]: ...


class PlacementLedger(Protocol):
    """Where starts are recorded before they are sent; the `PlacementBook` satisfies it."""

    async def record(self, placements: Sequence[Placement], /) -> None:
        """Write the records; raises `PlacementError` when they could not be."""
        ...

    def settled(self, shard_id: str, /, *, refused: bool) -> None: ...

    def forget(self, shard_ids: Iterable[str], /) -> None: ...

    def forget_node(self, node_id: str, /) -> None: ...


class InventoryView(Protocol):
    def nodes(self) -> list[Node]: ...

    def node(self, node_id: str, /) -> Node: ...

    def subscribe(self, listener: Callable[[Change], None]) -> Callable[[], None]: ...

    def forget_shard(self, node_id: str, shard_id: str) -> None: ...


@dataclass(slots=True)
class _Health:
    failures: int = 0
    retry_at: float = 0.0
    last: Failure | None = None
    # The last failure was a replica that had served (a crash, not a start that
    # failed): requests wait for its replacement instead of being refused.
    in_service: bool = False
    avoid: set[str] = field(default_factory=set)
    avoid_ports: set[tuple[str, int]] = field(default_factory=set)


@dataclass(slots=True)
class _LoadTarget:
    """Replicas wanted for load, held at `count` until load stays lower long enough."""

    count: int
    since: float


@dataclass(slots=True)
class _Activation:
    future: asyncio.Future[None]
    started: float
    # The activation's own trace (a non-recording span when tracing is off).
    span: Span | None = None


class Controller:
    """Runs the reconcile loop; answers activations and the admin API's questions."""

    def __init__(
        self,
        *,
        catalog: CatalogView,
        inventory: InventoryView,
        dispatcher: Dispatcher,
        placements: PlacementLedger,
        publisher: EndpointPublisher,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
        policy: PlacementPolicy,
        interval: float,
        retry_base: float,
        retry_max: float,
        activation_timeout: float,
        stop_grace: float,
        startup_grace: float = 0.0,
        adoption_grace: float | None = None,
        leading: Callable[[], bool] = lambda: True,
        new_shard_id: Callable[[str], str] | None = None,
        abandon: Callable[[Sequence[str]], object] | None = None,
        mgmt_interface: str = "",
        router_load: Callable[[], Mapping[str, ModelLoad]] | None = None,
        tracer: Tracer | None = None,
        activation_metrics: ActivationMetrics | None = None,
        rollouts: RolloutLedger | None = None,
        canary_halts: RolloutLedger | None = None,
        routed: Callable[[str], bool] | None = None,
    ) -> None:
        """`router_load` reads this server's router's load signals by model name (or
        alias), for the load targets. `startup_grace`: for this long after `run()`
        starts, an activation that cannot be placed waits instead of failing at once,
        since agents are still reconnecting after a (re)start. `adoption_grace`
        (default: the same): for this long, replicas that were Ready before (`run`'s
        `expected`) are waited for, and kept in the router, rather than started again;
        the node-lost window is right, since that is when their node would be given up
        too. `leading` says whether this server may place work (it holds the lease).
        `abandon(ids)` is told once about replicas whose node stopped answering (this
        server's router moves requests still waiting on them). `mgmt_interface`: the
        network multi-node ranks talk over (`control.mgmt_interface`; see `mgmt`).
        `tracer`: spans for reconciles that act and activations (default: none).
        `rollouts`: where stopped rollouts are kept, so the next leader keeps them
        stopped (default: in this process only); `canary_halts` the same for canaries a
        failing replica stopped. `routed(replica_id)`: whether this
        server's router routes to a Ready replica (it checks each one it is given
        first); a rollout drains an old replica only once its replacement is routed to
        (default: Ready is enough)."""
        self._tracer = tracer or NoOpTracer()
        self._activation_metrics = activation_metrics
        self._catalog = catalog
        self._inventory = inventory
        self._dispatcher = dispatcher
        self._placements = placements
        self._publisher = publisher
        self._clock = clock
        self._wall_clock = wall_clock
        self._policy: PlacementPolicy = policy
        self._mgmt_interface = mgmt_interface
        self._interval = interval
        self._retry_base = retry_base
        self._retry_max = retry_max
        self._activation_timeout = activation_timeout
        self._stop_grace = stop_grace
        self._startup_grace = startup_grace
        self._grace_until = -math.inf
        self._adoption_grace = startup_grace if adoption_grace is None else adoption_grace
        self._adopt_until = -math.inf
        self._new_shard_id = new_shard_id or _new_shard_id
        self._leading = leading
        self._abandon = abandon
        self._abandoned: frozenset[str] = frozenset()
        self._router_load = router_load
        self.demand = DemandBook(
            clock=clock, wall_clock=wall_clock, local_load=self._canonical_load
        )
        self._expected: dict[str, set[str]] = {}
        self._standby_waits: dict[str, asyncio.Future[None]] = {}
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: dict[str, Pending] = {}
        self._stopping: set[str] = set()
        self._stop_requested: set[str] = set()
        self._health: dict[str, _Health] = {}
        self._activations: dict[str, _Activation] = {}
        self._unplaced: dict[str, Explanation] = {}
        # The reason last recorded as an `unplaceable` event per model, and when.
        self._unplaced_noted: dict[str, tuple[str, float]] = {}
        # Per model, its replicas on unreachable nodes (not counted, being replaced).
        self._in_doubt: dict[str, tuple[str, ...]] = {}
        self._targets: dict[str, int] = {}
        self._load: dict[str, _LoadTarget] = {}
        self._published: dict[str, tuple[tuple[str, ...], tuple[ReadyEndpoint, ...]]] = {}
        self._seen_shards: set[str] = set()
        # Shards that reported ready (a later failure is a crash in service).
        self._served: set[str] = set()
        self._events: deque[Event] = deque(maxlen=MAX_EVENTS)
        # Hub downloads the nodes report, told as events (start, quarters, end).
        self._downloads = DownloadWatch()
        self._routed = routed
        self._sleep = SleepBook(
            dispatcher=dispatcher,
            clock=clock,
            tracer=self._tracer,
            spawn=self._spawn,
            event=self._event,
            wake_loop=self._wake.set,
            command_timeout=activation_timeout,
            metrics=activation_metrics,
        )
        self._adapter_loads = AdapterLoads(
            catalog=catalog,
            nodes=inventory.nodes,
            dispatcher=dispatcher,
            clock=clock,
            activate_base=self.activate,
            published=self.has_ready,
            publish=lambda: self._publish(self._inventory.nodes()),
            leading=leading,
            ask_leader=self._activate_through_leader,
            wait_seconds=activation_timeout,
            spawn=self._spawn,
        )
        self._rollout_book = RolloutBook(
            ledger=rollouts,
            canary_ledger=canary_halts,
            event=lambda model, message: self._event("rollout", model, "", message),
            spawn=self._spawn,
            wall_clock=wall_clock,
        )

    # ---- the loop ----

    async def run(self, *, expected: Mapping[str, Iterable[str]] | None = None) -> None:
        """Reconcile until cancelled (one leadership term); in-flight commands are
        cancelled with it. `expected`: replica ids per model that were Ready under
        the previous leader; they are adopted when their nodes report them."""
        self._new_term(expected or {})
        await self._rollout_book.read()
        unsubscribe = (
            self._inventory.subscribe(self._on_inventory),
            self._catalog.subscribe(self._wake.set),
        )
        self._grace_until = self._clock() + self._startup_grace
        self._adopt_until = self._clock() + self._adoption_grace
        try:
            while True:
                self._wake.clear()
                # The step's own cost, not the injected clock: it sizes the pause.
                started = time.perf_counter()
                self.step()
                took = time.perf_counter() - started
                await wait_for_event(self._wake, self._interval)
                await self._coalesce(took)
        finally:
            for undo in unsubscribe:
                undo()
            for task in tuple(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks)
            for name, activation in self._activations.items():
                stopped = ActivationRefused(
                    "the control plane on this server stopped (shutdown, or another "
                    "server took over); retry",
                    retry_after=1,
                )
                self._activation_ended(name, activation, stopped, self._clock())
                if not activation.future.done():
                    activation.future.set_exception(stopped)
                    # Nobody may be waiting any more; do not log it as unretrieved.
                    activation.future.exception()
            self._activations.clear()

    async def _coalesce(self, took: float) -> None:
        """After a step that took `took` seconds, let wakes pile up for `STEP_SHARE`
        times as long before the next one.

        Every report wakes the loop; in a storm (thousands of nodes registering at
        once) a step per wake would spend the event loop on whole-fleet plans and
        starve the streams and the API. Waiting in proportion to the step's own cost
        bounds the reconciler's share of the loop at 1 / (1 + STEP_SHARE) and folds
        the wakes of that time into one step; on a small fleet a step takes
        milliseconds, so the delay is too."""
        pause = min(STEP_SHARE * took, MAX_COALESCE_S)
        if pause > 0:
            await asyncio.sleep(pause)

    def _new_term(self, expected: Mapping[str, Iterable[str]]) -> None:
        self._pending.clear()
        self._stopping.clear()
        self._stop_requested.clear()
        self._seen_shards.clear()
        self._published.clear()
        self._unplaced.clear()
        self._unplaced_noted.clear()
        self._expected = {model: set(ids) for model, ids in expected.items() if ids}
        # Requests that were waiting for another leader now wait for this one.
        now = self._clock()
        for name, future in self._standby_waits.items():
            if not future.done():
                self._activations[name] = _Activation(future, now)
        self._standby_waits.clear()

    def wake(self) -> None:
        """Reconcile soon (the loop's next turn)."""
        self._wake.set()

    def step(self) -> None:
        """One reconcile: plan, start the actions, publish, answer waiting activations."""
        if not self._leading():
            return
        now = self._clock()
        nodes = self._inventory.nodes()
        models = self._catalog.models()
        self._adopt(nodes, now)
        self._settle_expected(nodes, now)
        self._confirm_pending(nodes)
        self.demand.read_local_load()
        desired = [self._desired(model, now) for model in models]
        self._targets = {d.model.name: d.replicas for d in desired}
        result = plan(
            desired,
            Actual(
                nodes=nodes,
                pending=tuple(self._pending.values()),
                stopping=frozenset(self._stopping),
                settling=now < self._adopt_until,
                routed=self._routed_ids(nodes),
            ),
            policy=self._policy,
            new_shard_id=self._new_shard_id,
            mgmt_interface=self._mgmt_interface,
        )
        self._note_unplaced(result.unplaced, now)
        self._rollout_book.planned(result.rolling)
        self._unplaced = dict(result.unplaced)
        self._in_doubt = dict(result.in_doubt)
        doubted = frozenset(i for ids in result.in_doubt.values() for i in ids)
        fresh = doubted - self._abandoned
        self._abandoned = doubted
        if fresh and self._abandon is not None:
            self._abandon(sorted(fresh))
        acted = [a for a in result.actions if isinstance(a, Start) or a.reason != "ended"]
        if acted:
            with self._tracer.start_as_current_span(
                "llmgw.reconcile",
                attributes={
                    "llmgw.starts": sum(isinstance(a, Start) for a in acted),
                    "llmgw.stops": sum(not isinstance(a, Start) for a in acted),
                },
            ):
                # Tasks spawned here carry the span: each start or stop is its child.
                self._act(result.actions)
        else:
            self._act(result.actions)
        self._sleep.step(models, nodes, self.demand, self._wanted(), now)
        self._adapter_loads.load_for_others(self.demand.remote_wanted(), self._spawn)
        # After the stops are marked: a stopping replica leaves the router before
        # its engine hears of it.
        self._publish(self._inventory.nodes())
        self._settle_activations(now)

    def _act(self, actions: Sequence[Start | Stop]) -> None:
        starts = []
        for action in actions:
            if isinstance(action, Start):
                self._start(action)
                starts.append(action)
            else:
                self._stop(action)
        if starts:
            # One write records them all (a multi-node replica's shards together).
            self._spawn(self._record_and_start(starts), f"start {len(starts)} shard(s)")

    def _wanted(self) -> set[str]:
        """Models a request waits for, here or on another server (by canonical name)."""
        wanted = set(self._activations)
        for name in self.demand.remote_wanted():
            model = self._catalog.get(name)
            if model is not None:
                wanted.add(model.name)
        return wanted

    def _routed_ids(self, nodes: Sequence[Node]) -> frozenset[str] | None:
        """The Ready replicas this server's router routes to (None: not known here)."""
        if self._routed is None:
            return None
        return frozenset(
            shard.id
            for node in nodes
            for shard in node.shards.values()
            if shard.state == "ready" and self._routed(shard.id)
        )

    def rollout(self, name: str) -> Rollout | None:
        """Where the model's rollout stands; None when every replica runs its spec."""
        model = self._catalog.get(name)
        return None if model is None else self._rollout_book.state(model)

    def _note_unplaced(self, unplaced: Mapping[str, Explanation], now: float) -> None:
        """An `unplaceable` event when a model becomes unplaceable, and again when the
        reason changes (e.g. "no nodes registered", then "node-a: 1 of 2 GPUs free")."""
        for model_name, explanation in unplaced.items():
            summary = explanation.summary()
            noted = self._unplaced_noted.get(model_name)
            if noted is not None and (
                noted[0] == summary or now - noted[1] < UNPLACEABLE_REPEAT_SECONDS
            ):
                continue
            log.warning("%s", summary)
            self._event("unplaceable", model_name, "", summary)
            self._unplaced_noted[model_name] = (summary, now)
        for model_name in [m for m in self._unplaced_noted if m not in unplaced]:
            del self._unplaced_noted[model_name]

    # ---- demand ----

    def request_started(self, name: str) -> None:
        """The router began a request for `name` (a model, an adapter or an alias); a
        request for an adapter is demand for its base too."""
        adapter = self._adapter_loads.adapter(name)
        if adapter is not None and adapter.adapter_of is not None:
            self._adapter_loads.started(adapter)
            name = adapter.adapter_of
        model = self._catalog.get(name)
        if model is not None:
            self.demand.started(model.name)
            if model.target_in_flight:
                # More load than the replicas wanted now: reconcile at once, not
                # at the next interval.
                held = self._load.get(model.name)
                need = math.ceil(self.demand.in_flight(model.name) / model.target_in_flight)
                if min(need, model.max_replicas) > (held.count if held is not None else 0):
                    self._wake.set()

    def request_finished(self, name: str) -> None:
        """The router finished a request for `name`; the idle clock starts now."""
        adapter = self._adapter_loads.adapter(name)
        if adapter is not None and adapter.adapter_of is not None:
            self._adapter_loads.finished(adapter)
            name = adapter.adapter_of
        model = self._catalog.get(name)
        if model is not None:
            self.demand.finished(model.name)

    def saturated(self, name: str) -> None:
        """The router found every replica serving `name` full. For an adapter: load it on
        one more replica of its base, in the background (`AdapterLoads.spread`)."""
        adapter = self._adapter_loads.adapter(name)
        if adapter is not None and adapter.adapter_of is not None:
            self._adapter_loads.spread(adapter)

    def knows(self, name: str) -> bool:
        """Whether `name` is a catalog model or adapter (or alias) that activation applies to."""
        return self._catalog.entry(name) is not None

    def starting_note(self, name: str) -> str | None:
        """What a starting replica of catalog model `name` is doing, when its node says
        (`downloading org/name@abc1234: 41% of 15.2 GB, 2 min left`); None otherwise.
        Only the leader's inventory holds shard reports: a standby has nothing to say."""
        model = self._catalog.get(name)
        if model is None:
            return None
        for node in self._inventory.nodes():
            for shard in node.shards.values():
                if (
                    shard.model == model.name
                    and shard.state == "starting"
                    and shard.message.startswith("downloading")
                ):
                    return shard.message
        return None

    def engines(self, name: str) -> tuple[str, ...]:
        """The engines the profiles of catalog model `name` run, in profile order (an
        adapter's: its base's)."""
        adapter = self._adapter_loads.adapter(name)
        model = self._catalog.get(adapter.adapter_of if adapter and adapter.adapter_of else name)
        if model is None:
            return ()
        return tuple(dict.fromkeys(profile.engine for profile in model.profiles))

    def _desired(self, model: CatalogModel, now: float) -> Desired:
        wanted = model.min_replicas
        if self.demand.wants(model, now, activating=model.name in self._activations):
            wanted = max(wanted, 1)
        if model.scales_on_load:
            wanted = max(wanted, self._for_load(model, now))
        health = self._health.get(model.name)
        # An idle model past sleep_after keeps the replicas it has (asleep) but starts
        # none: one stopped to make room for another model comes back on request.
        asleep = (
            model.min_replicas == 0
            and model.name not in self._activations
            and dozing(self.demand, model, now)
        )
        return Desired(
            model=model,
            replicas=min(wanted, model.max_replicas),
            # Replicas Ready under the previous leader are waited for, not duplicated.
            hold=model.name in self._expected
            or (health is not None and now < health.retry_at)
            or asleep,
            avoid_nodes=frozenset(health.avoid) if health is not None else frozenset(),
            avoid_ports=frozenset(health.avoid_ports) if health is not None else frozenset(),
            halted=self._rollout_book.halted(model),
            canary_halted=self._rollout_book.canary_halted(model) is not None,
        )

    def _canonical_load(self) -> dict[str, ModelLoad]:
        """The router's load signals by canonical model name (queues are by the name
        clients sent, which may be an alias)."""
        if self._router_load is None:
            return {}
        merged: dict[str, ModelLoad] = {}
        for name, load in self._router_load().items():
            model = self._catalog.get(name)
            if model is None:
                continue
            seen = merged.get(model.name)
            merged[model.name] = (
                load
                if seen is None
                else ModelLoad(
                    seen.queued + load.queued,
                    max(seen.queue_wait, load.queue_wait),
                    seen.replicas + load.replicas,
                )
            )
        return merged

    def load_signals(self, model: CatalogModel) -> LoadSignals:
        """The model's load over every server, on its Ready (published) replicas."""
        entry = self._published.get(model.name)
        ready = {e.id for e in entry[1]} if entry is not None else set()
        return self.demand.signals(model.name, ready)

    def check_load(self) -> None:
        """New load signals arrived: reconcile at once if a model needs more replicas
        than it has (lower counts wait for the next reconcile anyway)."""
        self.demand.read_local_load()
        for model in self._catalog.models():
            if not (model.target_queue_depth or model.target_queue_wait or model.target_kv_use):
                continue
            need, _ = replicas_for_load(model, self.load_signals(model))
            held = self._load.get(model.name)
            if need > (held.count if held is not None else 0):
                self._wake.set()
                return

    def _for_load(self, model: CatalogModel, now: float) -> int:
        """Replicas for the load (all servers), as the model's targets ask.

        A higher count applies at once; a lower one only after the load has
        stayed below the held count for `scale_down_delay` (each time the held
        count is needed again, the wait starts over).
        """
        need, reason = replicas_for_load(model, self.load_signals(model))
        held = self._load.get(model.name)
        if held is not None and need < held.count and now - held.since < model.scale_down_delay:
            return held.count
        changed = held is None or need != held.count
        if changed and (need > 1 or (held is not None and held.count > 1)):
            lower = held is not None and need < held.count
            self._event(
                "scale",
                model.name,
                "",
                (f"load lower for {model.scale_down_delay:g} s: " if lower else "")
                + f"{reason}: {need} replica{'' if need == 1 else 's'} for the load",
            )
        self._load[model.name] = _LoadTarget(need, now)
        return need

    def _adopt(self, nodes: Sequence[Node], now: float) -> None:
        """Shards first seen running (adopted after a restart) count as recent use."""
        for node in nodes:
            for shard in node.shards.values():
                if shard.state == "ready":
                    self._served.add(shard.id)
                if shard.id in self._seen_shards or not shard.holds_gpus:
                    continue
                self._seen_shards.add(shard.id)
                model = self._catalog.get(shard.model)
                if model is not None and shard.id not in self._pending:
                    self.demand.adopt(model.name)

    def _settle_expected(self, nodes: Sequence[Node], now: float) -> None:
        """Stop waiting for the previous term's replicas once seen, or once the grace ends."""
        if not self._expected:
            return
        if now >= self._adopt_until:
            missing = sorted(f"{m}: {', '.join(sorted(ids))}" for m, ids in self._expected.items())
            log.warning(
                "replicas Ready before this term did not come back within the grace "
                "period; placing anew (%s)",
                "; ".join(missing),
            )
            self._expected.clear()
            return
        for node in nodes:
            if node.state == "lost":
                continue
            for shard in node.shards.values():
                ids = self._expected.get(shard.model)
                if ids is not None:
                    ids.discard(shard.id)
                    if not ids:
                        del self._expected[shard.model]

    def _confirm_pending(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            for shard_id in node.shards:
                self._pending.pop(shard_id, None)

    # ---- actions ----

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start(self, action: Start) -> None:
        spec = action.spec
        self._pending[spec.shard_id] = Pending(action.node_id, spec)
        self._seen_shards.add(spec.shard_id)
        gpus = ",".join(map(str, spec.gpu_indices)) or "none"
        message = (
            f"starting replica {spec.shard_id} on node {action.node_id} "
            f"(profile {action.profile}, engine {spec.engine}, GPUs {gpus}, port {spec.port})"
        )
        doubted = self._in_doubt.get(action.model)
        if doubted:
            message += (
                f"; it replaces {', '.join(doubted)}, on a node that stopped answering "
                "(kept there in case the node comes back)"
            )
        log.info(
            "model %s: %s",
            action.model,
            message,
            extra={"model": action.model, "node": action.node_id, "replica": spec.shard_id},
        )
        self._event("start", action.model, action.node_id, message)
        activation = self._activations.get(action.model)
        if activation is not None and activation.span is not None:
            activation.span.add_event(
                "placed",
                {
                    "llmgw.replica": spec.shard_id,
                    "llmgw.node": action.node_id,
                    "llmgw.profile": action.profile,
                },
            )

    async def _record_and_start(self, starts: Sequence[Start]) -> None:
        """Record the placements, then send the starts (each on its own)."""
        try:
            await self._placements.record(
                [Placement(node_id=a.node_id, profile=a.profile, spec=a.spec) for a in starts]
            )
        except PlacementError as exc:
            for action in starts:
                shard_id = action.spec.shard_id
                self._pending.pop(shard_id, None)
                self._seen_shards.discard(shard_id)
                message = (
                    f"replica {shard_id} was not started on node {action.node_id}: its placement "
                    f"could not be recorded ({exc}); the next reconcile places it again"
                )
                log.warning("model %s: %s", action.model, message)
                self._event("start", action.model, action.node_id, message)
            self._wake.set()
            return
        for action in starts:
            self._spawn(self._run_start(action), f"start {action.spec.shard_id}")

    async def _run_start(self, action: Start) -> None:
        spec = action.spec
        refused = False
        span = self._tracer.start_span(
            "llmgw.shard.start",
            attributes={
                "llmgw.model": action.model,
                "llmgw.replica": spec.shard_id,
                "llmgw.node": action.node_id,
                "llmgw.profile": action.profile,
                "llmgw.engine": spec.engine,
            },
        )
        try:
            await self._dispatcher.start_shard(action.node_id, spec)
        except AgentServiceError as exc:
            span.set_status(StatusCode.ERROR, exc.message)
            # Only a refusal says the engine was not started; a timeout or a broken
            # stream may hide a start, so its record stays until the node says.
            refused = isinstance(exc, CommandFailed)
            self._failed(
                action.model, action.node_id, spec.shard_id, exc.message, (), None, spec.port
            )
            self._rollout_book.failed(
                self._catalog.get(action.model), spec.shard_id, spec, exc.message
            )
        finally:
            span.end()
            self._placements.settled(spec.shard_id, refused=refused)
            self._pending.pop(spec.shard_id, None)
            self._wake.set()

    def _stop(self, action: Stop) -> None:
        if action.reason == "ended":
            # The agent forgets a shard once it reported it stopped or failed; the
            # failure (if any) is kept in the model's history.
            self._stop_requested.discard(action.shard_id)
            self._seen_shards.discard(action.shard_id)
            self._inventory.forget_shard(action.node_id, action.shard_id)
            self._placements.forget([action.shard_id])
            return
        self._stopping.add(action.shard_id)
        self._stop_requested.add(action.shard_id)
        why = {
            "scale_down": "not needed now",
            "node_draining": "its node is draining and a replacement is ready",
            "not_in_catalog": "its model is no longer in the catalog",
            "gang_broken": "another shard of its multi-node replica is gone",
            "rollout": "it runs the model's previous spec, and enough new replicas are Ready",
            "make_room": "it sleeps, and its GPUs are needed",
        }[action.reason]
        message = f"stopping replica {action.shard_id} on node {action.node_id}: {why}"
        if action.detail:
            message += f" ({action.detail})"
        log.info(
            "model %s: %s",
            action.model,
            message,
            extra={"model": action.model, "node": action.node_id, "replica": action.shard_id},
        )
        self._event("stop", action.model, action.node_id, message)
        self._spawn(self._run_stop(action), f"stop {action.shard_id}")

    async def _run_stop(self, action: Stop) -> None:
        span = self._tracer.start_span(
            "llmgw.shard.drain" if action.drain else "llmgw.shard.stop",
            attributes={
                "llmgw.model": action.model,
                "llmgw.replica": action.shard_id,
                "llmgw.node": action.node_id,
                "llmgw.reason": action.reason,
            },
        )
        try:
            if action.drain:
                await self._dispatcher.drain_shard(
                    action.node_id, action.shard_id, self._stop_grace
                )
            else:
                await self._dispatcher.stop_shard(action.node_id, action.shard_id, self._stop_grace)
        except AgentServiceError as exc:
            # Planned again on the next step (a node that reconnects gets it then).
            log.warning("could not stop replica %s: %s", action.shard_id, exc.message)
            span.set_status(StatusCode.ERROR, exc.message)
            self._stop_requested.discard(action.shard_id)
        finally:
            span.end()
            self._stopping.discard(action.shard_id)
            self._wake.set()

    # ---- reports ----

    def _on_inventory(self, change: Change) -> None:
        """Called synchronously by the inventory: note failures, readiness and node
        transitions, then wake."""
        if change.kind == "shard_status" and change.shard_id is not None:
            shard = self._find_shard(change.node_id, change.shard_id)
            if shard is not None:
                self._on_shard(change.node_id, shard)
        elif change.kind == "node_removed":
            self._placements.forget_node(change.node_id)
            self._downloads.forget_node(change.node_id)
        elif change.kind != "shard_removed":
            node = self._find_node(change.node_id)
            if node is not None:
                self._event("node", "", node.id, _node_message(change, node))
        self._wake.set()

    def _find_node(self, node_id: str) -> Node | None:
        # One node by id: every report calls this, so copying the whole fleet
        # here made a storm of registrations quadratic.
        try:
            return self._inventory.node(node_id)
        except UnknownNode:
            return None

    def _find_shard(self, node_id: str, shard_id: str) -> Shard | None:
        node = self._find_node(node_id)
        return node.shards.get(shard_id) if node is not None else None

    def _on_shard(self, node_id: str, shard: Shard) -> None:
        model = self._catalog.get(shard.model)
        name = model.name if model is not None else shard.model
        for text in self._downloads.observe(node_id, shard, self._wall_clock()):
            self._event("download", name, node_id, text)
        activation = self._activations.get(name)
        if activation is not None and activation.span is not None:
            activation.span.add_event(
                shard.state, {"llmgw.replica": shard.id, "llmgw.node": node_id}
            )
        if shard.state == "ready":
            self._served.add(shard.id)
            health = self._health.pop(name, None)
            if health is not None and health.failures:
                log.info("model %s is ready again after %d failures", name, health.failures)
            self._event(
                "ready", name, node_id, f"replica {shard.id} is ready at {shard.endpoint_url}"
            )
        elif shard.state == "stopped" and shard.id not in self._stop_requested:
            # An agent stops an engine on its own only on purpose (shutting down with
            # --stop-engines-on-exit, or an adopted engine no control plane confirmed):
            # a stop, not an engine failure, so no backoff; the plan places it again.
            message = f"replica {shard.id} was stopped by its agent: {shard.message or 'no reason'}"
            log.info("model %s: %s", name, message)
            self._event("stop", name, node_id, message)
        elif shard.state == "failed" and shard.id not in self._stop_requested:
            message = shard.message or "the engine failed"
            port = shard.spec.port if shard.spec is not None else 0
            in_service = shard.id in self._served
            self._failed(
                name,
                node_id,
                shard.id,
                message,
                shard.output_tail,
                shard.exit_code,
                port,
                in_service=in_service,
            )
            self._rollout_book.failed(model, shard.id, shard.spec, message)
        if shard.state in ("failed", "stopped"):
            self._served.discard(shard.id)

    def _failed(
        self,
        model: str,
        node_id: str,
        shard_id: str,
        message: str,
        output_tail: tuple[str, ...],
        exit_code: int | None,
        port: int,
        *,
        in_service: bool = False,
    ) -> None:
        health = self._health.setdefault(model, _Health())
        health.failures += 1
        health.in_service = in_service
        delay = min(self._retry_base * 2 ** (health.failures - 1), self._retry_max)
        health.retry_at = self._clock() + delay
        health.avoid.add(node_id)
        if port:
            # Another program may hold it: the retry on this node takes another port.
            health.avoid_ports.add((node_id, port))
        health.last = Failure(
            model, node_id, shard_id, message, output_tail, exit_code, self._wall_clock()
        )
        text = health.last.describe()
        log.warning(
            "model %s: %s; retrying in %.0f s",
            model,
            text,
            delay,
            extra={"model": model, "node": node_id, "replica": shard_id},
        )
        self._event("failed", model, node_id, f"{text}; retrying in {delay:.0f} s")
        self._wake.set()

    # ---- publishing ----

    def _publish(self, nodes: Sequence[Node]) -> None:
        ready: dict[str, list[ReadyEndpoint]] = {}
        for node in nodes:
            # A node in doubt (heartbeats missed) may be gone with its engines:
            # requests wait for a replica rather than try it.
            if not routable(node):
                continue
            for shard in node.shards.values():
                # Only rank 0 of a multi-node replica serves; the other ranks are never published.
                rank = shard.spec.node_rank if shard.spec is not None else 0
                if (
                    shard.state == "ready"
                    and shard.endpoint_url
                    and shard.id not in self._stopping
                    and shard.id not in self._sleep.falling
                    and rank == 0
                ):
                    spec = shard.spec
                    engine, args = (spec.engine, spec.engine_args) if spec else ("", ())
                    ready.setdefault(shard.model, []).append(
                        ReadyEndpoint(
                            shard.id,
                            shard.endpoint_url,
                            engine,
                            args,
                            version=self._version_of(shard.model, spec),
                        )
                    )
                    # The adapters its engine has loaded are served there by their names.
                    for name in shard.adapters:
                        ready.setdefault(name, []).append(
                            ReadyEndpoint(shard.id, shard.endpoint_url, engine, args)
                        )
        self._publish_ready(ready, skip=self._expected)

    def _publish_ready(
        self, ready: Mapping[str, Sequence[ReadyEndpoint]], *, skip: Container[str] = ()
    ) -> None:
        """Hand every catalog model's Ready endpoints to the publisher, when changed;
        models in `skip` keep what they have (replicas not yet adopted)."""
        current: set[str] = set()
        computed: dict[str, tuple[ReadyEndpoint, ...]] = {}
        for model in self._catalog.models():
            current.add(model.name)
            if model.name in skip:
                continue
            endpoints = tuple(
                sorted(
                    _with_version(model, _with_engine(model, ready.get(model.name, ()))),
                    key=lambda e: e.id,
                )
            )
            computed[model.name] = endpoints
            self._publish_entry(model, endpoints)
        for adapter in self._catalog.adapters():
            base = self._catalog.get(adapter.adapter_of or "")
            if base is None or base.name in skip:
                continue
            current.add(adapter.name)
            # The base's replicas (as published for it: engine, version) whose engines
            # have the adapter loaded; an adapter of that name loaded into another
            # model's engine (by hand) is not this catalog adapter.
            loaded = {e.id for e in ready.get(adapter.name, ())}
            endpoints = tuple(
                dataclasses.replace(e, base_names=base.names)
                for e in computed.get(base.name, ())
                if e.id in loaded
            )
            self._publish_entry(adapter, endpoints)
        for name in [n for n in self._published if n not in current]:
            names, _ = self._published.pop(name)
            self._publisher.withdraw(names)

    def _publish_entry(self, model: CatalogModel, endpoints: tuple[ReadyEndpoint, ...]) -> None:
        """Hand one model's (or adapter's) endpoints to the publisher, when changed."""
        entry = (model.names, endpoints)
        previous = self._published.get(model.name)
        if previous == entry:
            return
        if previous is not None:
            gone = [n for n in previous[0] if n not in model.names]
            if gone:
                self._publisher.withdraw(gone)
        self._publisher.publish(model.names, endpoints)
        self._published[model.name] = entry

    def _version_of(self, name: str, spec: ShardSpec | None) -> str:
        """The version a replica of model `name` runs: its canary's name when it runs the
        canary's spec, else the model's own version's; "" for a model without a canary."""
        model = self._catalog.get(name)
        if model is None or model.canary is None:
            return ""
        canary = canary_model(model)
        if canary is not None and spec is not None and runs_current(canary, spec):
            return model.canary.name
        return model.canary.stable_name

    def apply_followed(self, ready: Mapping[str, Sequence[ReadyEndpoint]]) -> None:
        """A standby's view: the Ready endpoints the leader published, by model."""
        self._publish_ready(ready)
        for name, future in tuple(self._standby_waits.items()):
            if self.has_ready(name):
                del self._standby_waits[name]
                self.demand.served(name)
                if not future.done():
                    future.set_result(None)

    def has_ready(self, name: str) -> bool:
        entry = self._published.get(name)
        return entry is not None and bool(entry[1])

    # ---- activation ----

    async def activate(self, name: str) -> None:
        """Wait until `name` has a ready replica, starting one if needed.

        Raises an `ActivationRefused` subclass saying why not; concurrent callers
        for one model share one activation. For an adapter: until a Ready replica of
        its base has it loaded (`AdapterLoads`).
        """
        adapter = self._adapter_loads.adapter(name)
        if adapter is not None:
            await self._adapter_loads.ensure(adapter)
            return
        model = self._catalog.get(name)
        if model is None:
            raise NotInCatalog(f"model '{name}' is not in the catalog", retry_after=1)
        if self.has_ready(model.name):
            return
        if not self._leading():
            await self._activate_through_leader(model)
            return
        now = self._clock()
        activation = self._activations.get(model.name)
        waiter = get_current_span()
        if activation is None:
            self._refuse_early(model, now)
            # A trace of its own (it outlives the request that asked), linked to it.
            requester = waiter.get_span_context()
            span = self._tracer.start_span(
                "llmgw.activation",
                context=otel_context.Context(),
                attributes={"llmgw.model": model.name},
                links=[Link(requester)] if requester.is_valid else None,
            )
            activation = _Activation(asyncio.get_running_loop().create_future(), now, span)
            self._activations[model.name] = activation
            self.demand.want(model.name)
            log.info("activating model %s on request", model.name)
            self._event("activate", model.name, "", "a request asked for it")
            with use_span(span, end_on_exit=False):
                self.step()
        if activation.span is not None and activation.span.get_span_context().is_valid:
            waiter.add_link(activation.span.get_span_context(), {"llmgw.link": "activation"})
        try:
            async with asyncio.timeout(self._activation_timeout):
                await asyncio.shield(activation.future)
        except TimeoutError:
            raise ActivationTimeout(
                f"model '{model.name}' did not become ready within "
                f"{self._activation_timeout:g} s ({self._progress(model.name)}); retry later",
                retry_after=math.ceil(self._interval),
            ) from None

    async def _activate_through_leader(self, model: CatalogModel) -> None:
        """A standby cannot place: it reports the demand for the leader to act on,
        then waits until the leader publishes a Ready replica (for an adapter: one
        that has it loaded)."""
        if not model.activation and model.adapter_of is None:
            raise ActivationDisabled(
                f"model '{model.name}' is not running and is not started on request "
                "(activation: false)",
                retry_after=UNPLACEABLE_RETRY_AFTER,
            )
        future = self._standby_waits.get(model.name)
        if future is None or future.done():
            future = self._standby_waits[model.name] = asyncio.get_running_loop().create_future()
            what = "load adapter" if model.adapter_of is not None else "start model"
            log.info("asking the leader to %s %s for a request", what, model.name)
        self.demand.want(model.name)
        try:
            async with asyncio.timeout(self._activation_timeout):
                await asyncio.shield(future)
        except TimeoutError:
            kind = "adapter" if model.adapter_of is not None else "model"
            does = "loads adapters" if model.adapter_of is not None else "places replicas"
            raise ActivationTimeout(
                f"{kind} '{model.name}' did not become ready within "
                f"{self._activation_timeout:g} s (this server is a standby; the leader "
                f"{does}); retry later",
                retry_after=math.ceil(self._interval),
            ) from None

    def _refuse_early(self, model: CatalogModel, now: float) -> None:
        """Refuse at once what waiting cannot fix: disabled activation, a backoff."""
        serving = self._serving(model.name)
        if not model.activation and not serving:
            raise ActivationDisabled(
                f"model '{model.name}' is not running and is not started on request "
                "(activation: false); an operator starts it with "
                f"`llmgw models activate {model.name}` or min_replicas",
                retry_after=UNPLACEABLE_RETRY_AFTER,
            )
        health = self._health.get(model.name)
        if (
            health is not None
            and now < health.retry_at
            and health.last
            and not serving
            and not health.in_service
        ):
            raise ReplicaFailed(
                f"model '{model.name}' is failing to start and is backing off: "
                f"{health.last.describe()}",
                retry_after=math.ceil(health.retry_at - now),
                public=f"model '{model.name}' is failing to start and is backing off "
                f"({health.last.summary()}); {_ASK_OPERATOR.format(model=model.name)}",
            )

    def _serving(self, model: str) -> bool:
        """Whether a replica of `model` is placed, starting or running."""
        if any(p.spec.model == model for p in self._pending.values()):
            return True
        return any(
            shard.model == model and shard.holds_gpus and node.state != "lost"
            for node in self._inventory.nodes()
            for shard in node.shards.values()
        )

    def _settle_activations(self, now: float) -> None:
        for name, activation in tuple(self._activations.items()):
            error: ActivationRefused | None = None
            if not self.has_ready(name):
                error = self._activation_error(name, activation, now)
                if error is None:
                    continue  # still worth waiting
            del self._activations[name]
            self.demand.served(name)
            self._activation_ended(name, activation, error, now)
            if error is None:
                activation.future.set_result(None)
            else:
                activation.future.set_exception(error)
                # Every waiter may have gone (clients disconnected): retrieve it here.
                activation.future.exception()

    def _activation_ended(
        self, name: str, activation: _Activation, error: ActivationRefused | None, now: float
    ) -> None:
        """Count an activation that ended and close its span."""
        seconds = now - activation.started
        if self._activation_metrics is not None:
            self._activation_metrics.ended(name, "ready" if error is None else error.code, seconds)
        span = activation.span
        if span is None:
            return
        span.set_attribute("llmgw.activation.seconds", seconds)
        if error is None:
            span.set_status(StatusCode.OK)
        else:
            span.set_status(StatusCode.ERROR, error.public)
        span.end()
        activation.span = None

    def _activation_error(
        self, name: str, activation: _Activation, now: float
    ) -> ActivationRefused | None:
        """Why waiting for `name` is pointless, or None while a replica may still come."""
        if self._catalog.get(name) is None:
            return NotInCatalog(f"model '{name}' was removed from the catalog", retry_after=1)
        if self._serving(name):
            return None
        if name in self._unplaced:
            if now < self._grace_until:
                return None
            return Unplaceable(self._unplaced[name].summary(), retry_after=UNPLACEABLE_RETRY_AFTER)
        health = self._health.get(name)
        if (
            health is None
            or health.last is None
            or health.in_service
            or health.retry_at <= activation.started
        ):
            return None
        return ReplicaFailed(
            f"model '{name}' failed to start: {health.last.describe()}",
            retry_after=math.ceil(health.retry_at - now),
            public=f"model '{name}' failed to start ({health.last.summary()}); "
            + _ASK_OPERATOR.format(model=name),
        )

    def activity(self, name: str) -> str:
        """What a request waiting for `name` waits on, for its keep-alive comments:
        "waking model M (replica R)" while a sleeping replica is woken, the download
        of its weights while a starting replica's node reports one, else
        "is starting model M"."""
        adapter = self._adapter_loads.adapter(name)
        if adapter is not None:
            return self._adapter_loads.activity(adapter)
        model = self._catalog.get(name)
        wake = self._sleep.waking(model.name if model is not None else name)
        if wake is not None:
            return f"waking model {name} (replica {wake.shard_id})"
        return self.starting_note(name) or f"is starting model {name}"

    def _progress(self, model: str) -> str:
        waking = self._sleep.waking(model)
        states = [
            f"replica {shard.id} on node {node.id} is "
            + ("waking" if waking is not None and waking.shard_id == shard.id else shard.state)
            for node in self._inventory.nodes()
            for shard in node.shards.values()
            if shard.model == model
        ]
        states += [
            f"replica {p.spec.shard_id} is being placed on node {p.node_id}"
            for p in self._pending.values()
            if p.spec.model == model
        ]
        return "; ".join(states) or "no replica is placed"

    # ---- read side (admin API, dashboard) ----

    def events(self) -> list[Event]:
        """Recent decisions and transitions, newest first."""
        return list(reversed(self._events))

    def note(self, kind: str, node_id: str, message: str) -> None:
        """Record an event about a node that happened outside the reconciler (an agent
        refused for its identity, a node the operator removed)."""
        self._event(kind, "", node_id, message)

    def _event(self, kind: str, model: str, node_id: str, message: str) -> None:
        self._events.append(Event(self._wall_clock(), kind, model, node_id, message))

    def explanation(self, model: CatalogModel) -> Explanation:
        """Where one more replica of `model` would go now, or why nowhere."""
        health = self._health.get(model.name)
        return explain(
            model,
            self._inventory.nodes(),
            pending=tuple(self._pending.values()),
            policy=self._policy,
            avoid_nodes=frozenset(health.avoid) if health is not None else frozenset(),
            avoid_ports=frozenset(health.avoid_ports) if health is not None else frozenset(),
            mgmt_interface=self._mgmt_interface,
        )

    def snapshot(self, name: str) -> ModelState | None:
        """Everything known about one catalog model's replicas, for views."""
        model = self._catalog.get(name)
        if model is None:
            return None
        replicas = [
            (node, shard)
            for node in self._inventory.nodes()
            for shard in node.shards.values()
            if shard.model == model.name
        ]
        return self._state(model, replicas, self._clock())

    def snapshots(self) -> dict[str, ModelState]:
        """`snapshot` for every catalog model, reading the inventory once (for lists)."""
        by_model: dict[str, list[tuple[Node, Shard]]] = {}
        for node in self._inventory.nodes():
            for shard in node.shards.values():
                by_model.setdefault(shard.model, []).append((node, shard))
        now = self._clock()
        return {
            model.name: self._state(model, by_model.get(model.name, []), now)
            for model in self._catalog.models()
        }

    def _state(
        self, model: CatalogModel, replicas: list[tuple[Node, Shard]], now: float
    ) -> ModelState:
        pending = [p for p in self._pending.values() if p.spec.model == model.name]
        canary = canary_model(model)
        health = self._health.get(model.name)
        return ModelState(
            model=model,
            desired=self._targets.get(model.name, model.min_replicas),
            replicas=tuple(replicas),
            pending=tuple(pending),
            stopping=frozenset(s.id for _, s in replicas if s.id in self._stopping),
            in_flight=self.demand.in_flight(model.name),
            load=self.load_signals(model),
            idle_for=self.demand.idle_for(model.name, now),
            failures=health.failures if health is not None else 0,
            last_failure=health.last if health is not None else None,
            retry_in=max(0.0, health.retry_at - now) if health is not None else 0.0,
            unplaced=self._unplaced.get(model.name),
            activating=model.name in self._activations,
            last_wake=self._sleep.last_wake(model.name),
            rollout=self.rollout(model.name),
            outdated=frozenset(
                s.id
                for _, s in replicas
                if s.holds_gpus
                and not runs_current(model, s.spec)
                and (canary is None or not runs_current(canary, s.spec))
            ),
            versions={
                **{s.id: self._version_of(model.name, s.spec) for _, s in replicas},
                **{p.spec.shard_id: self._version_of(model.name, p.spec) for p in pending},
            }
            if canary is not None
            else {},
            canary_halt=self._rollout_book.canary_halted(model),
        )


def _new_shard_id(model: str) -> str:
    """A shard id that names its model: `llama-3-8b-3f9a1c2e`."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in model)[:48].strip("-")
    return f"{safe or 'model'}-{uuid.uuid4().hex[:8]}"


def _node_message(change: Change, node: Node) -> str:
    """What happened to a node, for the event list."""
    if change.kind == "node_registered":
        gpus = len(node.gpus)
        return (
            f"registered with {gpus} GPU{'' if gpus == 1 else 's'} and "
            f"{len(node.shards)} running replica{'' if len(node.shards) == 1 else 's'} "
            f"(agent {node.agent_version})"
        )
    if change.kind == "node_disconnected":
        return (
            "the agent's stream closed: its replicas keep serving while the routers reach "
            "them; they leave the routers and are replaced elsewhere if its heartbeats run out"
        )
    if change.kind == "node_draining":
        if node.draining:
            return "draining: its replicas move elsewhere, nothing new is placed here"
        return "no longer draining: new replicas may be placed here"
    if node.state == "ready":
        return "ready again: heartbeats resumed; a surplus replica placed meanwhile is retired"
    if node.state == "lost":
        return "lost: no heartbeats; its replicas are placed elsewhere"
    return (
        "unreachable: heartbeats stopped; its replicas are out of the routers and replaced "
        "elsewhere; they are kept in case it comes back"
    )


def _with_engine(model: CatalogModel, endpoints: Iterable[ReadyEndpoint]) -> list[ReadyEndpoint]:
    """`endpoints`, each naming its engine: one that does not (a standby reads only ids
    and URLs from the store) gets the engine (and engine arguments) of the model's
    profiles when they all use the same, and stays unnamed when they differ."""
    engines = {(profile.engine, profile.engine_args) for profile in model.profiles}
    only, args = engines.pop() if len(engines) == 1 else ("", ())
    return [
        e if e.engine or not only else ReadyEndpoint(e.id, e.url, only, args) for e in endpoints
    ]


def _with_version(model: CatalogModel, endpoints: Iterable[ReadyEndpoint]) -> list[ReadyEndpoint]:
    """`endpoints`, each with its version's name and weight when `model` has a canary.

    One that does not name its version (a standby reads only ids and URLs from the
    store) is the canary's when its engine arguments are those of a canary profile
    and of none of the model's own; a canary that differs only in weights or
    environment is not told apart there, and a standby then routes to both alike.
    """
    canary = model.canary
    if canary is None:
        return [
            e if not e.version else dataclasses.replace(e, version="", weight=0) for e in endpoints
        ]
    own = {(p.engine, p.engine_args) for p in model.profiles}
    theirs = {(p.engine, p.engine_args) for p in canary.profiles} - own
    weights = {canary.name: canary.weight, canary.stable_name: canary.stable_weight}
    out = []
    for e in endpoints:
        version = e.version
        if version not in weights:
            version = canary.name if (e.engine, e.engine_args) in theirs else canary.stable_name
        out.append(dataclasses.replace(e, version=version, weight=weights[version]))
    return out
