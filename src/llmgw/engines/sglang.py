"""SGLang: `python -m sglang.launch_server` with the spec's weights, name and parallelism.

`--enable-metrics` is always passed: SGLang serves no `/metrics` without it.
`HF_HOME` and `HF_HUB_CACHE` point into the agent's weights directory, as for
vLLM.
Readiness is `/health`; load comes from `sglang:num_running_reqs`,
`sglang:num_queue_reqs` and `sglang:token_usage` (the KV-cache pool in use).

SGLang labels its scheduler gauges with the scheduler's ranks. Ranks of one
model-parallel group (`tp_rank`, `pp_rank`, `moe_ep_rank`) report the same batch
(with `--enable-metrics-for-all-schedulers` each of them does), so they count
once; data-parallel ranks (`dp_rank`) and served names are summed. With priority
scheduling each gauge comes per `priority` bucket plus an aggregate with an
empty `priority` label: the aggregate is used.

A multi-node replica follows SGLang's "Multi-Node Deployment" guide (SGLang
0.5, `python -m sglang.launch_server`): every rank gets the whole replica's
`--tp-size`/`--pp-size` plus `--nnodes N --node-rank R --dist-init-addr A:P`
(rank 0's address and a port of its range). Only rank 0 serves HTTP; the other
ranks' readiness is their process staying up. The spec's GPUs are this node's;
their count times the node count must equal tp x pp.

Not guaranteed: that the installed SGLang
accepts every engine argument, or that `--config` files set nothing llmgw
manages (SGLang lets command-line flags win, so llmgw's own still apply).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.engines import checks
from llmgw.engines.apis import RESPONSES
from llmgw.engines.prometheus import Sample, metric_max, metric_sum, parse_samples
from llmgw.engines.routes import CONTINUES_CHAT_AND_COMPLETIONS, SGLANG_ROUTES
from llmgw.engines.spec import (
    EngineLoad,
    EngineSettings,
    EngineSpec,
    EngineTimings,
    LaunchPlan,
    LoraApi,
    SleepApi,
)

RUNNING = "sglang:num_running_reqs"
WAITING = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"

REPLICA_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank"})
"""Labels telling apart ranks that report one and the same batch."""

MANAGED_ARGS: Mapping[str, str] = {
    "--host": checks.USE_HOST,
    "--port": checks.USE_PORT,
    "--served-model-name": checks.USE_MODEL,
    "--model-path": checks.USE_WEIGHTS,
    "--model": checks.USE_WEIGHTS,
    "--tp-size": checks.USE_TP,
    "--tensor-parallel-size": checks.USE_TP,
    "--pp-size": checks.USE_PP,
    "--pipeline-parallel-size": checks.USE_PP,
    "--mem-fraction-static": checks.USE_MEMORY,
    "--nnodes": checks.USE_NODES,
    "--node-rank": checks.USE_NODES,
    "--dist-init-addr": checks.USE_NODES,
    "--dp-size": checks.NO_DATA_PARALLEL,
    "--data-parallel-size": checks.NO_DATA_PARALLEL,
    "--api-key": checks.NO_API_KEY,
    "--ssl-keyfile": checks.NO_TLS,
    "--ssl-certfile": checks.NO_TLS,
}
"""Options llmgw sets or must not see set, with what to do instead."""


# SGLang's runtime adapter API (its "LoRA Serving" docs), outside /v1.
SGLANG_LORA = LoraApi(load_path="/load_lora_adapter", unload_path="/unload_lora_adapter")

SGLANG_SLEEP = SleepApi(
    sleep_path="/release_memory_occupation", wake_path="/resume_memory_occupation", body=b"{}"
)
"""SGLang's memory saver (`--enable-memory-saver`): it takes no level."""

TIMINGS = EngineTimings(load_timeout=1800.0, unhealthy_after=60.0, drain_grace=30.0)
"""SGLang may download weights and capture CUDA graphs before it listens (30 min);
in-flight requests get 30 s after SIGTERM; a minute of failed /health is a hang."""


class SglangAdapter:
    """Builds SGLang server command lines and reads SGLang's metrics."""

    name = "sglang"
    needs_gpus = True
    gpu_ranks = True
    routes = SGLANG_ROUTES
    continues = CONTINUES_CHAT_AND_COMPLETIONS
    # The --reasoning-parser names whose thought it writes as <think>...</think>, which a
    # continuation can write back (see `EngineAdapter.thought_parsers`).
    thought_parsers: frozenset[str] = frozenset({"deepseek-r1", "qwen3"})
    # The --tool-call-parser names whose calls it writes as <tool_call>{json}</tool_call>.
    tool_parsers: frozenset[str] = frozenset({"qwen25"})
    sleeps = True
    lora: LoraApi | None = SGLANG_LORA

    def __init__(self, *, settings: EngineSettings) -> None:
        self._settings = settings

    @staticmethod
    def native_apis(engine_args: Sequence[str]) -> frozenset[str]:
        """SGLang serves Responses itself, not Messages."""
        del engine_args
        return frozenset({RESPONSES})

    @staticmethod
    def lora_launch(max_loaded: int, max_rank: int) -> tuple[tuple[str, ...], dict[str, str]]:
        """SGLang's LoRA flags (its "LoRA Serving" docs): with no adapter at start it must
        be told the rank and target modules to size its adapter memory for."""
        args = (
            "--enable-lora",
            "--max-loras-per-batch",
            str(max_loaded),
            "--max-loaded-loras",
            str(max_loaded),
            "--max-lora-rank",
            str(max_rank),
            "--lora-target-modules",
            "all",
        )
        return args, {}

    def validate(self, spec: EngineSpec) -> None:
        """Raise `ProfileError` for a spec SGLang would refuse or llmgw could not serve."""
        checks.check_engine(spec, self.name)
        checks.check_common(spec)
        checks.check_ranks(spec, multi_node=True)
        checks.check_timings(spec)
        checks.check_weights(spec)
        checks.check_gpus(spec, "SGLang")
        checks.check_memory_fraction(spec)
        checks.check_engine_args(spec, MANAGED_ARGS)
        checks.check_env(spec, checks.GPU_ENV)
        checks.check_sleep(spec, "SGLang", sleeps=True)

    def plan(self, spec: EngineSpec) -> LaunchPlan:
        """Validate `spec`, then build its `python -m sglang.launch_server` command."""
        self.validate(spec)
        argv = [
            self._settings.sglang_python or self._settings.python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            spec.weights,
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--served-model-name",
            spec.model,
            "--tp-size",
            str(spec.tensor_parallel_size),
        ]
        if spec.pipeline_parallel_size > 1:
            argv += ["--pp-size", str(spec.pipeline_parallel_size)]
        if spec.gpu_memory_utilization is not None:
            argv += ["--mem-fraction-static", checks.format_fraction(spec.gpu_memory_utilization)]
        argv.append("--enable-metrics")
        if spec.nodes > 1:
            argv += [
                "--nnodes",
                str(spec.nodes),
                "--node-rank",
                str(spec.node_rank),
                "--dist-init-addr",
                checks.host_port(spec.master_addr, spec.master_port),
            ]
        if spec.sleep_mode:
            argv.append("--enable-memory-saver")
        argv += spec.engine_args
        return LaunchPlan(
            argv=tuple(argv),
            env={**checks.weights_env(spec, self._settings.weights_dir), **checks.plan_env(spec)},
            unset_env=(),
            ready_path="/health" if spec.node_rank == 0 else "",
            timings=TIMINGS.resolve(spec),
            metrics_path="/metrics",
            sleep=SGLANG_SLEEP if spec.sleep_mode else None,
        )

    def parse_metrics(self, text: str) -> EngineLoad:
        """Load from SGLang's metrics page; never raises."""
        samples = _aggregates_only(parse_samples(text, {RUNNING, WAITING, TOKEN_USAGE}))
        return EngineLoad.from_readings(
            running=metric_sum(samples, RUNNING, replica_labels=REPLICA_LABELS),
            waiting=metric_sum(samples, WAITING, replica_labels=REPLICA_LABELS),
            kv_cache_usage=metric_max(samples, TOKEN_USAGE),
        )


def _aggregates_only(samples: list[Sample]) -> list[Sample]:
    """Drop per-priority buckets of any metric that also has the empty-priority total."""
    with_total = {s.name for s in samples if s.labels.get("priority") == ""}
    return [s for s in samples if s.name not in with_total or s.labels.get("priority", "") == ""]
