"""Engine adapters: turn an engine-neutral shard spec into a command line, and read load.

One module per engine (`vllm`, `sglang`, `llamacpp`, `sim`), each with an
adapter that validates an `EngineSpec` (raising `ProfileError` that names the
field), builds a `LaunchPlan` (argv, environment, readiness and metrics paths)
and parses the engine's Prometheus metrics into an `EngineLoad`.

This package is pure: it starts no processes, opens no sockets and reads no
files. The node agent runs the plans. It sits low in the layers and imports
nothing else from llmgw.

Not guaranteed: that a plan which validates also starts (weights, memory and the
installed engine are checked only by running it).
"""

from llmgw.engines.adapter import EngineAdapter
from llmgw.engines.errors import EngineError, ProfileError, UnknownEngine
from llmgw.engines.llamacpp import LlamaCppAdapter
from llmgw.engines.prometheus import Sample, metric_max, metric_sum, parse_samples
from llmgw.engines.registry import (
    adapter_for,
    continues_of,
    continues_thoughts,
    continues_tool_calls,
    native_apis_of,
    routes_of,
)
from llmgw.engines.sglang import SglangAdapter
from llmgw.engines.sim import SimAdapter
from llmgw.engines.spec import (
    HOST_IP_ENV,
    KNOWN_ENGINES,
    EngineLoad,
    EngineSettings,
    EngineSpec,
    EngineTimings,
    LaunchPlan,
    LoraApi,
    SleepApi,
)
from llmgw.engines.vllm import VllmAdapter

__all__ = [
    "HOST_IP_ENV",
    "KNOWN_ENGINES",
    "EngineAdapter",
    "EngineError",
    "EngineLoad",
    "EngineSettings",
    "EngineSpec",
    "EngineTimings",
    "LaunchPlan",
    "LlamaCppAdapter",
    "LoraApi",
    "ProfileError",
    "Sample",
    "SglangAdapter",
    "SimAdapter",
    "SleepApi",
    "UnknownEngine",
    "VllmAdapter",
    "adapter_for",
    "continues_of",
    "continues_thoughts",
    "continues_tool_calls",
    "metric_max",
    "metric_sum",
    "native_apis_of",
    "parse_samples",
    "routes_of",
]
