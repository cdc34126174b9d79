"""Loading LoRA adapters on request into Ready replicas of their base model.

A request for a catalog adapter (`CatalogModel.adapter_of`) is served by a replica
of its base whose engine has the adapter loaded; the agents report which adapters
each shard has loaded (`Shard.adapters`), and the controller publishes those
replicas under the adapter's names (standbys read them back from the store), so every
router routes by what the engines really hold. When no replica has it, `AdapterLoads.ensure`
activates the base if it has no Ready replica, picks the Ready replica with the
most free adapter slots (the profile's `adapters.max_loaded`) or, when every replica
is full, the one holding the base's least valuable adapter with no request in flight,
which it unloads first, and tells its agent to load the adapter; it returns once the
agent reported it loaded.
An engine that refuses the adapter (bad files, rank over the limit) is answered
at once with the engine's own words (`AdapterRefused`).

A standby cannot load (only the leader talks to agents): it asks the leader through
the store (`ask_leader`: a demand row that wants the adapter, as for a model's
activation), and the request waits until the leader's load is published there. The
leader answers such rows with `load_for_others`.

Value is how often an adapter is asked for: each request adds one to a count that
halves every `HALF_LIFE` seconds (LFU with aging), ties going to the least recently
used. Under a skewed mix plain LRU lets a burst of one-off requests push out the
adapter most requests want; the decayed count keeps it, and still lets an adapter
that stopped being asked for go after a few half-lives.

A hot adapter is spread: when the router finds every replica holding it full
(`spread`), it is loaded on one more Ready replica of the base that has a free slot
or an idle adapter of lower value, in the background; requests keep going to the
replicas that hold it meanwhile.

Not guaranteed: that a standby hears why the leader could not load an adapter (its
request waits out the activation timeout, as for a model); that a standby's traffic
spreads an adapter (only the leader's router asks); that an adapter judged idle is idle
on other servers' routers, or that its value counts their requests (only this server's
requests are counted); that a spread copy stays (it is evicted by value like any other
when its slot is wanted).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llmgw.control.agentsvc.dispatcher import Dispatcher
from llmgw.control.agentsvc.errors import AgentServiceError, CommandFailed
from llmgw.control.catalog.model import CatalogModel
from llmgw.control.inventory import Node, Shard
from llmgw.control.reconciler.errors import ActivationRefused, AdapterRefused, NotInCatalog
from llmgw.control.reconciler.state import routable

log = logging.getLogger("llmgw.control.reconciler.adapters")

# Seconds a request is told to wait before asking again when every slot is in use.
BUSY_RETRY_AFTER = 2

# Seconds in which a request's weight in an adapter's value halves. Long against the
# gaps between requests for a mid-popular adapter (so its count is steady enough to
# rank), short against a working day (so yesterday's favourite goes by lunch).
HALF_LIFE = 300.0


class AdapterCatalog(Protocol):
    """What adapter loading reads of the catalog (`llmgw.control.catalog.Catalog`)."""

    def entry(self, name: str) -> CatalogModel | None: ...

    def get(self, name: str) -> CatalogModel | None: ...


@dataclass
class _Use:
    in_flight: int = 0
    last_used: float = -math.inf
    # Requests counted, decayed as of `counted` (the time of the last one).
    count: float = 0.0
    counted: float = 0.0

    def value(self, now: float) -> float:
        """The decayed request count at `now`."""
        return self.count * math.exp2((self.counted - now) / HALF_LIFE)


class AdapterLoads:
    """Which adapter is wanted, used and loaded where; loads one on request."""

    def __init__(
        self,
        *,
        catalog: AdapterCatalog,
        nodes: Callable[[], Sequence[Node]],
        dispatcher: Dispatcher,
        clock: Callable[[], float],
        activate_base: Callable[[str], Awaitable[None]],
        published: Callable[[str], bool],
        publish: Callable[[], None],
        leading: Callable[[], bool],
        ask_leader: Callable[[CatalogModel], Awaitable[None]],
        wait_seconds: float,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
    ) -> None:
        self._catalog = catalog
        self._nodes = nodes
        self._dispatcher = dispatcher
        self._clock = clock
        self._activate_base = activate_base
        self._published = published
        self._publish = publish
        self._leading = leading
        self._ask_leader = ask_leader
        self._wait = wait_seconds
        self._spawn = spawn
        self._use: dict[str, _Use] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._loading: dict[str, str] = {}
        # Adapters other servers asked the leader for: when each may be tried again.
        self._for_others: dict[str, float] = {}
        # Adapters being loaded onto one more replica in the background.
        self._spreading: set[str] = set()

    def adapter(self, name: str) -> CatalogModel | None:
        """The catalog adapter a client means by `name` (name or alias), or None."""
        entry = self._catalog.entry(name)
        return entry if entry is not None and entry.adapter_of is not None else None

    def started(self, adapter: CatalogModel) -> None:
        use = self._use.setdefault(adapter.name, _Use())
        now = self._clock()
        use.in_flight += 1
        use.last_used = now
        use.count = use.value(now) + 1.0
        use.counted = now

    def finished(self, adapter: CatalogModel) -> None:
        use = self._use.setdefault(adapter.name, _Use())
        use.in_flight = max(0, use.in_flight - 1)
        use.last_used = self._clock()

    def activity(self, adapter: CatalogModel) -> str:
        shard = self._loading.get(adapter.name)
        if shard is not None:
            return f"loading adapter {adapter.name} into replica {shard} of {adapter.adapter_of}"
        base = adapter.adapter_of
        if not self._leading() and base is not None and self._published(base):
            return f"is waiting for the leader to load adapter {adapter.name}"
        return f"is starting model {adapter.adapter_of} for adapter {adapter.name}"

    async def ensure(self, adapter: CatalogModel) -> None:
        """Return once a Ready replica of the base has `adapter` loaded and is published."""
        base_name = adapter.adapter_of
        assert base_name is not None
        if self._published(adapter.name):
            return
        if self._catalog.get(base_name) is None:
            raise NotInCatalog(
                f"adapter '{adapter.name}': its base model '{base_name}' is not in the catalog",
                retry_after=1,
            )
        await self._activate_base(base_name)
        if not self._leading():
            await self._ask_leader(adapter)
            return
        # One load decision at a time per base: two adapters must not both take the
        # last free slot, or both unload the same idle one.
        lock = self._locks.setdefault(base_name, asyncio.Lock())
        async with lock:
            if not self._holders(adapter.name):
                await self._load(adapter, base_name)
            self._publish()

    def load_for_others(
        self, names: Sequence[str], spawn: Callable[[Coroutine[Any, Any, None], str], None]
    ) -> None:
        """On the leader: load the adapters that other servers' requests wait for
        (`names`, from their demand rows), each in a task of its own (`spawn`); one
        that cannot be loaded now is tried again once its `retry_after` has passed."""
        now = self._clock()
        for name in names:
            adapter = self.adapter(name)
            if adapter is None or self._published(adapter.name):
                continue
            if self._for_others.get(adapter.name, -math.inf) > now:
                continue  # loading, or waiting to retry
            self._for_others[adapter.name] = math.inf
            spawn(self._load_for_other(adapter), f"load adapter {adapter.name} for a standby")

    async def _load_for_other(self, adapter: CatalogModel) -> None:
        retry_at = -math.inf
        try:
            await self.ensure(adapter)
        except ActivationRefused as exc:
            log.warning("adapter %s, asked for by another server: %s", adapter.name, exc)
            # Counted from the refusal: finding room may itself have taken a while.
            retry_at = self._clock() + exc.retry_after
        finally:
            self._for_others[adapter.name] = retry_at

    def spread(self, adapter: CatalogModel) -> None:
        """Every replica holding `adapter` is full (the router says so): load it on one
        more Ready replica of its base, in the background, where a slot is free or an
        idle adapter of lower value can make room. Returns at once; does nothing when
        no replica holds it yet (`ensure` loads it), one such load is under way, this
        server is a standby, or no replica has room for it."""
        if adapter.name in self._spreading or not self._leading():
            return
        if not self._holders(adapter.name) or self._spread_target(adapter) is None:
            return
        self._spreading.add(adapter.name)
        self._spawn(self._spread(adapter), f"spread adapter {adapter.name}")

    async def _spread(self, adapter: CatalogModel) -> None:
        base_name = adapter.adapter_of
        assert base_name is not None
        try:
            lock = self._locks.setdefault(base_name, asyncio.Lock())
            async with lock:
                target = self._spread_target(adapter)
                if target is None:
                    return
                node, shard, victim = target
                log.info(
                    "adapter %s is in demand beyond the replicas holding it: loading it on "
                    "replica %s too",
                    adapter.name,
                    shard.id,
                )
                if victim is not None:
                    await self._unload(adapter, node, shard, victim)
                await self._load_on(adapter, node, shard)
                self._publish()
        except ActivationRefused as exc:
            # A spread that fails leaves the adapter where it was; requests still go there.
            log.warning("adapter %s was not spread to another replica: %s", adapter.name, exc)
        finally:
            self._spreading.discard(adapter.name)

    def _spread_target(self, adapter: CatalogModel) -> tuple[Node, Shard, str | None] | None:
        """The Ready replica of the base not holding `adapter` to load it on, and the
        idle adapter to unload there first (None: a slot is free); None when no replica
        has a free slot or an idle adapter worth less than `adapter`."""
        base = self._catalog.get(adapter.adapter_of or "")
        if base is None:
            return None
        now = self._clock()
        worth = self._value(adapter.name, now)
        best: tuple[tuple[float, float, str], Node, Shard, str | None] | None = None
        for node, shard in self._ready_of(base.name):
            if adapter.name in shard.adapters:
                continue
            if len(shard.adapters) < _slots(base, shard):
                rank = (-math.inf, len(shard.adapters) - _slots(base, shard), shard.id)
                choice: tuple[tuple[float, float, str], Node, Shard, str | None] = (
                    rank,
                    node,
                    shard,
                    None,
                )
            else:
                victim = self._victim(shard, now)
                if victim is None or self._value(victim, now) >= worth:
                    continue
                choice = ((self._value(victim, now), 0.0, shard.id), node, shard, victim)
            if best is None or choice[0] < best[0]:
                best = choice
        return None if best is None else best[1:]

    def _holders(self, name: str) -> list[tuple[Node, Shard]]:
        return [
            (node, shard)
            for node, shard in self._ready_of(self._owner_base(name))
            if name in shard.adapters
        ]

    def _owner_base(self, name: str) -> str:
        adapter = self.adapter(name)
        return adapter.adapter_of if adapter is not None and adapter.adapter_of else ""

    def _ready_of(self, base: str) -> list[tuple[Node, Shard]]:
        return [
            (node, shard)
            for node in self._nodes()
            if routable(node)
            for shard in node.shards.values()
            if shard.model == base
            and shard.state == "ready"
            and (shard.spec is None or shard.spec.node_rank == 0)
        ]

    async def _load(self, adapter: CatalogModel, base_name: str) -> None:
        base = self._catalog.get(base_name)
        replicas = self._ready_of(base_name)
        if base is None or not replicas:
            raise ActivationRefused(
                f"adapter '{adapter.name}': no Ready replica of '{base_name}' to load it into "
                "(it stopped meanwhile); retry",
                retry_after=1,
            )
        free = [r for r in replicas if len(r[1].adapters) < _slots(base, r[1])]
        if free:
            # The replica with the most free slots; of equals, the first by id (stable).
            node, shard = min(
                free, key=lambda r: (len(r[1].adapters) - _slots(base, r[1]), r[1].id)
            )
        else:
            # Every replica is full: room is made where the least valuable idle adapter
            # of the whole base is, so that every replica's slots turn over (not always
            # the first replica's, while the others keep whatever they loaded first);
            # with no idle adapter anywhere, the request is told to retry.
            now = self._clock()
            node, shard = min(replicas, key=lambda r: (self._least_idle(r[1], now), r[1].id))
            victim = self._victim(shard, now)
            if victim is None:
                raise ActivationRefused(
                    f"adapter '{adapter.name}': every adapter slot of the replicas of "
                    f"'{adapter.adapter_of}' is serving requests now; retry shortly",
                    retry_after=BUSY_RETRY_AFTER,
                )
            await self._unload(adapter, node, shard, victim)
        await self._load_on(adapter, node, shard)

    async def _load_on(self, adapter: CatalogModel, node: Node, shard: Shard) -> None:
        self._loading[adapter.name] = shard.id
        log.info("loading adapter %s into replica %s on node %s", adapter.name, shard.id, node.id)
        try:
            await self._dispatcher.load_adapter(
                node.id, shard.id, adapter.name, adapter.launch_weights, self._wait
            )
        except CommandFailed as exc:
            raise AdapterRefused(
                f"adapter '{adapter.name}' could not be loaded: {exc.error}", retry_after=1
            ) from None
        except AgentServiceError as exc:
            raise ActivationRefused(
                f"adapter '{adapter.name}' could not be loaded on node {node.id}: {exc}",
                retry_after=1,
                public=f"adapter '{adapter.name}' could not be loaded now; retry",
            ) from None
        finally:
            self._loading.pop(adapter.name, None)

    async def _unload(self, adapter: CatalogModel, node: Node, shard: Shard, victim: str) -> None:
        """Unload `victim` from `shard` to make room for `adapter`."""
        log.info("unloading adapter %s from replica %s to make room", victim, shard.id)
        try:
            await self._dispatcher.unload_adapter(node.id, shard.id, victim, self._wait)
        except AgentServiceError as exc:
            raise ActivationRefused(
                f"adapter '{adapter.name}': making room on replica {shard.id} failed: {exc}",
                retry_after=1,
                public=f"adapter '{adapter.name}' could not be loaded now; retry",
            ) from None

    def _victim(self, shard: Shard, now: float) -> str | None:
        """The least valuable adapter of `shard` with no request in flight (None: none
        is idle): lowest decayed request count, then least recently used, then name."""
        idle = [name for name in shard.adapters if self._in_flight(name) == 0]
        return min(idle, key=lambda name: self._rank(name, now), default=None)

    def _least_idle(self, shard: Shard, now: float) -> tuple[float, float, str]:
        """The rank of `shard`'s least valuable idle adapter (infinite: none is idle)."""
        victim = self._victim(shard, now)
        return (math.inf, math.inf, "") if victim is None else self._rank(victim, now)

    def _rank(self, name: str, now: float) -> tuple[float, float, str]:
        use = self._use.get(name)
        if use is None:
            return (0.0, -math.inf, name)
        return (use.value(now), use.last_used, name)

    def _value(self, name: str, now: float) -> float:
        use = self._use.get(name)
        return use.value(now) if use is not None else 0.0

    def _in_flight(self, name: str) -> int:
        use = self._use.get(name)
        return use.in_flight if use is not None else 0


def _slots(base: CatalogModel, shard: Shard) -> int:
    """The adapters the shard's engine holds at once: its profile's `max_loaded`."""
    args = tuple(shard.spec.engine_args) if shard.spec is not None else ()
    sized = [p for p in base.profiles if p.adapters is not None]
    for profile in sized:
        if profile.engine_args == args and profile.adapters is not None:
            return profile.adapters.max_loaded
    return min((p.adapters.max_loaded for p in sized if p.adapters is not None), default=0)
