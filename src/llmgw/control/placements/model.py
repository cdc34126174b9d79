"""A placement as the control plane holds it, and its form in the store.

`Placement` is one shard as the leader placed it: the node, the profile and the
start command's whole `ShardSpec` (so the model, the port, the rank and the
replica come from what the leader sent, never from what a node reports).
`to_stored`/`from_stored` convert to and from the store's `StoredPlacement`,
whose spec is plain JSON.

Not guaranteed: that a spec written by a newer server reads back whole here;
fields this version does not know are ignored, missing ones take their defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from llmgw.control.inventory.model import ShardSpec
from llmgw.store import StoredPlacement

_TUPLES = frozenset({"gpu_indices", "engine_args"})
_SPEC_FIELDS = {f.name for f in fields(ShardSpec)}


@dataclass(frozen=True, slots=True)
class Placement:
    """One shard placed on `node_id` with `profile`; what a node may report and serve."""

    node_id: str
    profile: str
    spec: ShardSpec

    @property
    def shard_id(self) -> str:
        return self.spec.shard_id

    @property
    def model(self) -> str:
        return self.spec.model

    @property
    def port(self) -> int:
        return self.spec.port


def spec_json(spec: ShardSpec) -> dict[str, Any]:
    """`spec` as JSON values (tuples as lists, the environment as an object)."""
    out: dict[str, Any] = {}
    for name in sorted(_SPEC_FIELDS):
        value = getattr(spec, name)
        if name in _TUPLES:
            value = list(value)
        elif name == "env":
            value = dict(value)
        out[name] = value
    return out


def spec_from_json(data: Mapping[str, Any]) -> ShardSpec:
    """A `ShardSpec` back from `spec_json`'s form; unknown keys are ignored."""
    values: dict[str, Any] = {}
    for name, raw in data.items():
        if name not in _SPEC_FIELDS:
            continue
        if name in _TUPLES:
            values[name] = tuple(raw)
        elif name == "env":
            values[name] = {str(k): str(v) for k, v in dict(raw).items()}
        else:
            values[name] = raw
    return ShardSpec(**values)


def to_stored(placement: Placement) -> StoredPlacement:
    spec = placement.spec
    return StoredPlacement(
        shard_id=spec.shard_id,
        replica_id=spec.replica,
        node_id=placement.node_id,
        model=spec.model,
        profile=placement.profile,
        port=spec.port,
        node_rank=spec.node_rank,
        nodes=spec.nodes,
        spec=spec_json(spec),
    )


def from_stored(stored: StoredPlacement) -> Placement:
    spec = spec_from_json(stored.spec)
    # The columns are what the store indexes and checks; they win over the JSON.
    if (spec.shard_id, spec.model, spec.port) != (stored.shard_id, stored.model, stored.port):
        spec = ShardSpec(
            **{
                **{name: getattr(spec, name) for name in _SPEC_FIELDS},
                "shard_id": stored.shard_id,
                "model": stored.model,
                "port": stored.port,
            }
        )
    return Placement(node_id=stored.node_id, profile=stored.profile, spec=spec)
