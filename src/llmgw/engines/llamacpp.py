"""llama.cpp through llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`).

The server always gets `--interrupt_requests False`: by default every new
request — a health probe included — cuts off the stream in progress. With GPUs
all layers are offloaded (`--n_gpu_layers -1`; a later `--n_gpu_layers N` in
engine_args offloads fewer); without GPUs it runs on the CPU.

The server reads settings from its environment too, and some of them win over
its flags: `HOST` and `PORT` replace `--host`/`--port`, `CONFIG_FILE` replaces
the whole command line, and `API_KEY`, `SSL_KEYFILE`, `SSL_CERTFILE` (read when
their flags are absent) would lock llmgw out. The plan unsets them.

Readiness is `/v1/models` (the server has no `/health`). It has no Prometheus
metrics: `metrics_path` is None and the load is always unknown.

Not guaranteed: that the GGUF file exists or fits in memory, and that
environment variables spelled in another case (pydantic settings match names
case-insensitively) are unset — only the upper-case names are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.engines import checks
from llmgw.engines.apis import NONE
from llmgw.engines.errors import ProfileError
from llmgw.engines.routes import CONTINUES_COMPLETIONS, LLAMACPP_ROUTES
from llmgw.engines.spec import (
    EngineLoad,
    EngineSettings,
    EngineSpec,
    EngineTimings,
    LaunchPlan,
    LoraApi,
)

NO_CONFIG_FILE = (
    "remove it: a config file replaces every command-line setting, the ones llmgw "
    "manages included; pass its settings as engine_args instead"
)

MANAGED_ARGS: Mapping[str, str] = {
    "--host": checks.USE_HOST,
    "--port": checks.USE_PORT,
    "--model": checks.USE_WEIGHTS,
    "--model-alias": checks.USE_MODEL,
    "--interrupt-requests": (
        "remove it: llmgw sets --interrupt_requests False, since otherwise every new "
        "request (health probes included) cuts off the stream in progress"
    ),
    "--config-file": NO_CONFIG_FILE,
    "--api-key": checks.NO_API_KEY,
    "--ssl-keyfile": checks.NO_TLS,
    "--ssl-certfile": checks.NO_TLS,
}
"""Options llmgw sets or must not see set (canonical dashed spelling; the server's
own flags use underscores, and both are recognised)."""

UNSET_ENV: tuple[str, ...] = (
    "PORT",
    "HOST",
    "CONFIG_FILE",
    "API_KEY",
    "SSL_KEYFILE",
    "SSL_CERTFILE",
)
"""Variables the server would read in place of, or on top of, llmgw's flags."""

RESERVED_ENV: Mapping[str, str] = {
    **checks.GPU_ENV,
    "PORT": "the server lets it override --port; " + checks.USE_PORT,
    "HOST": "the server lets it override --host; " + checks.USE_HOST,
    "CONFIG_FILE": NO_CONFIG_FILE,
    "API_KEY": checks.NO_API_KEY,
    "SSL_KEYFILE": checks.NO_TLS,
    "SSL_CERTFILE": checks.NO_TLS,
}


TIMINGS = EngineTimings(load_timeout=120.0, unhealthy_after=120.0, drain_grace=10.0)
"""A local GGUF file loads in seconds (2 min is generous); the server answers
/v1/models between tokens but can be slow under a long generation, so it gets
2 min of failed probes before it counts as hung."""


class LlamaCppAdapter:
    """Builds llama-cpp-python server command lines; it has no metrics to read."""

    name = "llamacpp"
    needs_gpus = False
    gpu_ranks = False
    routes = LLAMACPP_ROUTES
    sleeps = False
    # llama.cpp takes adapters only at start (--lora), never at run time.
    lora: LoraApi | None = None
    continues = CONTINUES_COMPLETIONS
    # The --reasoning-parser names whose thought it writes as <think>...</think>, which a
    # continuation can write back (see `EngineAdapter.thought_parsers`).
    thought_parsers: frozenset[str] = frozenset[str]()
    # The --tool-call-parser names whose calls it writes as <tool_call>{json}</tool_call>.
    tool_parsers: frozenset[str] = frozenset[str]()

    def __init__(self, *, settings: EngineSettings) -> None:
        self._settings = settings

    @staticmethod
    def native_apis(engine_args: Sequence[str]) -> frozenset[str]:
        """llama-cpp-python's server serves neither: both are translated."""
        del engine_args
        return NONE

    @staticmethod
    def lora_launch(max_loaded: int, max_rank: int) -> tuple[tuple[str, ...], dict[str, str]]:
        """Refused: llama.cpp's server applies LoRA files given at start (`--lora`), and
        has no API to load one into a running server."""
        del max_loaded, max_rank
        raise ProfileError(
            "adapters",
            "llamacpp cannot load LoRA adapters at run time (its server takes them only at "
            "start); serve the base model with vllm, sglang or sim to use adapters, or "
            "remove adapters from this profile",
        )

    def validate(self, spec: EngineSpec) -> None:
        """Raise `ProfileError` for a spec the llama.cpp server would refuse."""
        checks.check_engine(spec, self.name)
        checks.check_common(spec)
        checks.check_ranks(spec, multi_node=False)
        checks.check_timings(spec)
        checks.check_weights(spec)
        if not spec.weights.lower().endswith(".gguf"):
            raise ProfileError(
                "weights",
                f"llama.cpp loads one GGUF file and {spec.weights!r} does not end with "
                ".gguf; give the path of the .gguf file (for a split model, its first part)",
            )
        for field, size in (
            ("tensor_parallel_size", spec.tensor_parallel_size),
            ("pipeline_parallel_size", spec.pipeline_parallel_size),
        ):
            if size != 1:
                raise ProfileError(
                    field,
                    f"must be 1 for llama.cpp, got {size}; it has no such parallelism and "
                    "spreads layers over all the GPUs it is given",
                )
        if spec.gpu_memory_utilization is not None:
            raise ProfileError(
                "gpu_memory_utilization",
                "llama.cpp has no GPU memory fraction; leave it unset (to use less GPU "
                "memory, offload fewer layers with --n_gpu_layers N in engine_args)",
            )
        checks.check_engine_args(spec, MANAGED_ARGS)
        checks.check_env(spec, RESERVED_ENV)
        checks.check_sleep(spec, "llama.cpp", sleeps=False)

    def plan(self, spec: EngineSpec) -> LaunchPlan:
        """Validate `spec`, then build its `python -m llama_cpp.server` command."""
        self.validate(spec)
        argv = [
            self._settings.llamacpp_python or self._settings.python,
            "-m",
            "llama_cpp.server",
            "--model",
            spec.weights,
            "--model_alias",
            spec.model,
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--interrupt_requests",
            "False",
        ]
        if spec.gpu_indices:
            argv += ["--n_gpu_layers", "-1"]
        argv += spec.engine_args
        return LaunchPlan(
            argv=tuple(argv),
            env=checks.plan_env(spec),
            unset_env=UNSET_ENV,
            ready_path="/v1/models",
            timings=TIMINGS.resolve(spec),
            metrics_path=None,
        )

    def parse_metrics(self, text: str) -> EngineLoad:
        """Always unknown: the server exports no metrics."""
        del text
        return EngineLoad(running=None, waiting=None, kv_cache_usage=None)
