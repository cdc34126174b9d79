"""The simulated engine: `llmgw sim` serving the spec's model name on the spec's address.

It needs no GPUs and no weights. An absolute `weights` directory (a hub snapshot
the agent downloaded) is passed as `--weights`, which must hold a config.json,
as a real engine would need; anything else in `weights` is ignored. When
given GPUs it is pinned to them like a real engine, so placement tests see the
same environment; parallel sizes are accepted as given, not checked against the
GPU count. It exports vLLM's metric names, read by the vLLM parser. A rank of a
multi-node replica gets vLLM's flags (`--nnodes --node-rank --master-addr
--master-port`) and plays the rank with a real TCP rendezvous; ranks above 0
serve no HTTP and are ready while they run.

Not guaranteed: that the engine arguments are options `llmgw sim` knows (click
refuses unknown ones when the process starts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.engines import checks
from llmgw.engines.apis import flag_value, parse_apis
from llmgw.engines.errors import ProfileError
from llmgw.engines.routes import CONTINUES_CHAT_AND_COMPLETIONS, SIM_ROUTES
from llmgw.engines.spec import (
    EngineLoad,
    EngineSettings,
    EngineSpec,
    EngineTimings,
    LaunchPlan,
    LoraApi,
)
from llmgw.engines.vllm import VLLM_LORA, VLLM_SLEEP, parse_vllm_metrics

MANAGED_ARGS: Mapping[str, str] = {
    "--host": checks.USE_HOST,
    "--port": checks.USE_PORT,
    "--model": checks.USE_MODEL,
    "--nnodes": checks.USE_NODES,
    "--node-rank": checks.USE_NODES,
    "--master-addr": checks.USE_NODES,
    "--master-port": checks.USE_NODES,
}
"""Options llmgw sets (click does not expand abbreviations, so only exact names)."""


TIMINGS = EngineTimings(load_timeout=60.0, unhealthy_after=30.0, drain_grace=5.0)
"""The simulator is ready in about a second plus its --load-time."""


class SimAdapter:
    """Builds `llmgw sim` command lines and reads its vLLM-style metrics."""

    name = "sim"
    needs_gpus = False
    gpu_ranks = False
    routes = SIM_ROUTES
    continues = CONTINUES_CHAT_AND_COMPLETIONS
    # The --reasoning-parser names whose thought it writes as <think>...</think>, which a
    # continuation can write back (see `EngineAdapter.thought_parsers`).
    thought_parsers: frozenset[str] = frozenset({"deepseek_r1", "qwen3"})
    # The --tool-call-parser names whose calls it writes as <tool_call>{json}</tool_call>.
    tool_parsers: frozenset[str] = frozenset({"hermes"})
    sleeps = True
    # The sim plays vLLM's runtime adapter API (`llmgw.sim.lora`).
    lora: LoraApi | None = VLLM_LORA

    def __init__(self, *, settings: EngineSettings) -> None:
        self._settings = settings

    @staticmethod
    def native_apis(engine_args: Sequence[str]) -> frozenset[str]:
        """Those its `--native-apis` engine argument names (none without it)."""
        value = flag_value(engine_args, "--native-apis")
        try:
            return parse_apis(value or "")
        except ValueError:
            # `validate` refuses such a spec; a sim started with it would not run.
            return frozenset()

    @staticmethod
    def lora_launch(max_loaded: int, max_rank: int) -> tuple[tuple[str, ...], dict[str, str]]:
        """The sim's LoRA flags, named as vLLM's (`llmgw.sim.lora`)."""
        args = ("--enable-lora", "--max-loras", str(max_loaded), "--max-lora-rank", str(max_rank))
        return args, {}

    def validate(self, spec: EngineSpec) -> None:
        """Raise `ProfileError` for a spec `llmgw sim` would refuse."""
        checks.check_engine(spec, self.name)
        checks.check_common(spec)
        checks.check_ranks(spec, multi_node=True)
        checks.check_timings(spec)
        checks.check_memory_fraction(spec)
        checks.check_engine_args(spec, MANAGED_ARGS, abbreviations=False)
        checks.check_env(spec, checks.GPU_ENV)
        checks.check_sleep(spec, "llmgw sim", sleeps=True)
        value = flag_value(spec.engine_args, "--native-apis")
        if value is not None:
            try:
                parse_apis(value)
            except ValueError as exc:
                raise ProfileError("engine_args", f"--native-apis: {exc}") from None

    def plan(self, spec: EngineSpec) -> LaunchPlan:
        """Validate `spec`, then build its `llmgw sim` command."""
        self.validate(spec)
        argv = (
            *self._settings.llmgw_command,
            "sim",
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--model",
            spec.model,
            *_rank_args(spec),
            *_weights_args(spec),
            *spec.engine_args,
        )
        return LaunchPlan(
            argv=argv,
            env=checks.plan_env(spec),
            unset_env=(),
            ready_path="/health" if spec.node_rank == 0 else "",
            timings=TIMINGS.resolve(spec),
            metrics_path="/metrics",
            # The sim always serves vLLM's sleep endpoints.
            sleep=VLLM_SLEEP if spec.sleep_mode else None,
        )

    def parse_metrics(self, text: str) -> EngineLoad:
        """Load from the sim's vLLM-named metrics; never raises."""
        return parse_vllm_metrics(text)


def _weights_args(spec: EngineSpec) -> tuple[str, ...]:
    """`--weights DIR` for a model directory on this node (a hub snapshot the agent
    downloaded); anything else (`none`, a name) is not read by the sim."""
    if spec.weights.startswith("/") and not spec.weights.endswith(".gguf"):
        return ("--weights", spec.weights)
    return ()


def _rank_args(spec: EngineSpec) -> tuple[str, ...]:
    """vLLM's multi-node flags, which `llmgw sim` plays (`llmgw.sim.gang`)."""
    if spec.nodes <= 1:
        return ()
    return (
        "--nnodes",
        str(spec.nodes),
        "--node-rank",
        str(spec.node_rank),
        "--master-addr",
        spec.master_addr,
        "--master-port",
        str(spec.master_port),
    )
