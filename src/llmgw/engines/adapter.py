"""The `EngineAdapter` protocol: what the agent needs from one kind of engine.

An adapter is a small stateless object (settings only) that validates a spec,
builds the command that runs it and reads the engine's metrics. It never starts
processes, touches the network or reads files: the agent's supervisor does that
with the `LaunchPlan` it gets.

Not guaranteed: thread or process affinity of any kind; adapters are plain
values and may be shared freely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from llmgw.engines.spec import EngineLoad, EngineSpec, LaunchPlan, LoraApi


class EngineAdapter(Protocol):
    """One kind of engine (vLLM, SGLang, llama.cpp, the simulator).

    `name` is the engine name specs use; `needs_gpus` says whether a shard
    without GPUs is refused; `gpu_ranks` says whether the engine runs one
    parallel rank on each GPU it is given (so a profile's parallel sizes must
    match its GPUs); `routes` maps each client route the engine serves
    (`llmgw.engines.routes`) to the engine's own path for it; `continues` names
    the routes on which it can continue a generation another replica began (the
    router's mid-stream continuation sends those requests only to such engines);
    `thought_parsers` names the reasoning parsers (`--reasoning-parser`) that write
    the model's thought as `<think>...</think>`, so that a stream broken mid-thought
    can be continued with the thought written back in that markup;
    `tool_parsers` the same for tool parsers (`--tool-call-parser`) that write a
    call as hermes' `<tool_call>{"name": ..., "arguments": ...}</tool_call>`.
    `sleeps` says whether the engine can release its GPU memory and keep its process
    (vLLM's sleep mode, SGLang's memory saver, the sim's copy of vLLM's): a spec with
    `sleep_mode` is started so, and its `LaunchPlan.sleep` says how.
    `lora` says how the engine loads LoRA adapters at run time (None: it cannot).
    """

    name: str
    needs_gpus: bool
    gpu_ranks: bool
    routes: Mapping[str, str]
    continues: frozenset[str]
    thought_parsers: frozenset[str]
    tool_parsers: frozenset[str]
    sleeps: bool
    lora: LoraApi | None

    def native_apis(self, engine_args: Sequence[str]) -> frozenset[str]:
        """The client APIs besides OpenAI's (`llmgw.engines.apis`: "messages",
        "responses") that this engine, run with `engine_args`, serves itself; the
        router translates requests of the others into chat completions."""
        ...

    def lora_launch(self, max_loaded: int, max_rank: int) -> tuple[tuple[str, ...], dict[str, str]]:
        """The engine arguments and environment that start the engine ready to load LoRA
        adapters at run time, `max_loaded` at once of rank up to `max_rank`; `ProfileError`
        (field "adapters") when this engine cannot."""
        ...

    def validate(self, spec: EngineSpec) -> None:
        """Raise `ProfileError` naming the field when the engine would refuse `spec`."""
        ...

    def plan(self, spec: EngineSpec) -> LaunchPlan:
        """Validate `spec`, then build the argv and environment that run it, with the
        spec's deadlines resolved against this engine kind's defaults."""
        ...

    def parse_metrics(self, text: str) -> EngineLoad:
        """Read the load from the engine's Prometheus text; never raises."""
        ...
