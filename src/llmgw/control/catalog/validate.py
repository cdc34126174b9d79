"""Turning configuration, API bodies and stored JSON into `CatalogModel`s, and back.

Every catalog model is built here, in two steps: `ModelConfig` (in
`llmgw.config.models`) checks what needs only the model itself, then
`_check_engines` checks what needs the engines: the engine is a known one, an
engine that needs GPUs gets them, and the engine's own adapter accepts the shard
spec the reconciler will send for the profile (the same GPU count, one tensor
parallel rank per GPU unless the profile says otherwise; for a multi-node
profile, rank 0's spec, with tensor x pipeline parallel equal to gpus x nodes).
So a model that passes here is refused later only for what cannot be known
without a node: missing weights, too little memory, an engine not installed.

Every `InvalidModel` names the model, the profile and the field ("model 'llama',
profile 'tp1', field 'gpus': vllm needs at least 1 GPU ...") and carries the
dotted path of the field ("profiles.0.gpus") for API error bodies.

Not guaranteed: that `model_to_dict` keeps unknown keys of what it was given
(there are none: unknown keys are refused), or the key order of its output.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from llmgw.config.models import ModelConfig, ProfileConfig
from llmgw.control.catalog.errors import InvalidModel, NameTaken
from llmgw.control.catalog.model import (
    AdapterSlots,
    Canary,
    CatalogModel,
    ModelSource,
    Profile,
    canary_model,
    launch_key,
)
from llmgw.engines import EngineSettings, EngineSpec, ProfileError, adapter_for
from llmgw.engines import checks as engine_checks

# What the engine checks see of a profile; the address and shard id are never checked
# against anything but their own form, so any valid ones do.
_PROBE_SHARD = "catalog-check"
_PROBE_PORT = 8000
# Adapters are built with settings only to build command lines, which the checks never do.
_PROBE_SETTINGS = EngineSettings(python=sys.executable)

# The engines word their remedies for a shard spec; a profile's author needs these.
_PROFILE_REMEDIES = {
    engine_checks.USE_HOST: "it sets the address the engine listens on; remove the argument",
    engine_checks.USE_PORT: "it picks a free port on the node; remove the argument",
    engine_checks.USE_MODEL: (
        "the engine serves the model under its catalog name; remove the argument (give "
        "the model aliases for other names)"
    ),
    engine_checks.USE_WEIGHTS: "set the model's weights instead, and remove the argument",
    engine_checks.USE_TP: (
        "set the profile's tensor_parallel_size instead, and remove the argument"
    ),
    engine_checks.USE_PP: (
        "set the profile's pipeline_parallel_size instead, and remove the argument"
    ),
    engine_checks.USE_MEMORY: (
        "set the profile's gpu_memory_utilization instead, and remove the argument"
    ),
    engine_checks.USE_DRAIN_GRACE: (
        "set the profile's drain_grace instead (the time in-flight requests get when the "
        "replica stops), and remove the argument"
    ),
}

# Fields of the model (not of a profile) that an engine's checks may name.
_MODEL_FIELDS = frozenset({"weights", "sleep_after"})

# A message that already starts by saying which model/profile it is about.
_SCOPED = re.compile(r"^(?:model '[^']*'(?:, profile '[^']*')?|profile '[^']*'): ")


def model_from_config(cfg: ModelConfig, *, source: ModelSource) -> CatalogModel:
    """The catalog model of a validated `ModelConfig`, after the engine checks."""
    model = CatalogModel(
        name=cfg.name,
        weights=cfg.weights,
        weights_commit=cfg.weights_commit,
        weights_bytes=cfg.weights_bytes,
        profiles=tuple(
            _profile(p, model=cfg.name, at=f"profiles.{i}") for i, p in enumerate(cfg.profiles)
        ),
        aliases=tuple(cfg.aliases),
        min_replicas=cfg.min_replicas,
        max_replicas=cfg.max_replicas,
        keep_alive=cfg.keep_alive,
        sleep_after=cfg.sleep_after,
        prefetch=cfg.prefetch,
        activation=cfg.activation,
        source=source,
        target_in_flight=cfg.target_in_flight,
        target_queue_depth=cfg.target_queue_depth,
        target_kv_use=cfg.target_kv_use,
        target_queue_wait=cfg.target_queue_wait,
        scale_down_delay=cfg.scale_down_delay,
        max_in_flight=cfg.max_in_flight,
        routing=cfg.routing.scorers if cfg.routing is not None else None,
        max_surge=cfg.rollout.max_surge,
        max_unavailable=cfg.rollout.max_unavailable,
        canary=_canary(cfg),
        adapter_of=cfg.adapter_of,
    )
    for index, profile in enumerate(model.profiles):
        _check_engine(model, index, profile)
    canary = canary_model(model)
    if canary is not None:
        for index, profile in enumerate(canary.profiles):
            _check_engine(canary, index, profile, at="versions.1.")
        _check_canary_differs(model, canary)
    return model


def _canary(cfg: ModelConfig) -> Canary | None:
    if cfg.versions is None:
        return None
    stable, second = cfg.versions
    return Canary(
        name=second.name,
        weight=second.weight,
        stable_name=stable.name,
        stable_weight=stable.weight,
        weights=second.weights if second.weights is not None else cfg.weights,
        profiles=tuple(
            _profile(p, model=cfg.name, at=f"versions.1.profiles.{i}")
            for i, p in enumerate(second.profiles if second.profiles is not None else cfg.profiles)
        ),
    )


def _check_canary_differs(model: CatalogModel, canary: CatalogModel) -> None:
    """Each replica must belong to one version: a canary profile that launches what a
    stable profile launches would make them indistinguishable."""
    stable = {launch_key(replace(model, profiles=(p,), canary=None)) for p in model.profiles}
    for index, profile in enumerate(canary.profiles):
        if launch_key(replace(canary, profiles=(profile,))) in stable:
            assert model.canary is not None
            raise InvalidModel(
                f"model {model.name!r}, versions[1] ({model.canary.name!r}): profile "
                f"{index} runs exactly what one of the model's own profiles runs (same "
                "weights, engine, arguments, GPUs and environment), so its replicas could "
                "not be told apart; change the canary's weights, arguments or engine",
                field="versions.1",
            )


def parse_model(data: object, *, source: ModelSource = "store") -> CatalogModel:
    """A catalog model from JSON-like data (an API body, a stored spec, a YAML entry).

    `InvalidModel` lists every problem the first step finds (the first one in
    `field`), or the first engine problem.
    """
    try:
        cfg = ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise _invalid(data, exc) from exc
    return model_from_config(cfg, source=source)


def model_to_dict(model: CatalogModel) -> dict[str, Any]:
    """The model as JSON-able data that `parse_model` reads back to an equal model.

    Sizes are bytes (ints), `keep_alive`, `scale_down_delay` and
    `target_queue_wait` are seconds (an int when whole; `keep_alive` -1 when
    pinned); `source` is left out (it is where the model lives, not what it is).
    An adapter has only its own fields (the rest are its base's).
    """
    if model.adapter_of is not None:
        return {
            "name": model.name,
            "adapter_of": model.adapter_of,
            "aliases": list(model.aliases),
            "weights": model.weights,
            **({"weights_commit": model.weights_commit} if model.weights_commit else {}),
        }
    return {
        "name": model.name,
        "aliases": list(model.aliases),
        "weights": model.weights,
        **({"weights_commit": model.weights_commit} if model.weights_commit else {}),
        **({"weights_bytes": model.weights_bytes} if model.weights_bytes is not None else {}),
        "profiles": [
            {
                "name": p.name,
                "engine": p.engine,
                "engine_args": list(p.own_engine_args),
                "env": dict(p.own_env),
                **(
                    {
                        "adapters": {
                            "max_loaded": p.adapters.max_loaded,
                            "max_rank": p.adapters.max_rank,
                        }
                    }
                    if p.adapters is not None
                    else {}
                ),
                "gpus": p.gpus,
                "gpu_memory": p.gpu_memory,
                "gpu_kind": p.gpu_kind,
                "labels": dict(p.labels),
                "tensor_parallel_size": p.tensor_parallel_size,
                "gpu_memory_utilization": p.gpu_memory_utilization,
                **(
                    {
                        "nodes": p.nodes,
                        "fabric": p.fabric,
                        "pipeline_parallel_size": p.pipeline_parallel_size,
                    }
                    if p.multi_node or p.pipeline_parallel_size
                    else {}
                ),
                **{
                    key: _number(value)
                    for key, value in (
                        ("load_timeout", p.load_timeout),
                        ("unhealthy_after", p.unhealthy_after),
                        ("drain_grace", p.drain_grace),
                    )
                    if value is not None
                },
            }
            for p in model.profiles
        ],
        "min_replicas": model.min_replicas,
        "max_replicas": model.max_replicas,
        "keep_alive": _number(model.keep_alive),
        **({"sleep_after": _number(model.sleep_after)} if model.sleep_after is not None else {}),
        **({"prefetch": model.prefetch} if model.prefetch else {}),
        "activation": model.activation,
        "target_in_flight": model.target_in_flight,
        "target_queue_depth": model.target_queue_depth,
        "target_kv_use": model.target_kv_use,
        "target_queue_wait": (
            None if model.target_queue_wait is None else _number(model.target_queue_wait)
        ),
        "scale_down_delay": _number(model.scale_down_delay),
        **({"max_in_flight": model.max_in_flight} if model.max_in_flight is not None else {}),
        **(
            {"routing": {"scorers": model.routing.model_dump()}}
            if model.routing is not None
            else {}
        ),
        **(
            {
                "rollout": {
                    "max_surge": model.max_surge,
                    "max_unavailable": model.max_unavailable,
                }
            }
            if (model.max_surge, model.max_unavailable) != (1, 0)
            else {}
        ),
        **({"versions": _versions(model)} if model.canary is not None else {}),
    }


def _versions(model: CatalogModel) -> list[dict[str, Any]]:
    canary = model.canary
    assert canary is not None
    as_canary = canary_model(model)
    assert as_canary is not None
    return [
        {"name": canary.stable_name, "weight": canary.stable_weight},
        {
            "name": canary.name,
            "weight": canary.weight,
            "weights": canary.weights,
            "profiles": model_to_dict(as_canary)["profiles"],
        },
    ]


def check_names_free(model: CatalogModel, others: Sequence[CatalogModel]) -> None:
    """`NameTaken` if a name or alias of `model` is a name or alias of one of `others`."""
    for other in others:
        if other.name == model.name:
            continue
        clash = sorted(set(model.names) & set(other.names))
        if clash:
            raise NameTaken(_clash_message(model, other, clash[0]))


def _clash_message(model: CatalogModel, other: CatalogModel, name: str) -> str:
    mine = "name" if name == model.name else "alias"
    theirs = "the name" if name == other.name else "an alias"
    where = " (declared in the config file)" if other.source == "config" else ""
    return (
        f"model {model.name!r}: its {mine} {name!r} is already {theirs} of model "
        f"{other.name!r}{where}; a name a client sends must mean one model, so choose "
        "another"
    )


def _profile(cfg: ProfileConfig, *, model: str, at: str) -> Profile:
    adapter_args, adapter_env = _adapter_launch(cfg, model=model, at=at)
    return Profile(
        name=cfg.name,
        engine=cfg.engine,
        engine_args=(*cfg.engine_args, *adapter_args),
        env={**cfg.env, **adapter_env},
        adapters=(
            None
            if cfg.adapters is None
            else AdapterSlots(
                max_loaded=cfg.adapters.max_loaded,
                max_rank=cfg.adapters.max_rank,
                args=adapter_args,
                env=adapter_env,
            )
        ),
        gpus=cfg.gpus,
        gpu_memory=cfg.gpu_memory,
        gpu_kind=cfg.gpu_kind,
        labels=dict(cfg.labels),
        tensor_parallel_size=cfg.tensor_parallel_size,
        pipeline_parallel_size=cfg.pipeline_parallel_size,
        nodes=cfg.nodes,
        fabric=cfg.fabric,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        load_timeout=cfg.load_timeout,
        unhealthy_after=cfg.unhealthy_after,
        drain_grace=cfg.drain_grace,
    )


def _adapter_launch(
    cfg: ProfileConfig, *, model: str, at: str
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The engine arguments and environment of the profile's `adapters` (none without),
    refused when the engine cannot load adapters or the profile already sets them."""
    slots = cfg.adapters
    if slots is None:
        return (), {}

    def fail(message: str) -> InvalidModel:
        return InvalidModel(_message(model, cfg.name, "adapters", message), f"{at}.adapters")

    try:
        adapter = adapter_for(cfg.engine, settings=_PROBE_SETTINGS)
        args, env = adapter.lora_launch(slots.max_loaded, slots.max_rank)
    except ProfileError as exc:
        raise fail(exc.message) from exc
    flags = {arg.split("=", 1)[0] for arg in cfg.engine_args if arg.startswith("--")}
    twice = [arg for arg in args if arg.startswith("--") and arg in flags]
    if twice:
        raise fail(
            f"engine_args also set {twice[0]}, which adapters sets for {cfg.engine}; "
            f"remove {twice[0]} from engine_args (adapters says it once for every engine)"
        )
    clash = sorted(key for key in env if key in cfg.env and cfg.env[key] != env[key])
    if clash:
        raise fail(
            f"env sets {clash[0]}={cfg.env[clash[0]]!r}, but adapters needs "
            f"{clash[0]}={env[clash[0]]!r}; remove it from env"
        )
    return args, env


def _number(value: float) -> int | float:
    return int(value) if value.is_integer() else value


# ---- engine checks ----


def _check_engine(model: CatalogModel, index: int, profile: Profile, *, at: str = "") -> None:
    """`at`: the field path prefix of the profiles' owner ("versions.1." for a canary)."""

    def fail(field: str, message: str) -> InvalidModel:
        path = at + (field if field in _MODEL_FIELDS else f"profiles.{index}.{field}")
        return InvalidModel(_message(model.name, profile.name, field, message), path)

    try:
        adapter = adapter_for(profile.engine, settings=_PROBE_SETTINGS)
    except ProfileError as exc:
        raise fail("engine", exc.message) from exc
    if adapter.needs_gpus and profile.gpus < 1:
        raise fail(
            "gpus",
            f"{profile.engine} needs at least 1 GPU; set gpus (e.g. gpus: 1), or serve "
            "without GPUs with the vllm, llamacpp or sim engine",
        )
    tensor_parallel = profile.tensor_parallel
    pipeline_parallel = profile.pipeline_parallel
    ranks = profile.gpus * profile.nodes
    # Without GPUs a CPU-capable engine runs one rank; the engine's own check says so.
    if adapter.gpu_ranks and profile.gpus > 0 and tensor_parallel * pipeline_parallel != ranks:
        if profile.multi_node or profile.pipeline_parallel_size:
            raise fail(
                "pipeline_parallel_size" if profile.pipeline_parallel_size else "nodes",
                f"{profile.engine} runs one rank on each GPU of the replica, so "
                f"tensor_parallel_size ({tensor_parallel}) x pipeline_parallel_size "
                f"({pipeline_parallel}) must equal gpus x nodes ({profile.gpus} x "
                f"{profile.nodes} = {ranks}); leave both at 0 for tensor parallel within "
                "a node and one pipeline stage per node",
            )
        raise fail(
            "tensor_parallel_size",
            f"{profile.engine} runs one tensor-parallel rank on each GPU of the replica, "
            f"so tensor_parallel_size ({tensor_parallel}) must equal gpus ({profile.gpus}); "
            "set it to the GPU count or leave it at 0",
        )
    spec = EngineSpec(
        shard_id=_PROBE_SHARD,
        model=model.name,
        engine=profile.engine,
        weights=model.weights,
        port=_PROBE_PORT,
        gpu_indices=tuple(range(profile.gpus)),
        engine_args=profile.engine_args,
        env=profile.env,
        tensor_parallel_size=tensor_parallel,
        pipeline_parallel_size=pipeline_parallel,
        nodes=profile.nodes,
        # Rank 0's line: the master address and port are the node's, never the profile's.
        master_addr="10.0.0.1" if profile.multi_node else "",
        master_port=_PROBE_PORT + 1 if profile.multi_node else 0,
        gpu_memory_utilization=profile.gpu_memory_utilization or None,
        load_timeout=profile.load_timeout,
        unhealthy_after=profile.unhealthy_after,
        drain_grace=profile.drain_grace,
        sleep_mode=model.sleep_after is not None,
    )
    try:
        adapter.validate(spec)
    except ProfileError as exc:
        field, message = _profile_field(exc, profile)
        raise fail(field, message) from exc


def _profile_field(exc: ProfileError, profile: Profile) -> tuple[str, str]:
    """The profile field an engine's complaint about the shard spec is really about."""
    if exc.field in {"tensor_parallel_size", "pipeline_parallel_size", "gpu_indices"}:
        if profile.tensor_parallel_size == 0 and profile.gpus > 1:
            note = f" (tensor_parallel_size 0 means one rank per GPU, {profile.gpus} here)"
            return "tensor_parallel_size", exc.message + note
        return ("tensor_parallel_size" if profile.tensor_parallel_size else "gpus"), exc.message
    if exc.field in {
        "engine",
        "nodes",
        "engine_args",
        "env",
        "weights",
        "sleep_after",
        "gpu_memory_utilization",
        "load_timeout",
        "unhealthy_after",
        "drain_grace",
    }:
        message = exc.message
        for remedy, instead in _PROFILE_REMEDIES.items():
            message = message.replace(remedy, instead)
        return exc.field, message
    # "model", "host", "port": the name is checked by ModelConfig, the address is ours.
    return "engine", f"{exc.field}: {exc.message}"


# ---- messages ----


def _message(model: str | None, profile: str | None, field: str, message: str) -> str:
    parts = [f"model {model!r}" if model is not None else "model (no valid name)"]
    if profile is not None:
        parts.append(f"profile {profile!r}")
    if field:
        parts.append(f"field {field!r}")
    return f"{', '.join(parts)}: {_SCOPED.sub('', message, count=1)}"


def _invalid(data: object, exc: ValidationError) -> InvalidModel:
    problems: list[tuple[str, str]] = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        path = ".".join(str(part) for part in loc)
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field (check its spelling and where it is nested)"
        elif error["type"] == "model_type":
            message = (
                "must be a JSON object (a mapping of fields), got " + type(error["input"]).__name__
            )
        model, profile, field = _locate(data, loc)
        problems.append((path, _message(model, profile, field, message)))
    path, first = problems[0]
    if len(problems) > 1:
        first += f" (and {len(problems) - 1} more: " + "; ".join(m for _, m in problems[1:]) + ")"
    return InvalidModel(first, path, tuple(problems))


def _locate(data: object, loc: tuple[int | str, ...]) -> tuple[str | None, str | None, str]:
    """The model name, the profile name and the field, for an error at `loc` in `data`."""
    raw: Mapping[str, Any] = data if isinstance(data, Mapping) else {}
    name = raw.get("name")
    model = name if isinstance(name, str) and name else None
    if len(loc) >= 2 and loc[0] == "profiles" and isinstance(loc[1], int):
        profiles = raw.get("profiles")
        entry = profiles[loc[1]] if isinstance(profiles, list) and loc[1] < len(profiles) else {}
        entry = entry if isinstance(entry, Mapping) else {}
        label = entry.get("name") or entry.get("engine")
        profile = label if isinstance(label, str) and label else f"#{loc[1]}"
        return model, profile, ".".join(str(part) for part in loc[2:])
    return model, None, ".".join(str(part) for part in loc)
