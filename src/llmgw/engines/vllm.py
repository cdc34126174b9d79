"""vLLM: `vllm serve` with the spec's weights, name, address and parallelism.

Readiness is `/health` (vLLM's API server listens only once the engine has
loaded). `HF_HOME` and `HF_HUB_CACHE` point into the agent's weights directory
(`EngineSettings.weights_dir`), so hub downloads land where the node's disk
figures and `nodes remove-weights` see them. Load comes from `/metrics`:
`vllm:num_requests_running`, `vllm:num_requests_waiting` and the KV-cache usage,
`vllm:kv_cache_usage_perc` (newer releases) or `vllm:gpu_cache_usage_perc` (older
ones).

A multi-node replica runs without Ray, as vLLM documents for its multiprocessing
backend (vLLM 0.11.1 and later, "Parallelism and Scaling"): every rank runs
`vllm serve` with the whole replica's parallel sizes plus `--nnodes N
--node-rank R --master-addr A --master-port P`; ranks above 0 add `--headless`
and serve no API, so their readiness is their process staying up (rank 0's
`/health` says when the replica serves). The spec's GPUs are this node's; their
count times the node count must equal tensor x pipeline parallel size.

A stop drains: vLLM gets `--shutdown-timeout` from the profile's `drain_grace`, so
on SIGTERM it finishes the requests in flight (up to that long) instead of
aborting them, which is vLLM's default. That flag needs vLLM 0.18 or later.

Not guaranteed: that the installed vLLM
accepts every engine argument, or that a `--config` file sets nothing llmgw
manages (vLLM lets command-line flags win over it, so llmgw's own still apply).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from llmgw.engines import checks
from llmgw.engines.apis import BOTH
from llmgw.engines.prometheus import metric_max, metric_sum, parse_samples
from llmgw.engines.routes import CONTINUES_CHAT_AND_COMPLETIONS, VLLM_ROUTES
from llmgw.engines.spec import (
    EngineLoad,
    EngineSettings,
    EngineSpec,
    EngineTimings,
    LaunchPlan,
    LoraApi,
    SleepApi,
)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
KV_CACHE_USAGE_OLD = "vllm:gpu_cache_usage_perc"

MANAGED_ARGS: Mapping[str, str] = {
    "--host": checks.USE_HOST,
    "--port": checks.USE_PORT,
    "--served-model-name": checks.USE_MODEL,
    "--model": checks.USE_WEIGHTS,
    "--tensor-parallel-size": checks.USE_TP,
    "-tp": checks.USE_TP,
    "--pipeline-parallel-size": checks.USE_PP,
    "-pp": checks.USE_PP,
    "--gpu-memory-utilization": checks.USE_MEMORY,
    "--shutdown-timeout": checks.USE_DRAIN_GRACE,
    "--nnodes": checks.USE_NODES,
    "-n": checks.USE_NODES,
    "--node-rank": checks.USE_NODES,
    "--master-addr": checks.USE_NODES,
    "--master-port": checks.USE_NODES,
    "--headless": checks.USE_NODES,
    "--data-parallel-size": checks.NO_DATA_PARALLEL,
    "-dp": checks.NO_DATA_PARALLEL,
    "--api-key": checks.NO_API_KEY,
    "--ssl-keyfile": checks.NO_TLS,
    "--ssl-certfile": checks.NO_TLS,
}
"""Options llmgw sets or must not see set, with what to do instead."""

RESERVED_ENV: Mapping[str, str] = {
    **checks.GPU_ENV,
    "VLLM_API_KEY": checks.NO_API_KEY,
}

UNSET_ENV: tuple[str, ...] = ("VLLM_API_KEY",)
"""vLLM reads an API key from this variable when --api-key is absent."""


# vLLM's runtime adapter API (VLLM_ALLOW_RUNTIME_LORA_UPDATING, which lora_launch sets).
VLLM_LORA = LoraApi(
    load_path="/v1/load_lora_adapter",
    unload_path="/v1/unload_lora_adapter",
    list_path="/v1/models",
)

VLLM_SLEEP = SleepApi(
    sleep_path="/sleep?level={level}", wake_path="/wake_up", state_path="/is_sleeping"
)
"""vLLM's sleep endpoints (`--enable-sleep-mode`, `VLLM_SERVER_DEV_MODE=1`)."""

TIMINGS = EngineTimings(load_timeout=1800.0, unhealthy_after=60.0, drain_grace=30.0)
"""vLLM may download tens of GB of weights before it listens (30 min); requests in
flight get 30 s after SIGTERM; a /health that fails for a minute is a hung engine."""


class VllmAdapter:
    """Builds `vllm serve` command lines and reads vLLM's metrics."""

    name = "vllm"
    # vLLM's CPU backend serves a shard without GPUs (x86 and Arm servers, one rank).
    needs_gpus = False
    gpu_ranks = True
    routes = VLLM_ROUTES
    continues = CONTINUES_CHAT_AND_COMPLETIONS
    # The --reasoning-parser names whose thought it writes as <think>...</think>, which a
    # continuation can write back (see `EngineAdapter.thought_parsers`).
    thought_parsers: frozenset[str] = frozenset({"deepseek_r1", "qwen3"})
    # The --tool-call-parser names whose calls it writes as <tool_call>{json}</tool_call>.
    tool_parsers: frozenset[str] = frozenset({"hermes"})
    sleeps = True
    lora: LoraApi | None = VLLM_LORA

    def __init__(self, *, settings: EngineSettings) -> None:
        self._settings = settings

    @staticmethod
    def native_apis(engine_args: Sequence[str]) -> frozenset[str]:
        """vLLM serves Messages and Responses itself (`llmgw.engines.apis`)."""
        del engine_args
        return BOTH

    @staticmethod
    def lora_launch(max_loaded: int, max_rank: int) -> tuple[tuple[str, ...], dict[str, str]]:
        """vLLM's LoRA flags, and the variable that turns on its runtime adapter API
        (`/v1/load_lora_adapter`, off by default because it changes what is served)."""
        args = ("--enable-lora", "--max-loras", str(max_loaded), "--max-lora-rank", str(max_rank))
        return args, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}

    def validate(self, spec: EngineSpec) -> None:
        """Raise `ProfileError` for a spec vLLM would refuse or llmgw could not serve."""
        checks.check_engine(spec, self.name)
        checks.check_common(spec)
        checks.check_ranks(spec, multi_node=True)
        checks.check_timings(spec)
        checks.check_weights(spec)
        checks.check_gpus(spec, "vLLM", cpu=True)
        checks.check_memory_fraction(spec)
        checks.check_engine_args(spec, MANAGED_ARGS)
        checks.check_env(spec, RESERVED_ENV)
        checks.check_sleep(spec, "vLLM", sleeps=True, cpu=False)

    def plan(self, spec: EngineSpec) -> LaunchPlan:
        """Validate `spec`, then build its `vllm serve` command."""
        self.validate(spec)
        argv = [
            self._settings.vllm_command,
            "serve",
            spec.weights,
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--served-model-name",
            spec.model,
            "--tensor-parallel-size",
            str(spec.tensor_parallel_size),
            "--pipeline-parallel-size",
            str(spec.pipeline_parallel_size),
        ]
        if spec.gpu_memory_utilization is not None:
            argv += [
                "--gpu-memory-utilization",
                checks.format_fraction(spec.gpu_memory_utilization),
            ]
        if spec.nodes > 1:
            argv += [
                "--nnodes",
                str(spec.nodes),
                "--node-rank",
                str(spec.node_rank),
                "--master-addr",
                spec.master_addr,
                "--master-port",
                str(spec.master_port),
            ]
            if spec.node_rank > 0:
                argv.append("--headless")
        timings = TIMINGS.resolve(spec)
        # vLLM aborts every request in flight on SIGTERM unless --shutdown-timeout
        # says how long to drain (vLLM 0.18 and later; 0, its default, is abort). Whole
        # seconds, rounded down, so that vLLM is done before the agent's own grace ends.
        argv += ["--shutdown-timeout", str(math.floor(timings.drain_grace))]
        env = {**checks.weights_env(spec, self._settings.weights_dir), **checks.plan_env(spec)}
        if spec.sleep_mode:
            # vLLM serves /sleep, /wake_up and /is_sleeping only in its dev mode.
            argv.append("--enable-sleep-mode")
            env["VLLM_SERVER_DEV_MODE"] = "1"
        argv += spec.engine_args
        return LaunchPlan(
            argv=tuple(argv),
            env=env,
            unset_env=UNSET_ENV,
            ready_path="/health" if spec.node_rank == 0 else "",
            timings=timings,
            metrics_path="/metrics",
            sleep=VLLM_SLEEP if spec.sleep_mode else None,
        )

    def parse_metrics(self, text: str) -> EngineLoad:
        """Load from vLLM's metrics page; never raises."""
        return parse_vllm_metrics(text)


def parse_vllm_metrics(text: str) -> EngineLoad:
    """Requests summed over served names and engines; KV-cache usage of the fullest engine.

    Also reads `llmgw sim`, which exports the same names.
    """
    samples = parse_samples(text, {RUNNING, WAITING, KV_CACHE_USAGE, KV_CACHE_USAGE_OLD})
    usage = metric_max(samples, KV_CACHE_USAGE)
    if usage is None:
        usage = metric_max(samples, KV_CACHE_USAGE_OLD)
    return EngineLoad.from_readings(
        running=metric_sum(samples, RUNNING),
        waiting=metric_sum(samples, WAITING),
        kv_cache_usage=usage,
    )
