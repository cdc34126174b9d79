"""Validation shared by the adapters: each check raises `ProfileError` naming the field.

The adapters compose these in their `validate`; the messages say what is wrong
and what to change, in the profile's terms.

Engine arguments are checked against a table of the options llmgw sets itself
(a repeated option would silently override llmgw's value, since argparse keeps
the last). The check understands `--flag value`, `--flag=value`, underscores for
dashes (vLLM accepts both), and — for argparse-based engines — abbreviations
(`--tp` for `--tp-size`), which argparse expands.

Not guaranteed: that arguments not in a table are valid for the engine, that
config files named by engine arguments set nothing llmgw manages, or that an
option's value is not itself mistaken for an option by the engine.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from llmgw.engines.errors import ProfileError
from llmgw.engines.spec import EngineSpec

MIN_PORT = 1
MAX_PORT = 65535

GPU_ENV: Mapping[str, str] = {
    "CUDA_VISIBLE_DEVICES": "llmgw sets it from gpu_indices so that the engine sees only "
    "the GPUs it was given; remove it",
    "CUDA_DEVICE_ORDER": "llmgw sets it to PCI_BUS_ID so that GPU indices mean what the "
    "node reports (NVML's order, not CUDA's fastest-first); remove it",
}
"""Environment variables every plan sets itself, with the remedy for a profile setting them."""

USE_HOST = "set the spec's `host` field instead"
USE_PORT = "set the spec's `port` field instead"
USE_MODEL = "the spec's `model` field is the name the engine serves; change that instead"
USE_WEIGHTS = "set the spec's `weights` field instead"
USE_TP = "set the spec's `tensor_parallel_size` field instead"
USE_PP = "set the spec's `pipeline_parallel_size` field instead"
USE_MEMORY = "set the spec's `gpu_memory_utilization` field instead"
USE_DRAIN_GRACE = "set the spec's `drain_grace` field instead"
USE_NODES = (
    "llmgw sets the ranks of a multi-node replica itself: set the profile's nodes and "
    "fabric instead"
)
NO_DATA_PARALLEL = (
    "remove it: llmgw runs data parallelism as separate replicas on their own GPUs; "
    "raise the model's replica count instead"
)
NO_API_KEY = (
    "remove it: llmgw's router and health checks call engines without a key "
    "(keep engine ports private to the node network instead)"
)
NO_TLS = "remove it: llmgw's router and health checks talk plain HTTP to engines"

_NEGATIVE_NUMBER = re.compile(r"-(?:\d|\.\d)")


def check_engine(spec: EngineSpec, name: str) -> None:
    """The spec is for the adapter checking it."""
    if spec.engine != name:
        raise ProfileError(
            "engine",
            f"this is the {name!r} adapter but the spec asks for {spec.engine!r}; "
            "get the adapter with adapter_for(spec.engine)",
        )


def check_common(spec: EngineSpec) -> None:
    """What every engine needs: a model name, an address, GPUs and sizes that make sense."""
    _check_word(spec.model, "model", "the name clients send")
    _check_word(spec.host, "host", "the address the engine listens on, e.g. 127.0.0.1")
    if any(char.isspace() for char in spec.host):
        raise ProfileError("host", f"{spec.host!r} contains whitespace; give one address")
    if not MIN_PORT <= spec.port <= MAX_PORT:
        raise ProfileError("port", f"must be in {MIN_PORT}..{MAX_PORT}, got {spec.port}")
    negative = [index for index in spec.gpu_indices if index < 0]
    if negative:
        raise ProfileError("gpu_indices", f"GPU indices are >= 0, got {negative[0]}")
    if len(set(spec.gpu_indices)) != len(spec.gpu_indices):
        raise ProfileError(
            "gpu_indices", f"{list(spec.gpu_indices)} names a GPU twice; give each GPU once"
        )
    for field, size in (
        ("tensor_parallel_size", spec.tensor_parallel_size),
        ("pipeline_parallel_size", spec.pipeline_parallel_size),
    ):
        if size < 1:
            raise ProfileError(field, f"must be at least 1, got {size}")
    for index, arg in enumerate(spec.engine_args):
        if "\0" in arg:
            raise ProfileError(
                "engine_args",
                f"argument {index} contains a NUL byte, which no process can receive",
            )


def check_weights(spec: EngineSpec) -> None:
    """Weights are named, and cannot be mistaken for an option."""
    _check_word(spec.weights, "weights", "a local path, GGUF file or hub id")


def check_ranks(spec: EngineSpec, *, multi_node: bool) -> None:
    """A multi-node shard knows its rank and where ranks meet; `multi_node`: the
    engine can span nodes at all."""
    if spec.nodes < 1:
        raise ProfileError("nodes", f"must be at least 1, got {spec.nodes}")
    if spec.nodes == 1:
        return
    if not multi_node:
        raise ProfileError(
            "nodes",
            f"{spec.engine} cannot span nodes (nodes is {spec.nodes}); give it nodes 1, or "
            "use vllm or sglang for a model that does not fit on one node",
        )
    if not 0 <= spec.node_rank < spec.nodes:
        raise ProfileError(
            "node_rank",
            f"must be in 0..{spec.nodes - 1} for {spec.nodes} nodes, got {spec.node_rank}",
        )
    if not spec.master_addr.strip() or any(c.isspace() for c in spec.master_addr):
        raise ProfileError(
            "master_addr",
            f"{spec.master_addr!r} is not an address; give rank 0's address on the "
            "management network",
        )
    if not MIN_PORT <= spec.master_port <= MAX_PORT:
        raise ProfileError(
            "master_port", f"must be in {MIN_PORT}..{MAX_PORT}, got {spec.master_port}"
        )


def check_gpus(spec: EngineSpec, engine: str, *, cpu: bool = False) -> None:
    """The shard has GPUs: tensor_parallel_size x pipeline_parallel_size of them over
    all of the replica's nodes, the same number on each. `cpu`: the engine also
    runs without GPUs, on the node's CPUs, as one rank of a single-node replica."""
    tp, pp = spec.tensor_parallel_size, spec.pipeline_parallel_size
    wanted = tp * pp
    given = len(spec.gpu_indices) * max(1, spec.nodes)
    if cpu and not spec.gpu_indices:
        if spec.nodes > 1 or wanted != 1:
            raise ProfileError(
                "gpu_indices",
                f"{engine} without GPUs runs on the node's CPUs as one rank on one node, but "
                f"this shard asks for tensor_parallel_size {tp} x pipeline_parallel_size {pp} "
                f"on {spec.nodes} node(s); give it GPUs, or leave the parallel sizes at 1 and "
                "nodes at 1",
            )
        return
    if spec.nodes > 1 and given != wanted:
        raise ProfileError(
            "gpu_indices",
            f"{_gpus(len(spec.gpu_indices))} on each of {spec.nodes} nodes is {given} but "
            f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} = {wanted}; give each "
            "node as many GPUs as the parallel sizes need",
        )
    if given == 0:
        raise ProfileError(
            "gpu_indices",
            f"{engine} needs GPUs and none were given; give the shard "
            f"{_gpus(wanted)} (tensor_parallel_size {tp} x "
            f"pipeline_parallel_size {pp}), or use the llamacpp engine for CPU serving",
        )
    if given != wanted:
        raise ProfileError(
            "gpu_indices",
            f"{_gpus(given)} given but tensor_parallel_size {tp} x "
            f"pipeline_parallel_size {pp} = {wanted}; give exactly {_gpus(wanted)} or change "
            "the parallel sizes to match",
        )


def check_memory_fraction(spec: EngineSpec) -> None:
    """gpu_memory_utilization, when set, is a fraction in (0, 1]."""
    value = spec.gpu_memory_utilization
    if value is None:
        return
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ProfileError(
            "gpu_memory_utilization",
            f"must be a fraction in (0, 1], got {value!r}; e.g. 0.9 lets the engine use "
            "90% of each GPU's memory",
        )


def check_engine_args(
    spec: EngineSpec, managed: Mapping[str, str], *, abbreviations: bool = True
) -> None:
    """No engine argument sets an option in `managed` (canonical flag → remedy).

    Canonical flags are written with dashes (`--served-model-name`,
    `--model-alias`); an argument matches with dashes or underscores.
    With `abbreviations`, a prefix of a managed option is refused too: argparse
    expands a unique prefix to the option (and refuses an ambiguous one anyway).
    """
    for arg in spec.engine_args:
        name = _option_name(arg)
        if name is None:
            continue
        flag = _managed_flag(name, managed, abbreviations=abbreviations)
        if flag is None:
            continue
        shown = arg.split("=", 1)[0]
        what = (
            f"{shown!r} sets {flag}, which llmgw manages"
            if name == flag
            else f"{shown!r} abbreviates {flag}, which llmgw manages"
        )
        raise ProfileError("engine_args", f"{what}: {managed[flag]}")


def check_env(spec: EngineSpec, reserved: Mapping[str, str]) -> None:
    """Profile env is passable to a process and sets nothing in `reserved` (name → remedy).

    Names are compared case-insensitively: some engines (llama-cpp-python's
    pydantic settings) read their environment that way.
    """
    reserved_upper = {name.upper(): remedy for name, remedy in reserved.items()}
    for key, value in spec.env.items():
        if not key or "=" in key or "\0" in key:
            raise ProfileError(
                "env", f"{key!r} is not a valid variable name (empty, '=' or a NUL byte)"
            )
        if "\0" in value:
            raise ProfileError(
                "env", f"the value of {key} contains a NUL byte, which no process can receive"
            )
        remedy = reserved_upper.get(key.upper())
        if remedy is not None:
            raise ProfileError("env", f"{key}: {remedy}")


def plan_env(spec: EngineSpec) -> dict[str, str]:
    """The profile's env plus the GPU variables, which always win."""
    env = dict(spec.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(index) for index in spec.gpu_indices)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def check_timings(spec: EngineSpec) -> None:
    """Deadlines the spec gives are positive, finite numbers of seconds."""
    for field, value in (
        ("load_timeout", spec.load_timeout),
        ("unhealthy_after", spec.unhealthy_after),
        ("drain_grace", spec.drain_grace),
    ):
        if value is None:
            continue
        if not math.isfinite(value) or value < 0 or (value == 0 and field != "drain_grace"):
            raise ProfileError(
                field,
                f"must be a positive number of seconds, got {value!r}; leave it unset for "
                "the engine's default",
            )


HF_ENV = ("HF_HOME", "HF_HUB_CACHE")
"""Where Hugging Face libraries (vLLM, SGLang) download weights."""


def weights_env(spec: EngineSpec, weights_dir: str | None) -> dict[str, str]:
    """`HF_HOME` and `HF_HUB_CACHE` in the agent's weights directory, so that what an
    engine downloads counts in the node's disk figures and `nodes remove-weights`
    reaches it; a profile that sets either keeps its own value."""
    if weights_dir is None:
        return {}
    home = weights_dir.rstrip("/") or "/"
    env = {"HF_HOME": home, "HF_HUB_CACHE": f"{home.rstrip('/')}/hub"}
    return {key: value for key, value in env.items() if key not in spec.env}


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def format_fraction(value: float) -> str:
    """A float as the shortest text that reads back the same (0.9 → "0.9")."""
    return repr(float(value))


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def _check_word(value: str, field: str, what: str) -> None:
    if not value.strip():
        raise ProfileError(field, f"is empty; give {what}")
    if value.startswith("-"):
        raise ProfileError(
            field, f"{value!r} starts with '-', so the engine would read it as an option"
        )
    if "\0" in value:
        raise ProfileError(field, f"{value!r} contains a NUL byte, which no process can receive")


def _option_name(arg: str) -> str | None:
    """The canonical option an argument names, or None for a value."""
    if not arg.startswith("-") or arg in {"-", "--"} or _NEGATIVE_NUMBER.match(arg):
        return None
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        return "--" + name[2:].replace("_", "-")
    return name


def _managed_flag(name: str, managed: Mapping[str, str], *, abbreviations: bool) -> str | None:
    if name in managed:
        return name
    if not abbreviations:
        return None
    for flag in managed:
        if flag.startswith(name):
            return flag
    return None


def check_sleep(spec: EngineSpec, name: str, *, sleeps: bool, cpu: bool = True) -> None:
    """A spec in sleep mode is for an engine that can sleep, on GPUs where it must."""
    if not spec.sleep_mode:
        return
    if not sleeps:
        raise ProfileError(
            "sleep_after",
            f"{name} cannot sleep (release its GPU memory and keep its process); remove "
            "sleep_after, or serve the model with vllm, sglang or sim",
        )
    if not cpu and not spec.gpu_indices:
        raise ProfileError(
            "sleep_after",
            f"{name} sleeps only on GPUs (its sleep mode is refused on CPU); remove "
            "sleep_after or give the profile GPUs",
        )
