"""`adapter_for`: the adapter of an engine name, built with this node's settings.

A new adapter is built on every call (they are cheap, stateless values); there
is no registry object to mutate. Not guaranteed: that the engine is installed
on this node — adapters only build command lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from llmgw.engines.adapter import EngineAdapter
from llmgw.engines.errors import UnknownEngine
from llmgw.engines.llamacpp import LlamaCppAdapter
from llmgw.engines.sglang import SglangAdapter
from llmgw.engines.sim import SimAdapter
from llmgw.engines.spec import KNOWN_ENGINES, EngineSettings
from llmgw.engines.vllm import VllmAdapter

_AdapterClass = type[VllmAdapter | SglangAdapter | LlamaCppAdapter | SimAdapter]

# Each engine name and its adapter class: the one place a new engine is added.
_ADAPTERS: Final[Mapping[str, _AdapterClass]] = {
    "vllm": VllmAdapter,
    "sglang": SglangAdapter,
    "llamacpp": LlamaCppAdapter,
    "sim": SimAdapter,
}


def _adapter_class(engine: str) -> _AdapterClass:
    found = _ADAPTERS.get(engine)
    if found is None:
        raise UnknownEngine(engine, KNOWN_ENGINES)
    return found


def adapter_for(engine: str, *, settings: EngineSettings) -> EngineAdapter:
    """The adapter for `engine`; `UnknownEngine` (field "engine") for any other name."""
    return _adapter_class(engine)(settings=settings)


def routes_of(engine: str) -> Mapping[str, str]:
    """The client routes `engine` serves and its path for each (`EngineAdapter.routes`),
    without building an adapter; `UnknownEngine` (field "engine") for any other name."""
    return _adapter_class(engine).routes


def native_apis_of(engine: str, engine_args: Sequence[str]) -> frozenset[str]:
    """The client APIs `engine` run with `engine_args` serves natively
    (`EngineAdapter.native_apis`); `UnknownEngine` (field "engine") for any other name."""
    return _adapter_class(engine).native_apis(engine_args)


def continues_thoughts(engine: str, engine_args: Sequence[str]) -> bool:
    """Whether `engine` run with `engine_args` writes its thought as `<think>...</think>`
    (its `--reasoning-parser` is one of `EngineAdapter.thought_parsers`), so that a
    continuation can write a half-finished thought back; False for an unknown engine."""
    found = _ADAPTERS.get(engine)
    return found is not None and _option(engine_args, "--reasoning-parser") in (
        found.thought_parsers
    )


def continues_tool_calls(engine: str, engine_args: Sequence[str]) -> bool:
    """Whether `engine` run with `engine_args` writes tool calls as hermes'
    `<tool_call>{json}</tool_call>` (its `--tool-call-parser` is one of
    `EngineAdapter.tool_parsers`), so that a continuation can write a half-written
    call back; False for an unknown engine."""
    found = _ADAPTERS.get(engine)
    return found is not None and _option(engine_args, "--tool-call-parser") in found.tool_parsers


def _option(engine_args: Sequence[str], flag: str) -> str:
    """The value of `flag` (`--flag V` or `--flag=V`, the last one given) or ""."""
    value = ""
    for index, arg in enumerate(engine_args):
        if arg == flag and index + 1 < len(engine_args):
            value = engine_args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def continues_of(engine: str) -> frozenset[str]:
    """The client routes on which `engine` continues a generation another replica began
    (`EngineAdapter.continues`); none for "" (an endpoint whose engine is not declared:
    llmgw does not guess) and for names it does not know."""
    found = _ADAPTERS.get(engine)
    return frozenset() if found is None else found.continues
