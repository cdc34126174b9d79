"""The catalog's value types: a model clients can ask for and the profiles that serve it.

A `CatalogModel` says *what* should run; where it runs is the reconciler's
choice. Both types are immutable values built only by `llmgw.control.catalog.validate`
(from the config file or an admin API body), so every instance has passed the
one set of validation rules.

Not guaranteed: that the weights exist or that the engine accepts the profile's
arguments on a real node; the agent checks the launch, the engine the load.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from llmgw.config.hub import hub_ref
from llmgw.config.routing import ScorerWeights

ModelSource = Literal["config", "store"]

PINNED = -1.0
"""`keep_alive` of a model that is never scaled to zero once running."""


@dataclass(frozen=True, slots=True)
class AdapterSlots:
    """A profile's room for LoRA adapters loaded at run time, and what it adds to the
    engine's command line (`args`, at the end of `engine_args`) and environment (`env`)."""

    max_loaded: int
    max_rank: int
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Profile:
    """One way to serve a model: engine, its arguments and what one replica needs.

    `gpus` is the number of GPUs per replica (0: a CPU engine such as llama.cpp
    or sim). `gpu_memory` is the free memory, in bytes, each of those GPUs must
    have (0: any). `gpu_kind` is a case-insensitive substring of the GPU name
    ("H100", "L40S"); None accepts any. `labels` must all be present with the
    same value in the node's labels or fabric labels.

    `adapters` (None: the engine loads no LoRA adapters) is already expanded into
    `engine_args` and `env`, so everything that compares or launches a profile sees
    what the engine runs with; `own_engine_args` and `own_env` are the profile's own.

    `nodes` is how many nodes one replica spans (each with `gpus` GPUs); a
    multi-node replica's nodes all have the same value of fabric label
    `fabric`. Its parallel sizes are derived from these unless given: tensor
    parallel within a node, one pipeline stage per node.
    """

    name: str
    engine: str
    engine_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: int = 0
    gpu_memory: int = 0
    gpu_kind: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    # 0 means "as many as a node's GPUs of the replica" (1 without GPUs).
    tensor_parallel_size: int = 0
    # 0 means "what is left": one stage per node unless tensor parallel spans nodes.
    pipeline_parallel_size: int = 0
    nodes: int = 1
    fabric: str | None = None
    # 0 leaves the engine's own default in place.
    gpu_memory_utilization: float = 0.0
    # Seconds; None leaves the engine kind's default (set on the agent) in place.
    load_timeout: float | None = None
    unhealthy_after: float | None = None
    drain_grace: float | None = None
    adapters: AdapterSlots | None = None

    @property
    def own_engine_args(self) -> tuple[str, ...]:
        """`engine_args` as the profile gave them, without what `adapters` added."""
        added = len(self.adapters.args) if self.adapters is not None else 0
        return self.engine_args[: len(self.engine_args) - added]

    @property
    def own_env(self) -> Mapping[str, str]:
        """`env` as the profile gave it, without what `adapters` added."""
        if self.adapters is None:
            return self.env
        return {k: v for k, v in self.env.items() if k not in self.adapters.env}

    @property
    def tensor_parallel(self) -> int:
        return self.tensor_parallel_size or max(1, self.gpus)

    @property
    def pipeline_parallel(self) -> int:
        """The pipeline stages: as given, else one per node, or what is left of the
        replica's GPUs when tensor parallel spans nodes (2 nodes x 8 GPUs, tp 16: 1)."""
        if self.pipeline_parallel_size:
            return self.pipeline_parallel_size
        per_node = max(1, self.gpus)
        tp = self.tensor_parallel
        if tp <= per_node:
            return self.nodes
        return max(1, per_node * self.nodes // tp)

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


@dataclass(frozen=True, slots=True)
class CatalogModel:
    """A model in the catalog: the name clients send, and how to serve it.

    `keep_alive` is the idle time in seconds before the model is scaled down to
    `min_replicas`; `PINNED` (-1) keeps it running once started. `activation`
    says whether a request may start it when nothing runs. `target_in_flight`
    (None: off) is the number of requests in flight per replica the model is
    scaled for, up to `max_replicas`; `target_queue_depth` (waiting requests
    per replica: engines' queues plus the routers') and `target_kv_use` (mean
    KV-cache use, 0..1) are the same kind of target on other signals;
    `target_queue_wait` (seconds) is the longest wait in any router's queue,
    over which one replica more than are Ready is wanted. Any target above its
    mark adds replicas; replicas started for load are stopped once every target
    has stayed lower for `scale_down_delay` seconds.
    """

    name: str
    weights: str
    profiles: tuple[Profile, ...]
    aliases: tuple[str, ...] = ()
    min_replicas: int = 0
    max_replicas: int = 1
    keep_alive: float = 300.0
    # Idle seconds before its replicas sleep (None: they never do; see `reconciler.sleep`).
    sleep_after: float | None = None
    # Nodes that keep the hub weights on disk ahead of demand (see `reconciler.pulls`).
    prefetch: int = 0
    activation: bool = True
    source: ModelSource = "config"
    target_in_flight: int | None = None
    target_queue_depth: int | None = None
    target_kv_use: float | None = None
    target_queue_wait: float | None = None
    scale_down_delay: float = 60.0
    # Requests in flight per replica before the router queues (None: router default).
    max_in_flight: int | None = None
    # The model's own routing scorer weights (None: the server's router.routing.scorers).
    routing: ScorerWeights | None = None
    # A rollout starts up to `max_surge` new replicas beyond the wanted count and leaves
    # at most `max_unavailable` fewer Ready than wanted (see `reconciler.rollout`).
    max_surge: int = 1
    max_unavailable: int = 0
    # A canary beside the model's own spec (the stable version), or None.
    canary: Canary | None = None
    # The commit a hub `weights` revision resolved to when the model was added (or as
    # given); None for local weights and for config models (not resolved).
    weights_commit: str | None = None
    # The size of the hub weights at that commit (the hub's file list), or None: not
    # known (local weights, or the hub was not asked).
    weights_bytes: int | None = None
    # The base model of a LoRA adapter (None: a model of its own). An adapter has no
    # profiles: it is loaded at run time into its base's replicas.
    adapter_of: str | None = None

    @property
    def launch_weights(self) -> str:
        """What the nodes are told to run: `org/name@COMMIT` once pinned, else `weights`."""
        ref = hub_ref(self.weights)
        if ref is None or self.weights_commit is None:
            return self.weights
        return f"{ref.repo}@{self.weights_commit}"

    @property
    def names(self) -> tuple[str, ...]:
        """The name and every alias: what a client may send for this model."""
        return (self.name, *self.aliases)

    @property
    def scales_on_load(self) -> bool:
        """Whether any load target is set (the replica count follows the load)."""
        return bool(
            self.target_in_flight
            or self.target_queue_depth
            or self.target_queue_wait
            or self.target_kv_use
        )

    @property
    def pinned(self) -> bool:
        return self.keep_alive < 0


@dataclass(frozen=True, slots=True)
class Canary:
    """A model's second version: what its canary replicas run and its share of new
    conversations (`weight` against `stable_weight`). The model's own spec is the
    stable version, named `stable_name`."""

    name: str
    weight: int
    stable_name: str
    stable_weight: int
    weights: str
    profiles: tuple[Profile, ...]


def canary_model(model: CatalogModel) -> CatalogModel | None:
    """The model as its canary replicas run it (the canary's weights and profiles), or
    None when it has no canary."""
    canary = model.canary
    if canary is None:
        return None
    # The canary's weights are its own: not pinned (its nodes download them as written).
    same = canary.weights == model.weights
    return replace(
        model,
        weights=canary.weights,
        profiles=canary.profiles,
        canary=None,
        weights_commit=model.weights_commit if same else None,
        weights_bytes=model.weights_bytes if same else None,
    )


def launch_key(model: CatalogModel) -> str:
    """A short digest of what `model`'s replicas run: weights, and per profile the engine,
    its arguments and environment, GPU count, parallel sizes, GPU memory share, nodes.
    Two versions of a model with the same key run the same replicas, so a change
    between them applies in place; a change of key rolls the replicas."""
    launch = [
        model.launch_weights,
        [
            [
                p.engine,
                list(p.engine_args),
                p.gpus,
                p.tensor_parallel,
                p.pipeline_parallel,
                p.gpu_memory_utilization,
                p.nodes,
                sorted(p.env.items()),
            ]
            for p in model.profiles
        ],
    ]
    return hashlib.sha256(json.dumps(launch).encode()).hexdigest()[:16]
