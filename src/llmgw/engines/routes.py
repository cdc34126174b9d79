"""Which client routes each kind of engine serves, and under which path of its own.

A route is a path on llmgw's API listener (`/v1/rerank`); an engine serves it
under a path of its own, most often the same one (llama-cpp-python's server
tokenizes at `/extras/tokenize`). The router sends a request for a route only
to endpoints whose engine serves it, and answers 404 naming the model and the
route when none does.

Not guaranteed: that an engine serves a route for every model. vLLM registers
`/v1/rerank` and `/v1/score` only for pooling (cross-encoder) models and
`/v1/audio/*` only for speech models; for other models the engine itself
answers 404, and that answer is passed on.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RERANK = "/v1/rerank"
SCORE = "/v1/score"
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"

OPENAI_ROUTES: tuple[str, ...] = (CHAT, COMPLETIONS, EMBEDDINGS)
"""Served by every engine llmgw runs."""

ENGINE_ROUTES: tuple[str, ...] = (
    RERANK,
    SCORE,
    TOKENIZE,
    DETOKENIZE,
    TRANSCRIPTIONS,
    TRANSLATIONS,
)
"""Routes passed through as bytes to the engines that serve them."""

ALL_ROUTES: tuple[str, ...] = (*OPENAI_ROUTES, *ENGINE_ROUTES)
"""Every route an endpoint may declare, in the order messages list them."""

MULTIPART_ROUTES = frozenset({TRANSCRIPTIONS, TRANSLATIONS})
"""Routes whose body is multipart/form-data (an audio file and its fields)."""

DISPLAY_NAMES: Mapping[str, str] = MappingProxyType(
    {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp", "sim": "llmgw sim"}
)
"""How messages name each engine."""


def same_paths(*routes: str) -> Mapping[str, str]:
    """`routes`, each served under its own path, plus the OpenAI routes."""
    return MappingProxyType({route: route for route in (*OPENAI_ROUTES, *routes)})


VLLM_ROUTES = same_paths(RERANK, SCORE, TOKENIZE, DETOKENIZE, TRANSCRIPTIONS, TRANSLATIONS)
"""vLLM's OpenAI server (`vllm/entrypoints/openai/api_server.py`): rerank and score for
pooling models, the tokenizer API for every model, audio for speech models."""

SGLANG_ROUTES = same_paths(RERANK, SCORE, TOKENIZE, DETOKENIZE)
"""SGLang's HTTP server (`sglang/srt/entrypoints/http_server.py`): `/v1/rerank` for
cross-encoder models, `/v1/score` (decoder-only scoring, its own body shape),
`/tokenize` and `/detokenize`; no audio."""

LLAMACPP_ROUTES: Mapping[str, str] = MappingProxyType(
    {
        **same_paths(),
        TOKENIZE: "/extras/tokenize",
        DETOKENIZE: "/extras/detokenize",
    }
)
"""llama-cpp-python's server (`llama_cpp/server/app.py`) tokenizes at `/extras/tokenize`
(body `{"input": text}`, answer `{"tokens": [...]}`) and detokenizes at
`/extras/detokenize` (`{"tokens": [...]}` → `{"text": ...}`); the bodies are its own,
passed through unchanged. No rerank, score or audio."""

RENAMED_FIELDS: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {"/extras/tokenize": MappingProxyType({"prompt": "input"})}
)
"""By engine path, the request fields an engine names otherwise: llama-cpp-python's
server calls vLLM's `prompt` `input`, and answers a body without it with a 500
(which would count against the endpoint's health), so `prompt` is renamed on the way.
Only the request is changed; the answer is the engine's own."""

SIM_ROUTES = same_paths(*ENGINE_ROUTES)
"""`llmgw sim` serves every route, in vLLM's shapes, so all of them are tested without GPUs."""


def display_name(engine: str) -> str:
    """`engine` as messages name it ("llama.cpp"); "an unnamed engine" when unknown."""
    if not engine:
        return "an unnamed engine"
    return DISPLAY_NAMES.get(engine, engine)


CONTINUES_CHAT_AND_COMPLETIONS: frozenset[str] = frozenset({CHAT, COMPLETIONS})
"""Engines that continue a final assistant message (vLLM's and SGLang's
`continue_final_message: true` with `add_generation_prompt: false`) and a completion
from its prompt plus the text so far."""

CONTINUES_COMPLETIONS: frozenset[str] = frozenset({COMPLETIONS})
"""llama-cpp-python's server: its chat handler always opens a new assistant turn (no
`continue_final_message`), so only completions (prompt + text so far) continue."""
