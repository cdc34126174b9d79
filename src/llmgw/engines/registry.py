"""`adapter_for`: the adapter of an engine name, built with this node's settings.

A new adapter is built on every call (they are cheap, stateless values); there
is no registry object to mutate. Not guaranteed: that the engine is installed
on this node — adapters only build command lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.engines.adapter import EngineAdapter
from llmgw.engines.errors import UnknownEngine
from llmgw.engines.llamacpp import LlamaCppAdapter
from llmgw.engines.sglang import SglangAdapter
from llmgw.engines.sim import SimAdapter
from llmgw.engines.spec import KNOWN_ENGINES, EngineSettings
from llmgw.engines.vllm import VllmAdapter


def adapter_for(engine: str, *, settings: EngineSettings) -> EngineAdapter:
    """The adapter for `engine`; `UnknownEngine` (field "engine") for any other name."""
    if engine == "vllm":
        return VllmAdapter(settings=settings)
    if engine == "sglang":
        return SglangAdapter(settings=settings)
    if engine == "llamacpp":
        return LlamaCppAdapter(settings=settings)
    if engine == "sim":
        return SimAdapter(settings=settings)
    raise UnknownEngine(engine, KNOWN_ENGINES)


def routes_of(engine: str) -> Mapping[str, str]:
    """The client routes `engine` serves and its path for each (`EngineAdapter.routes`),
    without building an adapter; `UnknownEngine` (field "engine") for any other name."""
    if engine == "vllm":
        return VllmAdapter.routes
    if engine == "sglang":
        return SglangAdapter.routes
    if engine == "llamacpp":
        return LlamaCppAdapter.routes
    if engine == "sim":
        return SimAdapter.routes
    raise UnknownEngine(engine, KNOWN_ENGINES)


def native_apis_of(engine: str, engine_args: Sequence[str]) -> frozenset[str]:
    """The client APIs `engine` run with `engine_args` serves natively
    (`EngineAdapter.native_apis`); `UnknownEngine` (field "engine") for any other name."""
    if engine == "vllm":
        return VllmAdapter.native_apis(engine_args)
    if engine == "sglang":
        return SglangAdapter.native_apis(engine_args)
    if engine == "llamacpp":
        return LlamaCppAdapter.native_apis(engine_args)
    if engine == "sim":
        return SimAdapter.native_apis(engine_args)
    raise UnknownEngine(engine, KNOWN_ENGINES)


def continues_of(engine: str) -> frozenset[str]:
    """The client routes on which `engine` continues a generation another replica began
    (`EngineAdapter.continues`); none for "" (an endpoint whose engine is not declared:
    llmgw does not guess) and for names it does not know."""
    if engine == "vllm":
        return VllmAdapter.continues
    if engine == "sglang":
        return SglangAdapter.continues
    if engine == "llamacpp":
        return LlamaCppAdapter.continues
    if engine == "sim":
        return SimAdapter.continues
    return frozenset()
