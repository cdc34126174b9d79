"""The catalog's models and profiles as they are written: the `models:` section and API bodies.

`ModelConfig` and `ProfileConfig` hold every validation rule of a catalog model
that needs nothing but the model itself: names, replica counts, durations and
sizes, GPU counts. The same models validate the config file's `models:` entries,
admin API bodies, `llmgw models add` and what the store kept, so a rule is
written once. Rules that need to know the engines (is `engine` a known one, does
it need GPUs, does it accept these arguments) are checked one layer up, by
`llmgw.control.catalog.validate`, which turns a `ModelConfig` into the catalog's
`CatalogModel`; this package cannot import the engines.

Messages of rules that involve several fields start with the model or profile
they are about ("model 'llama': max_replicas (1) is below min_replicas (2)"),
because a config loader prints them after a field path with list indices only.
`scope` builds that prefix, so the catalog can recognise and re-word it.

Not guaranteed: that the weights exist, that the GPU kind or the labels match
any node, or that the engine starts; placement and the agent find those out.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, NoReturn

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from llmgw.config.hub import COMMIT, hub_ref
from llmgw.config.routing import ModelRouting

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
PROFILE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
_PROFILE_NAME = re.compile(PROFILE_NAME_PATTERN)
_NAME_RULE = (
    "must be 1-128 letters, digits, '.', '_', ':', '/' or '-', starting with a letter or digit"
)

PIN = -1.0
"""`keep_alive` that keeps a model running once started (never scaled to zero)."""

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)", re.IGNORECASE)
_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
    "TIB": 1 << 40,
}

# Strict: `true` is not 1 and "2" is not a count, in a config file or an API body.
StrictCount = Annotated[int, Strict()]
# Strict: `true` is not 1 and "0.9" is not a number, in a config file or an API body.
StrictFraction = Annotated[float, Strict()]
# Strict: `true` is not 1 s and "2s" is not a number of seconds.
StrictSeconds = Annotated[float, Strict()]


def scope(model: str | None = None, profile: str | None = None) -> str:
    """The prefix naming what a message is about: "model 'llama', profile 'tp1'"."""
    parts = []
    if model is not None:
        parts.append(f"model {model!r}")
    if profile is not None:
        parts.append(f"profile {profile!r}")
    return ", ".join(parts)


def _about(scope_text: str, message: str) -> str:
    return f"{scope_text}: {message}" if scope_text else message


def parse_duration(value: object) -> float:
    """Seconds from a number or a duration string ("300", "300s", "5m", "1h30m", "-1").

    -1 means pinned; any other negative, infinite or non-numeric value raises
    ValueError saying what is accepted.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; give seconds (300), '5m', or -1 to pin")
    seconds: float
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if re.fullmatch(r"-?\d+(?:\.\d+)?", text):
            seconds = float(text)
        elif _DURATION.fullmatch(text):
            seconds = sum(
                float(number) * _DURATION_UNITS[unit]
                for number, unit in _DURATION_PART.findall(text)
            )
        else:
            raise ValueError(
                f"{value!r} is not a duration; give seconds (300) or a number with a unit "
                "ms, s, m, h or d ('300s', '5m', '1h30m'), or -1 to pin the model"
            )
    else:
        raise ValueError(
            f"{value!r} is not a duration; give seconds (300), '5m', or -1 to pin the model"
        )
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not finite; give -1 to keep the model running forever")
    if seconds < 0 and seconds != PIN:
        raise ValueError(
            f"{value!r} is negative; give 0 or more seconds, or exactly -1 to pin the model"
        )
    return seconds


def parse_size(value: object) -> int:
    """Bytes from an integer or a size with a unit ("24GiB", "80GB", "512MiB", "1024B").

    GB is 10^9 bytes and GiB 2^30, as GPU vendors and tools use them; a string
    without a unit is refused because "24" could mean either.
    """
    if isinstance(value, bool | float):
        raise ValueError(f"{value!r} is not a size; give bytes as an integer, or e.g. '24GiB'")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        match = _SIZE.fullmatch(value.strip())
        if match is None:
            raise ValueError(
                f"{value!r} is not a size with a unit; give e.g. '24GiB', '80GB' or '512MiB' "
                "(GiB = 2^30 bytes, GB = 10^9), or bytes as an integer"
            )
        number, unit = match.groups()
        size = int(float(number) * _SIZE_UNITS[unit.upper()])
    else:
        raise ValueError(f"{value!r} is not a size; give bytes as an integer, or e.g. '24GiB'")
    if size < 0:
        raise ValueError(f"{value!r} is negative; give 0 (any GPU) or a size such as '24GiB'")
    return size


def _raise(where: str, message: str) -> NoReturn:
    raise ValueError(_about(where, message))


def _check_mapping(value: dict[str, str], what: str) -> dict[str, str]:
    for key in value:
        if not key.strip() or key != key.strip():
            raise ValueError(f"{what} name {key!r} is empty or has surrounding spaces")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdapterSlotsConfig(_Strict):
    """A base model's room for LoRA adapters loaded at run time (a profile's `adapters`)."""

    max_loaded: StrictCount = Field(
        ge=1,
        description=(
            "Adapters loaded at once in one replica (vLLM's --max-loras, SGLang's "
            "--max-loras-per-batch and --max-loaded-loras). Required: it sizes the memory "
            "the engine keeps for adapters, which only the operator can weigh."
        ),
    )
    max_rank: StrictCount = Field(
        default=16,
        ge=1,
        description=(
            "Highest LoRA rank an adapter may have (the engines' --max-lora-rank). 16 by "
            "default, vLLM's own default; an adapter of higher rank is refused on load."
        ),
    )


class ProfileConfig(_Strict):
    """One way to serve a model: an engine, its arguments and what one replica needs."""

    name: str = Field(
        description=(
            "Names the profile in placement explanations and replica views. Defaults to "
            "the engine name, which is unique enough for the common one-profile model; "
            "give names when a model has two profiles with the same engine."
        ),
    )
    engine: str = Field(
        description=(
            "The engine that serves the model: vllm, sglang, llamacpp or sim. Required: "
            "there is no engine that suits every model and node."
        ),
    )
    engine_args: list[str] = Field(
        default_factory=list,
        description=(
            "Extra command-line arguments for the engine, appended as given. Empty by "
            "default: llmgw sets the model, address, port and parallelism itself."
        ),
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment for the engine process; empty: the agent's own is enough.",
    )
    gpus: StrictCount = Field(
        default=0,
        ge=0,
        description=(
            "GPUs per replica, all on one node. 0 by default, for engines on the node's "
            "CPUs (llamacpp, sim, and vllm's CPU backend as one rank); sglang needs at least 1."
        ),
    )
    gpu_memory: int = Field(
        default=0,
        description=(
            "Free memory each of the replica's GPUs must have: bytes, or a size such as "
            "'24GiB' or '80GB'. 0 by default: any GPU will do, the engine finds out."
        ),
    )
    gpu_kind: str | None = Field(
        default=None,
        description=(
            "Case-insensitive part of the GPU name ('H100', 'L40S') the replica must run "
            "on. Unset by default: any kind of GPU."
        ),
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Node labels (or fabric labels) a node must have, with these values, to run "
            "the replica. Empty by default: every node qualifies."
        ),
    )
    nodes: StrictCount = Field(
        default=1,
        ge=1,
        description=(
            "Nodes one replica spans, each with `gpus` GPUs: a model too big for one node "
            "runs as one shard per node, placed together (all or nothing) on nodes that "
            "share the `fabric` label. 1 by default: a replica on one node needs no fabric."
        ),
    )
    fabric: str | None = Field(
        default=None,
        description=(
            "The fabric label (e.g. 'ib-domain') whose value every node of a multi-node "
            "replica must share, so that its ranks talk over one fast network. Required "
            "when nodes is more than 1, and only then."
        ),
    )
    tensor_parallel_size: StrictCount = Field(
        default=0,
        ge=0,
        description=(
            "Tensor-parallel ranks of one replica, one per GPU. 0 by default, meaning "
            "one per GPU of a node (1 without GPUs), which is what vLLM and SGLang "
            "need on one node; set 1 to give llama.cpp several GPUs. A multi-node "
            "replica may give up to gpus x nodes."
        ),
    )
    pipeline_parallel_size: StrictCount = Field(
        default=0,
        ge=0,
        description=(
            "Pipeline stages of one replica. 0 by default, meaning one stage per node "
            "(tensor parallel within a node, pipeline across nodes, the layout vLLM "
            "recommends), or as many as the GPUs left for it when tensor_parallel_size "
            "spans nodes. tensor x pipeline must equal gpus x nodes for vLLM and SGLang."
        ),
    )
    gpu_memory_utilization: StrictFraction = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description=(
            "Fraction (0, 1] of each GPU's memory the engine may use. 0 by default: the "
            "engine's own default (0.9 for vLLM), which suits a GPU the replica has alone."
        ),
    )
    load_timeout: float | None = Field(
        default=None,
        description=(
            "How long a replica may take from its start to its first ready answer: seconds "
            "or a duration ('20m'). Past it the replica fails with the engine's output and "
            "is retried with backoff. Unset by default: the engine's own (30 min for vllm "
            "and sglang, which may download weights first; 2 min for llamacpp; 1 min for "
            "sim)."
        ),
    )
    unhealthy_after: float | None = Field(
        default=None,
        description=(
            "How long a ready replica's health probe may keep failing before the replica is "
            "restarted: seconds or a duration ('1m'). Unset by default: the engine's own "
            "(1 min for vllm and sglang, 2 min for llamacpp, 30 s for sim), long enough "
            "that a busy engine is not mistaken for a hung one."
        ),
    )
    adapters: AdapterSlotsConfig | None = Field(
        default=None,
        description=(
            "Start the engine ready to load LoRA adapters at run time, with this many "
            "slots and this rank limit (vllm, sglang and sim; llama.cpp takes adapters "
            "only at start). Unset by default: no adapter memory is set aside."
        ),
    )
    drain_grace: float | None = Field(
        default=None,
        description=(
            "On drain or stop, how long the engine's in-flight requests get after SIGTERM "
            "to its main process before the whole process group is signalled: seconds or "
            "a duration ('45s'). Unset by default: the engine's own (30 s for vllm and "
            "sglang, 10 s for llamacpp, 5 s for sim)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        engine = data.get("engine") if isinstance(data, dict) else None
        if isinstance(data, dict) and data.get("name") is None and isinstance(engine, str):
            return {**data, "name": engine}
        return data

    @field_validator("load_timeout", "unhealthy_after", "drain_grace", mode="before")
    @classmethod
    def _parse_deadline(cls, value: object, info: ValidationInfo) -> float | None:
        if value is None:
            return None
        try:
            seconds = parse_duration(value)
        except ValueError:
            seconds = -1.0
        least = 0.0 if info.field_name == "drain_grace" else 1e-9
        if seconds < least:
            raise ValueError(
                f"{value!r} is not a {info.field_name} ("
                + ("zero or more" if least == 0 else "more than 0")
                + " seconds, or a duration such as '90s' or '20m'); leave it out for the "
                "engine's default"
            )
        return seconds

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _PROFILE_NAME.match(value):
            raise ValueError(
                f"{value!r} is not a profile name: 1-64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, value: str) -> str:
        if not value.strip() or value != value.strip():
            raise ValueError(
                f"{value!r} is empty or has surrounding spaces; give the engine's name, e.g. vllm"
            )
        return value

    @field_validator("env")
    @classmethod
    def _check_env(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_mapping(value, "variable")

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_mapping(value, "label")

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _parse_gpu_memory(cls, value: object) -> int:
        return parse_size(value)

    @field_validator("gpu_memory")
    @classmethod
    def _memory_needs_gpus(cls, value: int, info: ValidationInfo) -> int:
        gpus = info.data.get("gpus")
        if value > 0 and gpus == 0:
            raise ValueError(
                _about(
                    scope(profile=info.data.get("name")),
                    "gpu_memory is set but gpus is 0; give the replica GPUs, or remove "
                    "gpu_memory for a CPU engine",
                )
            )
        return value

    @field_validator("gpu_kind")
    @classmethod
    def _check_gpu_kind(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("is empty; give part of the GPU name (e.g. 'H100'), or leave it out")
        if info.data.get("gpus") == 0:
            raise ValueError(
                _about(
                    scope(profile=info.data.get("name")),
                    f"gpu_kind {value!r} is set but gpus is 0; give the replica GPUs, or "
                    "remove gpu_kind for a CPU engine",
                )
            )
        return value.strip()

    @field_validator("fabric")
    @classmethod
    def _check_fabric(cls, value: str | None, info: ValidationInfo) -> str | None:
        nodes = info.data.get("nodes")
        where = scope(profile=info.data.get("name"))
        if value is None:
            return None
        if not value.strip() or value != value.strip() or "=" in value:
            _raise(
                where,
                f"fabric {value!r} is not a label name; give the label's key only "
                "(e.g. 'ib-domain'), without '=' or surrounding spaces",
            )
        if nodes == 1:
            _raise(
                where,
                f"fabric {value!r} is set but nodes is 1; a replica on one node needs no "
                "fabric: remove fabric, or set nodes to 2 or more",
            )
        return value

    @model_validator(mode="after")
    def _fabric_for_nodes(self) -> ProfileConfig:
        # An unset field is not validated, so the rule that needs it lives here.
        if self.nodes > 1 and self.fabric is None:
            raise PydanticCustomError(
                "fabric_missing",
                _about(
                    scope(profile=self.name),
                    f"nodes is {self.nodes} but fabric is not set; name the fabric label "
                    "all of the replica's nodes must share (e.g. fabric: ib-domain)",
                ),
            )
        return self

    @field_validator("tensor_parallel_size")
    @classmethod
    def _check_tensor_parallel(cls, value: int, info: ValidationInfo) -> int:
        gpus = info.data.get("gpus")
        nodes = info.data.get("nodes")
        nodes = nodes if isinstance(nodes, int) else 1
        if not isinstance(gpus, int) or value <= max(1, gpus * nodes):
            return value
        where = scope(profile=info.data.get("name"))
        if gpus == 0:
            _raise(
                where,
                f"tensor_parallel_size {value} needs GPUs but gpus is 0; each rank runs on "
                "its own GPU, so set gpus too (or leave tensor_parallel_size at 0)",
            )
        if nodes > 1:
            _raise(
                where,
                f"tensor_parallel_size ({value}) is more than gpus x nodes ({gpus} x "
                f"{nodes}); each rank runs on its own GPU, so give at most {gpus * nodes} "
                "(0 means one per GPU of a node)",
            )
        _raise(
            where,
            f"tensor_parallel_size ({value}) is more than gpus ({gpus}); each rank runs on "
            f"its own GPU, so give at most {gpus} (0 means one per GPU)",
        )

    @field_validator("pipeline_parallel_size")
    @classmethod
    def _check_pipeline_parallel(cls, value: int, info: ValidationInfo) -> int:
        gpus, nodes = info.data.get("gpus"), info.data.get("nodes")
        tp = info.data.get("tensor_parallel_size")
        if value == 0 or not all(isinstance(n, int) for n in (gpus, nodes, tp)):
            return value
        assert isinstance(gpus, int) and isinstance(nodes, int) and isinstance(tp, int)
        ranks = max(1, gpus) * nodes
        if value * (tp or max(1, gpus)) > ranks:
            _raise(
                scope(profile=info.data.get("name")),
                f"pipeline_parallel_size ({value}) x tensor_parallel_size "
                f"({tp or max(1, gpus)}) is more than the replica's {ranks} "
                f"GPU{'' if ranks == 1 else 's'} (gpus {gpus} x nodes {nodes}); each rank "
                "runs on its own GPU",
            )
        return value


class ModelRollout(_Strict):
    """How a change to what a model's replicas run is rolled out over its replicas."""

    max_surge: StrictCount = Field(
        default=1,
        ge=0,
        description=(
            "Replicas of the new spec started beyond the wanted count while old ones still "
            "serve. 1 by default: one new replica loads at a time, and the old ones keep "
            "serving until it is Ready, so no request waits and only one replica's GPUs "
            "are needed on top."
        ),
    )
    max_unavailable: StrictCount = Field(
        default=0,
        ge=0,
        description=(
            "Ready replicas fewer than wanted that a rollout may leave while it replaces "
            "them. 0 by default: an old replica stops only once a new one is Ready, so "
            "the model never serves with fewer replicas than wanted. Raise it where GPUs "
            "are too few for a surge."
        ),
    )

    @model_validator(mode="after")
    def _check_progress(self) -> ModelRollout:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError(
                "max_surge and max_unavailable are both 0, so a rollout could never start a "
                "new replica nor stop an old one; raise one of them"
            )
        return self


class ModelVersion(_Strict):
    """One of a canary's two versions: its name, its share of new conversations, and for
    the canary (the second) what its replicas run instead of the model's own spec."""

    name: str = Field(
        max_length=64,
        description=(
            "The version's name (at most 64 characters), e.g. 'stable' or 'v2': usage "
            "records and the `version` label of the request metrics carry it. Required."
        ),
    )
    weight: StrictCount = Field(
        ge=1,
        le=99,
        description=(
            "The version's share of new conversations, against the other version's "
            "weight (90 and 10: about one new conversation in ten goes to the canary). "
            "Required: there is no sensible split to guess."
        ),
    )
    weights: str | None = Field(
        default=None,
        description=(
            "The canary's weights (local path, GGUF file or hub id). Unset: the model's. "
            "Only on the second version; the first is the model's own spec."
        ),
    )
    profiles: list[ProfileConfig] | None = Field(
        default=None,
        min_length=1,
        description=(
            "The canary's profiles. Unset: the model's. Only on the second version; the "
            "first is the model's own spec."
        ),
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r} is not a version name: {_NAME_RULE}")
        return value


# What an adapter entry (adapter_of set) may say; everything else is its base's.
_ADAPTER_FIELDS = frozenset({"name", "aliases", "weights", "weights_commit", "adapter_of"})


class ModelConfig(_Strict):
    """A model clients can ask for: its names, weights, profiles and scaling rules."""

    name: str = Field(
        description=(
            "The name clients send as `model`. Required, and unique among all names and "
            "aliases in the catalog."
        ),
    )
    aliases: list[str] = Field(
        default_factory=list,
        description=(
            "Other names clients may send for this model (e.g. 'gpt-4o' for a drop-in "
            "replacement). None by default: most models have one name."
        ),
    )
    weights: str = Field(
        description=(
            "Where the engine loads the model from: a local path, a GGUF file or a hub "
            "id. Required: there is nothing sensible to guess."
        ),
    )
    weights_commit: str | None = Field(
        default=None,
        description=(
            "The commit SHA that a hub `weights` revision resolved to. Unset: the server "
            "asks the hub when the model is added through the admin API or the config "
            "file is read, so every node runs the same bytes; set it to pin a commit "
            "yourself (the hub is then asked only for its size, and never refuses it)."
        ),
    )
    weights_bytes: int | None = Field(
        default=None,
        ge=0,
        description=(
            "The size of the hub weights at `weights_commit`, from the hub's file list. "
            "Unset: filled in when the server resolves the commit; placement uses it to "
            "rule out a node whose disk cannot take a download."
        ),
    )
    adapter_of: str | None = Field(
        default=None,
        description=(
            "Makes this entry a LoRA adapter of the named catalog model (its base): "
            "`weights` is the adapter's directory (adapter_config.json and weights) or hub "
            "repo, loaded at run time into the base's replicas, so it has no profiles, "
            "replica counts or scaling of its own. The base must exist and have a profile "
            "with `adapters`. Unset by default: a model of its own."
        ),
    )
    profiles: list[ProfileConfig] = Field(
        default_factory=list,
        validate_default=True,
        description=(
            "Ways to serve the model, in order of preference: placement tries the first "
            "and falls back to the next when no node fits. At least one (none for an "
            "adapter, which runs in its base's replicas)."
        ),
    )
    min_replicas: StrictCount = Field(
        default=0,
        ge=0,
        description=(
            "Replicas kept running even when idle. 0 by default: GPUs are scarce, and "
            "an idle model is started again by the next request (activation)."
        ),
    )
    max_replicas: StrictCount = Field(
        default=1,
        ge=1,
        description=(
            "Most replicas placed under load (see target_in_flight, target_queue_depth, "
            "target_queue_wait, target_kv_use). 1 by default, so "
            "that one busy model does not take the whole fleet unless asked to."
        ),
    )
    keep_alive: float = Field(
        default=300.0,
        description=(
            "Idle time before the model is scaled down to min_replicas: seconds or a "
            "duration ('5m', '1h'); -1 pins it once started, 0 unloads it as soon as it "
            "is idle. 5 minutes by default, as Ollama does: a conversation's next turn "
            "finds the model loaded, an abandoned one frees its GPUs soon."
        ),
    )
    sleep_after: float | None = Field(
        default=None,
        description=(
            "Idle time before the model's replicas are put to sleep: seconds or a duration "
            "('2m'), shorter than keep_alive. A sleeping replica releases its GPU memory "
            "and keeps its process (weights in host memory), and the next request wakes "
            "it in a fraction of a start; keep_alive later stops it as usual. Only for "
            "engines that can sleep (vllm on GPUs, sglang, sim). Off by default: a "
            "sleeping engine still holds host memory."
        ),
    )
    prefetch: StrictCount = Field(
        default=0,
        ge=0,
        description=(
            "Nodes that keep the model's hub weights on disk ahead of demand: the control "
            "plane pulls them onto this many nodes that could run the model (those "
            "placement would pick first) and pulls again where they went missing, so an "
            "activation there skips the download. 0 by default: weights cost disk, and "
            "most models are fetched on first use. Hub weights only."
        ),
    )
    activation: bool = Field(
        default=True,
        description=(
            "Whether a request for the model may start a replica when none runs. On by "
            "default; turn it off for models that must only run when an operator says."
        ),
    )
    target_in_flight: StrictCount | None = Field(
        default=None,
        ge=1,
        description=(
            "Requests in flight per replica that the model is scaled for: with 20 in "
            "flight and a target of 8, three replicas are wanted (up to max_replicas). "
            "Unset by default: the model runs min_replicas, or one while in use."
        ),
    )
    target_queue_depth: StrictCount | None = Field(
        default=None,
        ge=1,
        description=(
            "Waiting requests per replica that the model is scaled for: those the "
            "engines report waiting (vLLM's num_requests_waiting) plus those in the "
            "routers' queues, over the Ready replicas. With 12 waiting and a target of "
            "4, three replicas are wanted (up to max_replicas). Unset by default: "
            "waiting requests only count through target_in_flight."
        ),
    )
    target_queue_wait: StrictSeconds | None = Field(
        default=None,
        gt=0.0,
        allow_inf_nan=False,
        description=(
            "Longest wait in seconds, in any router's queue, that the model is scaled "
            "for: while a request has waited longer, one replica more than are Ready is "
            "wanted (one at a time, up to max_replicas); between half the target and "
            "the target the Ready ones are kept; below half it asks for nothing. Unset "
            "by default: only a model with max_in_flight (its own or the router's) "
            "queues requests at all. Keep it under the queue's wait budget "
            "(router.queue.max_wait), which no request outwaits."
        ),
    )
    target_kv_use: StrictFraction | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description=(
            "Mean KV-cache use (0 to 1) over the Ready replicas that the model is "
            "scaled for: two replicas at 0.9 with a target of 0.6 want three. Unset by "
            "default: engines that report no KV use (llama.cpp) could not drive it."
        ),
    )
    max_in_flight: StrictCount | None = Field(
        default=None,
        ge=1,
        description=(
            "Requests in flight per replica before it counts as saturated and further "
            "requests wait in the router's queue; it holds for the model's adapters too "
            "(they run on its replicas). Unset by default: router.max_in_flight "
            "applies (and with that unset too, nothing is held back)."
        ),
    )
    routing: ModelRouting | None = Field(
        default=None,
        description=(
            "The model's own routing (`scorers` weights), replacing the server's "
            "`router.routing.scorers` for it. Unset by default: the server's apply."
        ),
    )
    rollout: ModelRollout = Field(
        default_factory=ModelRollout,
        description=(
            "How a change to what the replicas run (engine, arguments, weights, GPUs) "
            "replaces them: max_surge new ones first, then old ones drain. By default one "
            "at a time, never with fewer Ready replicas than wanted."
        ),
    )
    versions: list[ModelVersion] | None = Field(
        default=None,
        description=(
            "A canary: two versions with weights. The first is the model's own spec, the "
            "second names what its canary replicas run (`weights`, `profiles`); new "
            "conversations split between them by weight, sessions stay on theirs. Unset "
            "by default: one version. End it with `llmgw models rollout promote` or `abort`."
        ),
    )
    scale_down_delay: float = Field(
        default=60.0,
        description=(
            "How long the load must stay lower before replicas started for it are "
            "stopped: seconds or a duration ('90s', '5m'). 60 s by default, so that "
            "bursty traffic does not start and stop replicas back to back."
        ),
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r} is not a model name: {_NAME_RULE}")
        return value

    @field_validator("aliases")
    @classmethod
    def _check_aliases(cls, value: list[str], info: ValidationInfo) -> list[str]:
        name = info.data.get("name")
        where = scope(model=name)
        seen: set[str] = set()
        for alias in value:
            if not _NAME.match(alias):
                _raise(where, f"alias {alias!r} is not a model name: {_NAME_RULE}")
            if alias == name:
                _raise(where, f"alias {alias!r} is the model's own name; remove it")
            if alias in seen:
                _raise(where, f"alias {alias!r} is listed twice; give each alias once")
            seen.add(alias)
        return value

    @field_validator("weights")
    @classmethod
    def _check_weights(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is empty; give a local path, a GGUF file or a hub id")
        if value != value.strip():
            raise ValueError(f"{value!r} has surrounding spaces; remove them")
        return value

    @field_validator("weights_commit")
    @classmethod
    def _check_commit(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if COMMIT.match(value) is None:
            raise ValueError(f"{value!r} is not a commit SHA (40 lowercase hex digits)")
        if hub_ref(str(info.data.get("weights", ""))) is None:
            raise ValueError("is only for hub weights (org/name or org/name@revision)")
        return value

    @model_validator(mode="after")
    def _adapter_fields(self) -> ModelConfig:
        # An adapter lives in its base's replicas: what starts, scales or rolls replicas
        # is the base's, so setting it on the adapter would silently do nothing.
        if self.adapter_of is None:
            return self
        # Compared with the defaults, not `model_fields_set`: a loaded config file is
        # validated again with every field given (overrides are merged into a dump).
        own = sorted(
            name
            for name, info in type(self).model_fields.items()
            if name not in _ADAPTER_FIELDS
            and getattr(self, name) != info.get_default(call_default_factory=True)
        )
        if own:
            _raise(
                scope(model=self.name),
                f"field {own[0]!r} is not for an adapter (adapter_of is set): replicas, "
                f"scaling and routing are its base model {self.adapter_of!r}'s; an adapter "
                "takes only " + ", ".join(sorted(_ADAPTER_FIELDS)),
            )
        return self

    @field_validator("adapter_of")
    @classmethod
    def _check_adapter_of(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if not _NAME.match(value):
            raise ValueError(f"{value!r} is not a model name: {_NAME_RULE}")
        if value == info.data.get("name"):
            _raise(
                scope(model=value),
                "adapter_of names the adapter itself; name the base model it was trained on",
            )
        return value

    @field_validator("profiles")
    @classmethod
    def _unique_profiles(
        cls, value: list[ProfileConfig], info: ValidationInfo
    ) -> list[ProfileConfig]:
        where = scope(model=info.data.get("name"))
        if info.data.get("adapter_of") is not None:
            if value:
                _raise(
                    where,
                    "an adapter (adapter_of is set) runs in its base model's replicas and has "
                    "no profiles of its own; remove profiles (the base's profile says how "
                    "many adapters a replica loads, under adapters)",
                )
            return value
        if not value:
            raise ValueError(
                "needs at least one profile (how to serve the model: engine, GPUs), or "
                "adapter_of for a LoRA adapter of another model"
            )
        first: dict[str, int] = {}
        for index, profile in enumerate(value):
            if profile.name in first:
                _raise(
                    scope(model=info.data.get("name")),
                    f"profiles {first[profile.name]} and {index} are both named "
                    f"{profile.name!r}; give each profile its own name (a profile without "
                    "a name is named after its engine)",
                )
            first[profile.name] = index
        return value

    @field_validator("versions")
    @classmethod
    def _check_versions(
        cls, value: list[ModelVersion] | None, info: ValidationInfo
    ) -> list[ModelVersion] | None:
        if value is None:
            return None
        where = scope(model=info.data.get("name"))
        if len(value) != 2:
            _raise(
                where,
                f"versions has {len(value)} entries; a canary has exactly two (the model's "
                "own spec first, the canary second); remove `versions` for one version",
            )
        first, second = value
        if first.weights is not None or first.profiles is not None:
            _raise(
                where,
                f"versions[0] ({first.name!r}) sets weights or profiles; the first version "
                "is the model's own spec: set those on the model, and the canary's on "
                "versions[1]",
            )
        if second.weights is None and second.profiles is None:
            _raise(
                where,
                f"versions[1] ({second.name!r}) sets neither weights nor profiles, so it "
                "would run what versions[0] runs; give the canary's weights or profiles",
            )
        if first.name == second.name:
            _raise(where, f"both versions are named {first.name!r}; give each its own name")
        return value

    @field_validator("max_replicas")
    @classmethod
    def _check_max_replicas(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("min_replicas")
        if isinstance(low, int) and value < low:
            _raise(
                scope(model=info.data.get("name")),
                f"max_replicas ({value}) is below min_replicas ({low}); raise max_replicas "
                "or lower min_replicas",
            )
        return value

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _parse_keep_alive(cls, value: object) -> float:
        return parse_duration(value)

    @field_validator("sleep_after", mode="before")
    @classmethod
    def _parse_sleep_after(cls, value: object) -> float | None:
        if value is None:
            return None
        try:
            seconds = parse_duration(value)
        except ValueError:
            seconds = -1.0
        if seconds <= 0:
            raise ValueError(
                f"{value!r} is not an idle time; give more than 0 seconds (120) or a "
                "duration ('2m'), or leave sleep_after out"
            )
        return seconds

    @field_validator("sleep_after")
    @classmethod
    def _check_sleep_after(cls, value: float | None, info: ValidationInfo) -> float | None:
        keep_alive = info.data.get("keep_alive")
        if value is not None and isinstance(keep_alive, float) and 0 <= keep_alive <= value:
            raise ValueError(
                f"sleep_after ({value:g}s) must be shorter than keep_alive "
                f"({keep_alive:g}s): a replica sleeps first and is stopped later; lower "
                "sleep_after or raise keep_alive"
            )
        return value

    @field_validator("prefetch")
    @classmethod
    def _check_prefetch(cls, value: int, info: ValidationInfo) -> int:
        weights = info.data.get("weights")
        if value > 0 and isinstance(weights, str) and hub_ref(weights) is None:
            raise ValueError(
                f"prefetch ({value}) needs hub weights (org/name or org/name@revision), and "
                f"{weights!r} is a local path; set prefetch to 0 or name a hub repo"
            )
        return value

    @field_validator("scale_down_delay", mode="before")
    @classmethod
    def _parse_scale_down_delay(cls, value: object) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError:
            seconds = -1.0
        if seconds < 0:
            raise ValueError(
                f"{value!r} is not a delay; give zero or more seconds (60) or a duration "
                "('90s', '5m')"
            )
        return seconds
