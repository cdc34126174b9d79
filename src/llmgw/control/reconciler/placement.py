"""Placement: which node, GPUs and port one replica would get, and why not the others.

A chain of filters decides whether a node can take a replica with one
profile; the first filter that says no gives that node's reason ("2 of 4 GPUs
free", "draining"). A scorer ranks the nodes that pass: "pack" fills nodes up,
"spread" evens them out, ties go to the lower node id. Two softer preferences
sit above the score: a node where the model already runs a replica is chosen
only when no other node fits (a node failure then takes one replica, not
all), and a node the model is asked to avoid (it failed there recently) only
when nothing else fits at all.

A multi-node profile (`nodes: N`, `fabric: KEY`) is placed as a gang, all or
nothing: the same filters judge each node for one shard, the nodes that pass
are grouped by their value of fabric label KEY, and a group with N of them
takes the replica (the group whose N best nodes are best, by the same tiers
and score; ties to the lower label value). Rank 0 goes on the best of them and
also gets the rendezvous port, a second free port of its range. Each node
also needs an address on the management network (`mgmt.mgmt_address`). `explain` says
per group why it falls short ("ib-domain=pod3: 1 of 2 nodes with 8 free 80
GiB GPUs").

`Fleet` holds what the inventory reported plus what has been handed out since
(pending starts, this plan's starts), so two starts never share a GPU or port.
Within one plan capacity only shrinks: nothing is freed until a stopped shard
is reported ended, and the filters only look at the node and what is still
free on it. `Fleet.place` relies on that: a node that stops fitting a need
never fits it again, so it keeps one heap of fitting nodes per distinct need
and re-checks only the nodes that changed. `Fleet.explain` gives every node's
reason, which is what a person asking "why" wants to read; both remember a
node's verdict for a need until the node changes.

Not guaranteed: that the node still has the room when the start arrives.
Memory figures are from the last heartbeat and the agent refuses what does not
fit; the controller re-plans after every change.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from llmgw.config.hub import hub_ref
from llmgw.control.catalog.model import CatalogModel, Profile
from llmgw.control.inventory.model import Gpu, Node
from llmgw.control.reconciler.disk import decimal_size, shortfall
from llmgw.control.reconciler.mgmt import mgmt_address
from llmgw.control.reconciler.types import (
    Explanation,
    Pending,
    Placement,
    PlacementPolicy,
    ProfileVerdict,
    Rejection,
)

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Need:
    """What filters and scorers see of a profile: the resources one replica needs.

    Hashable, so that every profile with the same needs shares one set of
    fitting nodes within a plan, however many models use it.
    """

    gpus: int
    gpu_memory: int
    gpu_kind: str | None
    labels: tuple[tuple[str, str], ...]
    # A multi-node replica: this many shards, one per node, all with the same
    # value of fabric label `fabric`; each needs the above.
    nodes: int = 1
    fabric: str | None = None
    # A multi-node replica's management network setting ("" is the default).
    mgmt: str = ""

    @classmethod
    def of(cls, profile: Profile, mgmt: str = "") -> Need:
        gang = profile.nodes > 1
        return cls(
            gpus=profile.gpus,
            gpu_memory=profile.gpu_memory,
            gpu_kind=profile.gpu_kind or None,
            labels=tuple(sorted(profile.labels.items())),
            nodes=profile.nodes,
            fabric=profile.fabric if gang else None,
            mgmt=mgmt if gang else "",
        )

    def describe(self) -> str:
        """What one shard needs, e.g. "8 free 80 GiB H100 GPUs"."""
        if self.gpus == 0:
            return "room for a shard"
        memory = f" {gib(self.gpu_memory)}" if self.gpu_memory else ""
        kind = f" {self.gpu_kind}" if self.gpu_kind else ""
        return f"{self.gpus} free{memory}{kind} GPU{'' if self.gpus == 1 else 's'}"


def fabric_of(node: Node, key: str) -> str | None:
    """The node's value of fabric label `key` (its fabric labels first, then its labels)."""
    value = node.fabric.get(key)
    return value if value is not None else node.labels.get(key)


def _is_kind(gpu: Gpu, kind: str | None) -> bool:
    return kind is None or kind.lower() in gpu.name.lower()


@dataclass(slots=True, eq=False)
class NodeCapacity:
    """One node and what is still free on it in the plan being made.

    `free_gpus` excludes GPUs held by live shards, pending starts and this
    plan's starts, in index order; `ports_used` likewise. `shards` counts them
    all, `models` counts them by model. `version` changes on every reservation.
    """

    node: Node
    free_gpus: list[Gpu]
    ports_used: set[int]
    shards: int
    models: dict[str, int]
    version: int = 0
    # Per GPU kind: how many the node has (fixed) and which are free (until the next reserve).
    _total_of_kind: dict[str | None, int] = field(default_factory=dict, repr=False)
    _free_of_kind: dict[str | None, list[Gpu]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, node: Node) -> NodeCapacity:
        used: set[int] = set()
        ports: set[int] = set()
        models: dict[str, int] = {}
        shards = 0
        for shard in node.shards.values():
            if not shard.holds_gpus:
                continue
            shards += 1
            models[shard.model] = models.get(shard.model, 0) + 1
            if shard.spec is not None:
                used.update(shard.spec.gpu_indices)
                if shard.spec.port:
                    ports.add(shard.spec.port)
                # Rank 0 of a multi-node replica also holds its rendezvous port.
                if shard.spec.master_port and shard.spec.node_rank == 0:
                    ports.add(shard.spec.master_port)
        free = sorted((g for g in node.gpus if g.index not in used), key=lambda g: g.index)
        return cls(node=node, free_gpus=free, ports_used=ports, shards=shards, models=models)

    def reserve(
        self, model: str, gpu_indices: Iterable[int], port: int, master_port: int = 0
    ) -> None:
        taken = set(gpu_indices)
        if taken:
            self.free_gpus = [g for g in self.free_gpus if g.index not in taken]
        if port:
            self.ports_used.add(port)
        if master_port:
            self.ports_used.add(master_port)
        self.shards += 1
        self.models[model] = self.models.get(model, 0) + 1
        self.version += 1
        self._free_of_kind.clear()

    def total_of_kind(self, kind: str | None) -> int:
        """How many GPUs the node has whose name contains `kind` (None: all of them)."""
        total = self._total_of_kind.get(kind)
        if total is None:
            total = self._total_of_kind[kind] = sum(1 for g in self.node.gpus if _is_kind(g, kind))
        return total

    def free_of_kind(self, kind: str | None) -> list[Gpu]:
        """The free GPUs whose name contains `kind` (None: all of them), in index order."""
        if kind is None:
            return self.free_gpus
        free = self._free_of_kind.get(kind)
        if free is None:
            free = self._free_of_kind[kind] = [g for g in self.free_gpus if _is_kind(g, kind)]
        return free

    def free_port(self, avoid: frozenset[tuple[str, int]] = frozenset()) -> int | None:
        """The lowest port of the node's range that no shard here uses (ranges are inclusive).

        Ports paired with this node in `avoid` are passed over while another is free.
        """
        start, end = self.node.port_range
        if start <= 0 or end < start:
            return None
        fallback: int | None = None
        node_id = self.node.id
        for port in range(start, end + 1):
            if port in self.ports_used:
                continue
            if (node_id, port) not in avoid:
                return port
            if fallback is None:
                fallback = port
        return fallback

    def two_ports(self, avoid: frozenset[tuple[str, int]] = frozenset()) -> tuple[int, int] | None:
        """An engine port and a rendezvous port, both free (rank 0 of a gang needs both)."""
        first = self.free_port(avoid)
        if first is None:
            return None
        self.ports_used.add(first)
        try:
            second = self.free_port(avoid)
        finally:
            self.ports_used.discard(first)
        return None if second is None else (first, second)

    def gpus_for(self, need: Need) -> tuple[int, ...]:
        """The lowest-index free GPUs that match the need (fewer if there are not enough)."""
        if need.gpus == 0:
            return ()
        memory = need.gpu_memory
        chosen = [g.index for g in self.free_of_kind(need.gpu_kind) if g.memory_free >= memory]
        return tuple(chosen[: need.gpus])


# --- filters: None when the node passes, else the reason it does not ----------------

Filter = Callable[[NodeCapacity, Need], "str | None"]


def filter_node_state(cap: NodeCapacity, need: Need) -> str | None:
    """Only nodes that are ready, connected and not draining take new work."""
    node = cap.node
    if node.state == "lost":
        return "lost"
    if node.state == "unreachable":
        return "unreachable (no heartbeat)"
    if node.draining:
        return "draining"
    if not node.connected:
        return "disconnected"
    return None


def filter_labels(cap: NodeCapacity, need: Need) -> str | None:
    """Every label of the profile must be in the node's labels or its fabric labels."""
    node = cap.node
    for key, value in need.labels:
        has = node.labels.get(key)
        if has == value or node.fabric.get(key) == value:
            continue
        if has is None:
            has = node.fabric.get(key)
        if has is None:
            return f"missing label {key}={value}"
        return f"label {key}={has}, needs {key}={value}"
    return None


def filter_fabric(cap: NodeCapacity, need: Need) -> str | None:
    """A multi-node replica's nodes must have its fabric label (any value; the
    gang is then formed among nodes with the same value)."""
    if need.fabric is None or fabric_of(cap.node, need.fabric) is not None:
        return None
    return f"no fabric label {need.fabric} (the profile spans {need.nodes} nodes of one fabric)"


def filter_mgmt(cap: NodeCapacity, need: Need) -> str | None:
    """A multi-node replica's node needs an address on the management network."""
    if need.nodes <= 1:
        return None
    found = mgmt_address(cap.node, need.mgmt)
    return found if isinstance(found, str) else None


def filter_gpu_kind(cap: NodeCapacity, need: Need) -> str | None:
    """At least one GPU's name contains the profile's kind (case-insensitive)."""
    if need.gpus == 0 or need.gpu_kind is None:
        return None
    if cap.total_of_kind(need.gpu_kind):
        return None
    names = ", ".join(sorted({g.name for g in cap.node.gpus})) or "no GPUs"
    return f"no GPU matches kind '{need.gpu_kind}' (has {names})"


def filter_gpus(cap: NodeCapacity, need: Need) -> str | None:
    """Enough free GPUs of the right kind, each with the memory the profile asks for."""
    if need.gpus == 0:
        return None
    total = cap.total_of_kind(need.gpu_kind)
    if total == 0:
        return f"no GPUs, needs {need.gpus}"
    free = cap.free_of_kind(need.gpu_kind)
    if len(free) < need.gpus:
        what = "GPUs" if need.gpu_kind is None else f"{need.gpu_kind} GPUs"
        return f"{len(free)} of {total} {what} free"
    if need.gpu_memory == 0:
        return None
    memory = need.gpu_memory
    roomy = sum(1 for g in free if g.memory_free >= memory)
    if roomy < need.gpus:
        noun = "GPU" if len(free) == 1 else "GPUs"
        return f"{len(free)} {noun} free but only {roomy} with {gib(need.gpu_memory)} free"
    return None


def filter_ports(cap: NodeCapacity, need: Need) -> str | None:
    """A port in the node's range that none of its shards uses."""
    start, end = cap.node.port_range
    if start <= 0 or end < start:
        return "reported no port range for engines"
    if cap.free_port() is None:
        return f"no free port in {start}-{end}"
    return None


DEFAULT_FILTERS: tuple[Filter, ...] = (
    filter_node_state,
    filter_labels,
    filter_fabric,
    filter_mgmt,
    filter_gpu_kind,
    filter_gpus,
    filter_ports,
)


def rejection(cap: NodeCapacity, need: Need, filters: Sequence[Filter]) -> str | None:
    """The first failing filter's reason, or None when the node fits."""
    for check in filters:
        reason = check(cap, need)
        if reason is not None:
            return reason
    return None


def gib(size: int) -> str:
    return f"{round(size / GIB, 1):g} GiB"


# --- scorers: lower is better; the node id breaks ties ------------------------------

Scorer = Callable[[NodeCapacity, Need], tuple[int, int]]


def score_pack(cap: NodeCapacity, need: Need) -> tuple[int, int]:
    """Fill nodes up: fewest free GPUs left after this replica; CPU work joins busy nodes."""
    if need.gpus == 0:
        return (-cap.shards, 0)
    return (len(cap.free_gpus) - need.gpus, -cap.shards)


def score_spread(cap: NodeCapacity, need: Need) -> tuple[int, int]:
    """Even nodes out: most free GPUs left after this replica, then fewest shards."""
    if need.gpus == 0:
        return (cap.shards, 0)
    return (need.gpus - len(cap.free_gpus), cap.shards)


def scorer_for(policy: PlacementPolicy) -> Scorer:
    return score_spread if policy == "spread" else score_pack


# --- the fleet --------------------------------------------------------------------

# (score, score, node id, the node's version when scored): heaps order by the first three.
_Entry = tuple[int, int, str, int]


@dataclass(slots=True)
class _Checked:
    """One need's verdict per node, and the node's version it holds for.

    Flat dicts rather than an object per node and need: a plan checks tens of
    thousands of pairs, and every object it keeps adds to what the garbage
    collector walks. `rejections` holds the objects `explain` handed out.
    """

    versions: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str | None] = field(default_factory=dict)
    rejections: dict[str, Rejection] = field(default_factory=dict)


@dataclass(slots=True)
class _Candidates:
    """The nodes that fitted one need when last looked at, best first.

    `seen` is how much of the fleet's change log the heap has taken in.
    """

    heap: list[_Entry]
    seen: int


# The filters a node's fixed facts decide (its state, labels, GPU kinds): within one
# plan their verdict for a single-node need never changes.
_STATIC_FILTERS: tuple[Filter, ...] = (filter_node_state, filter_labels, filter_gpu_kind)
# The filters that look at what is still free on the node.
_DYNAMIC_FILTERS: tuple[Filter, ...] = (filter_gpus, filter_ports)


@dataclass(slots=True)
class _ByFree:
    """The nodes that pass one need's fixed filters, bucketed by free GPU count.

    With the default filters, a single-node need with GPUs ranks nodes by their
    free GPU count, then their shard count, then id, whatever its GPU count
    (`score_pack`, `score_spread`), so one order serves every need that shares
    the fixed part (kind, labels). Each bucket is sorted by (shard key, node id);
    `where` is each node's bucket and key, to move it when it is reserved on.
    """

    buckets: dict[int, list[tuple[int, str]]]
    where: dict[str, tuple[int, int]]


@dataclass(slots=True)
class _GangIndex:
    """The nodes that fit one multi-node need, per fabric value, by score and id;
    `where` is each node's group and entry; `seen` as in `_Candidates`."""

    entries: dict[str, list[_Entry]]
    where: dict[str, tuple[str, _Entry]]
    seen: int


class Fleet:
    """Every node's remaining capacity during one plan (or one dry run).

    Build it from an inventory snapshot and the starts still in flight;
    `reserve` each start as it is decided. Not thread-safe and not meant to
    outlive the plan: it never learns about stops.
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        pending: Iterable[Pending] = (),
        *,
        policy: PlacementPolicy = "pack",
        filters: Sequence[Filter] = DEFAULT_FILTERS,
        mgmt_interface: str = "",
    ) -> None:
        self._filters = tuple(filters)
        self._mgmt = mgmt_interface
        self._score = scorer_for(policy)
        self._caps = {n.id: NodeCapacity.of(n) for n in sorted(nodes, key=lambda n: n.id)}
        # Per hub snapshot (`org/name@commit`), the nodes holding it and its size there.
        self._held: dict[str, dict[str, int]] = {}
        for node in self._caps.values():
            for held in node.node.weights:
                key = f"{held.repo}@{held.revision}"
                self._held.setdefault(key, {})[node.node.id] = held.bytes
        # Per model's launch weights, the nodes that must download them and whose disk
        # cannot take them, with the reason (the disk does not change during a plan).
        self._short: dict[str, dict[str, str]] = {}
        self._candidates: dict[Need, _Candidates] = {}
        # Every node reserved on, in order: the candidate heaps catch up on it lazily.
        self._changed: list[str] = []
        # Per need and node: the node's version when checked, and its rejection (None: fits).
        self._checked: dict[Need, _Checked] = {}
        # Per need's fixed part (`_static_key`): its nodes by free GPU count; only with
        # the default filters, whose split into fixed and free-capacity ones is known.
        self._spread = policy == "spread"
        self._indexed = self._filters == DEFAULT_FILTERS
        self._by_free: dict[Need, _ByFree] = {}
        # Per need explained: every node's rejection in node order, and how much of the
        # change log it has taken in.
        self._explained: dict[Need, tuple[list[Rejection | None], int]] = {}
        self._order = {node_id: i for i, node_id in enumerate(self._caps)}
        # Per multi-node need: its fitting nodes by fabric value.
        self._gangs: dict[Need, _GangIndex] = {}
        for start in pending:
            cap = self._caps.get(start.node_id)
            # A pending start the node already reports as a shard is counted once.
            if cap is not None and start.spec.shard_id not in cap.node.shards:
                spec = start.spec
                master = spec.master_port if spec.node_rank == 0 else 0
                cap.reserve(spec.model, spec.gpu_indices, spec.port, master)

    def reserve(self, placement: Placement, model: str) -> None:
        for rank, shard in enumerate(placement.ranks):
            master = placement.master_port if rank == 0 else 0
            cap = self._caps[shard.node_id]
            cap.reserve(model, shard.gpu_indices, shard.port, master)
            self._changed.append(shard.node_id)
            for index in self._by_free.values():
                self._move(index, cap)

    def explain(
        self,
        model: CatalogModel,
        *,
        avoid_nodes: frozenset[str] = frozenset(),
        avoid_ports: frozenset[tuple[str, int]] = frozenset(),
    ) -> Explanation:
        """Every profile in order against every node, until one fits somewhere."""
        verdicts: list[ProfileVerdict] = []
        for profile in model.profiles:
            need = Need.of(profile, self._mgmt)
            slots = self._verdicts(need)
            fits = list(itertools.compress(self._caps.values(), map(operator.not_, slots)))
            rejections = tuple(filter(None, slots))
            short = self._no_room(model)
            if short:
                rejections += tuple(
                    Rejection(c.node.id, short[c.node.id]) for c in fits if c.node.id in short
                )
                fits = [c for c in fits if c.node.id not in short]
            if need.nodes > 1:
                gang = self._gang(fits, profile, need, model.name, avoid_nodes, avoid_ports)
                verdicts.append(
                    ProfileVerdict(
                        profile=profile.name,
                        fits=tuple(c.node.id for c in fits),
                        rejections=rejections,
                        groups=() if gang is not None else _short_groups(fits, need),
                    )
                )
                if gang is not None:
                    return Explanation(model.name, gang, tuple(verdicts))
                continue
            verdicts.append(
                ProfileVerdict(
                    profile=profile.name,
                    fits=tuple(c.node.id for c in fits),
                    rejections=rejections,
                    weights=self._weights_notes(model, fits),
                )
            )
            if fits:
                holders = self._holders(model)
                best = min(
                    fits,
                    key=lambda c: (
                        _tier(c, model.name, avoid_nodes, holders),
                        *self._score(c, need),
                        c.node.id,
                    ),
                )
                placement = _placement(best, profile, need, avoid_ports)
                return Explanation(model.name, placement, tuple(verdicts))
        return Explanation(model.name, None, tuple(verdicts))

    def candidates(self, model: CatalogModel) -> list[str]:
        """The nodes one replica of `model` fits on, in the order placement prefers them:
        its single-node profiles in turn, and within one, nodes holding its weights
        first, then by the policy's score and id (for pulling weights ahead of demand;
        multi-node profiles are left out)."""
        holders = self._holders(model)
        ranked: dict[str, None] = {}
        for profile in model.profiles:
            need = Need.of(profile, self._mgmt)
            if need.nodes > 1:
                continue
            slots = self._verdicts(need)
            fits = itertools.compress(self._caps.values(), map(operator.not_, slots))
            for cap in sorted(
                fits, key=lambda c: (c.node.id not in holders, *self._score(c, need), c.node.id)
            ):
                ranked.setdefault(cap.node.id)
        return list(ranked)

    def place(
        self,
        model: CatalogModel,
        *,
        avoid_nodes: frozenset[str] = frozenset(),
        avoid_ports: frozenset[tuple[str, int]] = frozenset(),
    ) -> Placement | None:
        """The placement `explain` would give, without the reasons (and much faster)."""
        if self._no_room(model):
            # Some node's disk cannot take the weights: rare, so the slower path that
            # leaves such nodes out is taken rather than teaching every index about it.
            found = self.explain(model, avoid_nodes=avoid_nodes, avoid_ports=avoid_ports)
            return found.placement
        for profile in model.profiles:
            need = Need.of(profile, self._mgmt)
            if need.nodes > 1:
                groups = self._gang_groups(need)
                gang = self._best_gang(groups, profile, need, model.name, avoid_nodes, avoid_ports)
                if gang is not None:
                    return gang
                continue
            holders = self._holders(model)
            if self._indexed and need.gpus > 0:
                cap = self._pick_by_free(need, model.name, avoid_nodes, holders)
            else:
                cap = self._pick(need, model.name, avoid_nodes, holders)
            if cap is not None:
                return _placement(cap, profile, need, avoid_ports)
        return None

    def _gang(
        self,
        fits: list[NodeCapacity],
        profile: Profile,
        need: Need,
        model: str,
        avoid_nodes: frozenset[str],
        avoid_ports: frozenset[tuple[str, int]],
    ) -> Placement | None:
        """The best `need.nodes` fitting nodes that share a fabric value, or None.

        Within a group nodes rank by tier, score and id; groups by the worst tier
        of their chosen nodes, then the sum of their scores, then the label value.
        Rank 0 is the best chosen node that has two free ports (engine and rendezvous).
        """
        assert need.fabric is not None
        groups: dict[str, list[str]] = {}
        for cap in sorted(fits, key=lambda c: (*self._score(c, need), c.node.id)):
            value = fabric_of(cap.node, need.fabric)
            if value is not None:
                groups.setdefault(value, []).append(cap.node.id)
        return self._best_gang(groups, profile, need, model, avoid_nodes, avoid_ports)

    def _best_gang(
        self,
        groups: dict[str, list[str]],
        profile: Profile,
        need: Need,
        model: str,
        avoid_nodes: frozenset[str],
        avoid_ports: frozenset[tuple[str, int]],
    ) -> Placement | None:
        """`_gang` over fitting nodes' ids grouped by fabric value, each group by score and
        id."""
        assert need.fabric is not None
        best: tuple[tuple[int, int, int, str], list[NodeCapacity], tuple[int, int]] | None = None
        for value, ids in groups.items():
            if len(ids) < need.nodes:
                continue
            ranked = _ranked(ids, self._caps, need.nodes, model, avoid_nodes, avoid_ports)
            head = next((c for c in ranked if c.two_ports(avoid_ports) is not None), None)
            if head is None:
                continue
            chosen = [head, *[c for c in ranked if c is not head][: need.nodes - 1]]
            ports = head.two_ports(avoid_ports)
            assert ports is not None
            scores = [self._score(c, need) for c in chosen]
            key = (
                max(_tier(c, model, avoid_nodes) for c in chosen),
                sum(s[0] for s in scores),
                sum(s[1] for s in scores),
                value,
            )
            if best is None or key < best[0]:
                best = (key, chosen, ports)
        if best is None:
            return None
        (*_, value), chosen, (port, master_port) = best
        head, *rest = chosen
        return Placement(
            node_id=head.node.id,
            profile=profile,
            gpu_indices=head.gpus_for(need),
            port=port,
            shards=tuple(_placement(c, profile, need, avoid_ports) for c in rest),
            master_port=master_port,
            fabric=f"{need.fabric}={value}",
        )

    def _gang_groups(self, need: Need) -> dict[str, list[str]]:
        """The nodes that fit a multi-node need, by fabric value, each group by score and
        id; kept per need and brought up to date with the nodes changed since."""
        assert need.fabric is not None
        found = self._gangs.get(need)
        checked = self._memo(need)
        if found is None:
            entries: dict[str, list[_Entry]] = {}
            for cap in self._caps.values():
                value = fabric_of(cap.node, need.fabric)
                if value is not None and self._check(cap, need, checked) is None:
                    entries.setdefault(value, []).append(
                        (*self._score(cap, need), cap.node.id, cap.version)
                    )
            for group in entries.values():
                group.sort()
            found = self._gangs[need] = _GangIndex(entries, {}, len(self._changed))
            for value, group in entries.items():
                for entry in group:
                    found.where[entry[2]] = (value, entry)
        elif found.seen < len(self._changed):
            for node_id in dict.fromkeys(self._changed[found.seen :]):
                cap = self._caps[node_id]
                old = found.where.pop(node_id, None)
                if old is None:
                    # It did not fit before; capacity only shrinks, so it does not now.
                    continue
                group = found.entries[old[0]]
                del group[bisect.bisect_left(group, old[1])]
                if self._check(cap, need, checked) is None:
                    entry = (*self._score(cap, need), node_id, cap.version)
                    bisect.insort(group, entry)
                    found.where[node_id] = (old[0], entry)
            found.seen = len(self._changed)
        return {
            value: [e[2] for e in group]
            for value, group in found.entries.items()
            if len(group) >= need.nodes
        }

    def _verdicts(self, need: Need) -> list[Rejection | None]:
        """Every node's rejection for `need` in node order (None: it fits), kept per need
        and brought up to date with the nodes changed since: a plan explains every model
        that does not fit, and re-reading the whole fleet for each one costs minutes at
        10,000 nodes. A rejection object is reused while its reason holds."""
        checked = self._memo(need)
        found = self._explained.get(need)
        if found is None:
            slots = [self._rejection(cap, need, checked) for cap in self._caps.values()]
            self._explained[need] = (slots, len(self._changed))
            return slots
        slots, seen = found
        if seen < len(self._changed):
            for node_id in dict.fromkeys(self._changed[seen:]):
                slots[self._order[node_id]] = self._rejection(self._caps[node_id], need, checked)
            self._explained[need] = (slots, len(self._changed))
        return slots

    def _rejection(self, cap: NodeCapacity, need: Need, checked: _Checked) -> Rejection | None:
        reason = self._check(cap, need, checked)
        if reason is None:
            return None
        made = checked.rejections.get(cap.node.id)
        if made is None or made.reason != reason:
            made = checked.rejections[cap.node.id] = Rejection(cap.node.id, reason)
        return made

    def _memo(self, need: Need) -> _Checked:
        checked = self._checked.get(need)
        if checked is None:
            checked = self._checked[need] = _Checked()
        return checked

    def _check(self, cap: NodeCapacity, need: Need, checked: _Checked) -> str | None:
        # Remembered until the node changes: an explanation for every model
        # that does not fit would otherwise run the chain over the whole fleet.
        node_id = cap.node.id
        if checked.versions.get(node_id) == cap.version:
            return checked.reasons[node_id]
        reason = rejection(cap, need, self._filters)
        checked.versions[node_id] = cap.version
        checked.reasons[node_id] = reason
        return reason

    def _heap(self, need: Need) -> list[_Entry]:
        """The need's candidate heap, with an entry for every node changed since it was used.

        An entry whose version is not the node's current one is outdated and
        dropped when it comes up (a newer one was pushed); pushing fresh ones is
        required because a change can make a node *better* (pack prefers fuller
        nodes). Fit is checked when an entry comes up, and a node that no longer
        fits is dropped then: capacity only shrinks, so it never fits again.
        """
        found = self._candidates.get(need)
        if found is None:
            heap: list[_Entry] = []
            checked = self._memo(need)
            for cap in self._caps.values():
                if self._check(cap, need, checked) is None:
                    heap.append((*self._score(cap, need), cap.node.id, cap.version))
            heapq.heapify(heap)
            self._candidates[need] = _Candidates(heap, len(self._changed))
            return heap
        if found.seen < len(self._changed):
            for node_id in dict.fromkeys(self._changed[found.seen :]):
                cap = self._caps[node_id]
                heapq.heappush(found.heap, (*self._score(cap, need), node_id, cap.version))
            found.seen = len(self._changed)
        return found.heap

    def _holders(self, model: CatalogModel) -> frozenset[str]:
        """The nodes holding `model`'s pinned hub weights on disk (empty: none does, or
        the weights are not a pinned hub snapshot, and locality decides nothing)."""
        held = self._held.get(model.launch_weights)
        return frozenset(held) if held else frozenset()

    def _weights_size(self, model: CatalogModel) -> int:
        """The bytes a node must download for `model`'s hub weights: the catalog's size
        (the hub's file list), else the size a node holding them reports; 0: unknown."""
        if hub_ref(model.launch_weights) is None:
            return 0
        if model.weights_bytes:
            return model.weights_bytes
        return max(self._held.get(model.launch_weights, {}).values(), default=0)

    def _no_room(self, model: CatalogModel) -> dict[str, str]:
        """The nodes that must download `model`'s weights and whose disk cannot take
        them, with the reason (empty: none, or the size is not known)."""
        key = model.launch_weights
        found = self._short.get(key)
        if found is None:
            size = self._weights_size(model)
            held = self._held.get(key, {})
            found = {}
            if size:
                for cap in self._caps.values():
                    if cap.node.id not in held:
                        reason = shortfall(cap.node, size)
                        if reason is not None:
                            found[cap.node.id] = reason
            self._short[key] = found
        return found

    def _weights_notes(self, model: CatalogModel, fits: list[NodeCapacity]) -> tuple[str, ...]:
        """Per fitting node, whether it holds the model's hub snapshot or must download it."""
        ref = hub_ref(model.launch_weights)
        if ref is None or not ref.pinned:
            return ()
        held = self._held.get(model.launch_weights, {})
        size = self._weights_size(model)
        short = ref.short()
        what = f"{decimal_size(size)} ({short})" if size else short
        return tuple(
            f"{c.node.id}: has {short} on disk"
            if c.node.id in held
            else f"{c.node.id}: must download {what}"
            for c in fits
        )

    def _pick(
        self,
        need: Need,
        model: str,
        avoid_nodes: frozenset[str],
        holders: frozenset[str] = frozenset(),
    ) -> NodeCapacity | None:
        heap = self._heap(need)
        checked = self._memo(need)
        popped: list[_Entry] = []
        best: tuple[int, NodeCapacity] | None = None
        while heap:
            entry = heap[0]
            cap = self._caps[entry[2]]
            if entry[3] != cap.version or self._check(cap, need, checked) is not None:
                heapq.heappop(heap)
                continue
            popped.append(heapq.heappop(heap))
            tier = _tier(cap, model, avoid_nodes, holders)
            if best is None or tier < best[0]:
                best = (tier, cap)
            if tier == 0:
                break
        # Only a reserve changes a node, and the caller decides whether to make one.
        for entry in popped:
            heapq.heappush(heap, entry)
        return best[1] if best is not None else None

    def _shard_key(self, cap: NodeCapacity) -> int:
        # Pack prefers busier nodes among equally free ones, spread idler ones.
        return cap.shards if self._spread else -cap.shards

    def _index(self, need: Need) -> _ByFree:
        """The fixed part's index, built on first use by running the fixed filters once
        per node (their verdict cannot change within the plan)."""
        key = Need(0, 0, need.gpu_kind, need.labels)
        index = self._by_free.get(key)
        if index is not None:
            return index
        probe = Need(1, 0, need.gpu_kind, need.labels)
        buckets: dict[int, list[tuple[int, str]]] = {}
        where: dict[str, tuple[int, int]] = {}
        for node_id, cap in self._caps.items():
            if rejection(cap, probe, _STATIC_FILTERS) is not None:
                continue
            free, order = len(cap.free_gpus), self._shard_key(cap)
            buckets.setdefault(free, []).append((order, node_id))
            where[node_id] = (free, order)
        for bucket in buckets.values():
            bucket.sort()
        index = self._by_free[key] = _ByFree(buckets, where)
        return index

    def _move(self, index: _ByFree, cap: NodeCapacity) -> None:
        node_id = cap.node.id
        old = index.where.get(node_id)
        if old is None:
            return
        free, order = len(cap.free_gpus), self._shard_key(cap)
        if old == (free, order):
            return
        bucket = index.buckets[old[0]]
        del bucket[bisect.bisect_left(bucket, (old[1], node_id))]
        bisect.insort(index.buckets.setdefault(free, []), (order, node_id))
        index.where[node_id] = (free, order)

    def _pick_by_free(
        self,
        need: Need,
        model: str,
        avoid_nodes: frozenset[str],
        holders: frozenset[str] = frozenset(),
    ) -> NodeCapacity | None:
        """`_pick` for a single-node need with GPUs under the default filters: walk the
        fixed part's nodes best first (by free GPUs, shards, id) from those with enough
        free GPUs, checking only what capacity decides, until a fresh node (tier 0)."""
        index = self._index(need)
        counts = [f for f in index.buckets if f >= need.gpus]
        counts.sort(reverse=self._spread)
        checked = self._memo(need)
        best: tuple[int, NodeCapacity] | None = None
        for free in counts:
            for _, node_id in index.buckets[free]:
                cap = self._caps[node_id]
                if checked.versions.get(node_id) == cap.version:
                    reason = checked.reasons[node_id]
                else:
                    reason = rejection(cap, need, _DYNAMIC_FILTERS)
                    checked.versions[node_id] = cap.version
                    checked.reasons[node_id] = reason
                if reason is not None:
                    continue
                tier = _tier(cap, model, avoid_nodes, holders)
                if tier == 0:
                    return cap
                if best is None or tier < best[0]:
                    best = (tier, cap)
        return best[1] if best is not None else None


def _ranked(
    ids: list[str],
    caps: dict[str, NodeCapacity],
    count: int,
    model: str,
    avoid_nodes: frozenset[str],
    avoid_ports: frozenset[tuple[str, int]],
) -> list[NodeCapacity]:
    """The nodes `ids` (sorted by score and id) ranked by tier, score and id, or enough
    of the front of that order for a gang of `count`: a prefix of fresh (tier 0) nodes
    holding `count` of them and one with two free ports decides the gang's head and
    members."""
    fresh: list[NodeCapacity] = []
    head = False
    for node_id in ids:
        cap = caps[node_id]
        if _tier(cap, model, avoid_nodes) != 0:
            continue
        fresh.append(cap)
        head = head or cap.two_ports(avoid_ports) is not None
        if head and len(fresh) >= count:
            return fresh
    # Python's sort is stable: ties in tier keep the score and id order.
    return sorted((caps[i] for i in ids), key=lambda c: _tier(c, model, avoid_nodes))


def _short_groups(fits: list[NodeCapacity], need: Need) -> tuple[str, ...]:
    """Per fabric value, how many of the nodes a gang needs fit, e.g.
    "ib-domain=pod3: 1 of 2 nodes with 8 free 80 GiB GPUs" (groups without any are
    left out: their nodes' reasons say why)."""
    assert need.fabric is not None
    counts: dict[str, int] = {}
    for cap in fits:
        value = fabric_of(cap.node, need.fabric)
        if value is not None:
            counts[value] = counts.get(value, 0) + 1
    what = need.describe()
    return tuple(
        f"{need.fabric}={value}: {count} of {need.nodes} nodes with {what}"
        for value, count in sorted(counts.items())
    )


def _tier(
    cap: NodeCapacity,
    model: str,
    avoid_nodes: frozenset[str],
    holders: frozenset[str] = frozenset(),
) -> int:
    """By twos: 0 a fresh node for this model, 2 it already runs a replica there, 4
    avoid; plus 1 when other nodes hold the model's weights on disk and this one does
    not (it would download them first, so its replica starts later)."""
    local = 1 if holders and cap.node.id not in holders else 0
    if cap.node.id in avoid_nodes:
        return 4 + local
    return (2 if cap.models.get(model) else 0) + local


def _placement(
    cap: NodeCapacity, profile: Profile, need: Need, avoid_ports: frozenset[tuple[str, int]]
) -> Placement:
    # Without filter_ports in the chain a node may have no free port: 0 lets the agent say so.
    port = cap.free_port(avoid_ports) or 0
    return Placement(
        node_id=cap.node.id, profile=profile, gpu_indices=cap.gpus_for(need), port=port
    )


def explain(
    model: CatalogModel,
    nodes: Sequence[Node],
    *,
    pending: Sequence[Pending] = (),
    policy: PlacementPolicy = "pack",
    avoid_nodes: frozenset[str] = frozenset(),
    avoid_ports: frozenset[tuple[str, int]] = frozenset(),
    filters: Sequence[Filter] = DEFAULT_FILTERS,
    mgmt_interface: str = "",
) -> Explanation:
    """Where one more replica of `model` would go, and why every other node would not.

    A dry run: nothing is started. `pending` are starts in flight, whose GPUs
    and ports count as taken.
    """
    fleet = Fleet(nodes, pending, policy=policy, filters=filters, mgmt_interface=mgmt_interface)
    return fleet.explain(model, avoid_nodes=avoid_nodes, avoid_ports=avoid_ports)
