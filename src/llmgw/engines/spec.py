"""The engine-neutral value types: what a shard runs and how its process is started.

`EngineSpec` is what the agent receives (one shard of a replica); an adapter turns
it into a `LaunchPlan` (argv and environment) and reads the engine's metrics into
an `EngineLoad`. `EngineSettings` says how engines are launched on this node.

All of them are immutable values with no behaviour beyond construction; the
checks live in the adapters (`EngineAdapter.validate`). Not guaranteed: that the
paths and commands they name exist. `LaunchPlan.env` is a plain dict for the
caller's convenience; mutating it changes nothing here.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

KNOWN_ENGINES: tuple[str, ...] = ("vllm", "sglang", "llamacpp", "sim")
"""The engine names `adapter_for` accepts, in the order error messages list them."""

HOST_IP_ENV: Mapping[str, str] = MappingProxyType(
    {"vllm": "VLLM_HOST_IP", "sglang": "SGLANG_HOST_IP"}
)
"""Per engine that can span nodes, the variable naming the address its ranks use
(vLLM's `VLLM_HOST_IP`; SGLang's `get_ip()` reads `SGLANG_HOST_IP`)."""


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What one shard runs, engine-neutral.

    `model` is the name clients send; the engine serves the model under exactly
    that name. `weights` is a local path, a GGUF file or a hub id. `engine_args`
    are appended to the command line as given, after validation. `env` is extra
    environment from the profile, set on top of the agent's.

    A multi-node replica runs one shard per node: `nodes` of them, this one
    rank `node_rank`; `gpu_indices` are this node's GPUs only, and the parallel
    sizes are the whole replica's. Ranks meet at `master_addr:master_port`
    (rank 0's address on the management network, and a port of its range).
    """

    shard_id: str
    model: str
    engine: str
    weights: str
    port: int
    host: str = "127.0.0.1"
    gpu_indices: tuple[int, ...] = ()
    engine_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    nodes: int = 1
    node_rank: int = 0
    master_addr: str = ""
    master_port: int = 0
    # Seconds; None means the engine kind's default (`EngineTimings`).
    load_timeout: float | None = None
    unhealthy_after: float | None = None
    drain_grace: float | None = None
    # Start the engine so that it can sleep (the model has a `sleep_after`).
    sleep_mode: bool = False


@dataclass(frozen=True, slots=True)
class LoraApi:
    """How an engine started with LoRA slots loads and unloads adapters at run time:
    HTTP POSTs to its own port with `{"lora_name", "lora_path"}` (load) and
    `{"lora_name"}` (unload), as vLLM's and SGLang's runtime adapter APIs take them.
    `list_path` (GET) lists what the engine serves, adapters as entries with `parent`
    set (vLLM's `/v1/models`): how an agent learns what an engine it adopted holds;
    "" where the engine is not read that way."""

    load_path: str
    unload_path: str
    list_path: str = ""


@dataclass(frozen=True, slots=True)
class SleepApi:
    """How an engine started in sleep mode is put to sleep and woken: HTTP POSTs to
    its own port. `sleep_path` holds `{level}` (1: weights to host RAM, 2: weights
    discarded) where the engine takes a level; `body` is sent with both requests."""

    sleep_path: str
    wake_path: str
    body: bytes = b""
    # GET: `{"is_sleeping": bool}` (vLLM's); "" where the engine has no such path.
    state_path: str = ""

    def sleep_target(self, level: int) -> str:
        return self.sleep_path.format(level=level)


@dataclass(frozen=True, slots=True)
class EngineTimings:
    """How long an engine of one kind may take, in seconds.

    `load_timeout`: from spawn until the readiness path first answers 200; past
    it the shard fails. `unhealthy_after`: how long a ready engine's probe may
    keep failing before it is restarted. `drain_grace`: after SIGTERM to the
    engine's main process, how long in-flight requests get before the whole
    process group is signalled.
    """

    load_timeout: float
    unhealthy_after: float
    drain_grace: float

    def resolve(self, spec: EngineSpec) -> EngineTimings:
        """The spec's own values where it gives them, these defaults elsewhere."""
        return EngineTimings(
            load_timeout=self.load_timeout if spec.load_timeout is None else spec.load_timeout,
            unhealthy_after=(
                self.unhealthy_after if spec.unhealthy_after is None else spec.unhealthy_after
            ),
            drain_grace=self.drain_grace if spec.drain_grace is None else spec.drain_grace,
        )


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """How to start one engine process.

    `env` is set on top of the agent's environment and always holds
    `CUDA_VISIBLE_DEVICES` ("" without GPUs, "2,3" for GPUs 2 and 3) so that an
    engine never sees a GPU it was not given. `unset_env` names variables to
    remove from the agent's environment first (ones the engine would read in
    place of its flags). `ready_path` answers 200 once the engine can serve
    ("" for a follower rank of a multi-node replica, which serves no HTTP: it is
    ready while its process runs);
    `metrics_path` serves Prometheus text, or is None when the engine has none.
    `timings` are the spec's deadlines with the engine kind's defaults filled in
    (the default value suits a quick engine; every adapter sets its own).
    `sleep` says how to put the engine to sleep and wake it, when it was started in
    sleep mode (None otherwise).
    """

    argv: tuple[str, ...]
    env: dict[str, str]
    unset_env: tuple[str, ...]
    ready_path: str
    metrics_path: str | None
    timings: EngineTimings = field(
        default_factory=lambda: EngineTimings(
            load_timeout=120.0, unhealthy_after=60.0, drain_grace=10.0
        )
    )
    sleep: SleepApi | None = None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """An engine's load as its metrics report it; None where it reports nothing.

    `running` and `waiting` count requests (summed over the engine's schedulers);
    `kv_cache_usage` is the fraction of KV-cache in use, 0..1.
    """

    running: int | None
    waiting: int | None
    kv_cache_usage: float | None

    @classmethod
    def from_readings(
        cls, *, running: float | None, waiting: float | None, kv_cache_usage: float | None
    ) -> EngineLoad:
        """A load from raw gauge values: counts rounded to whole requests (never below
        0), usage clamped to 0..1; None stays None."""
        return cls(
            running=None if running is None else max(0, round(running)),
            waiting=None if waiting is None else max(0, round(waiting)),
            kv_cache_usage=None if kv_cache_usage is None else min(1.0, max(0.0, kv_cache_usage)),
        )


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """How engines are launched on this node.

    `python` is the interpreter of a virtual environment that has SGLang and/or
    llama-cpp-python installed (their servers run as `PYTHON -m ...`);
    `sglang_python` and `llamacpp_python` override it for one engine kind.
    `vllm_command` is the `vllm` executable. `llmgw_command` starts this package's
    CLI for the simulated engine; the default is the running interpreter.
    `weights_dir` is where engines keep weights: vLLM and SGLang get `HF_HOME` and
    `HF_HUB_CACHE` under it (None: the engine's own default, `~/.cache/huggingface`).
    """

    python: str
    vllm_command: str = "vllm"
    llmgw_command: tuple[str, ...] = (sys.executable, "-m", "llmgw")
    sglang_python: str | None = None
    llamacpp_python: str | None = None
    weights_dir: str | None = None
