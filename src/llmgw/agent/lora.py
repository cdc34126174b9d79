"""The LoRA adapters one shard's engine has loaded, and the engine calls that change them.

The control plane decides which adapter goes where and which one makes room
(`LoadAdapter` / `UnloadAdapter`); this module only calls the engine's runtime
adapter API (`llmgw.engines.LoraApi`: vLLM's `/v1/load_lora_adapter`, SGLang's
`/load_lora_adapter`) and keeps the names it loaded, which the shard reports so
that every router routes an adapter's requests to where it is loaded.

A refusal carries the engine's own words ("Loading lora sql failed: No adapter
found for <path>"), because only the engine knows what is wrong with the files.

An engine adopted from an earlier agent is asked what it holds (`read_loaded`: the
entries of its `LoraApi.list_path` with `parent` set), so its adapters are reported
again without a load.

Not guaranteed: that the files exist on the node (the supervisor downloads a hub
repo first; a missing local path is refused by the engine); the order in which an
adopted engine loaded its adapters (they are taken as loaded before any later one,
in the order the engine lists them).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from llmgw.agent.errors import AdapterError
from llmgw.engines import LoraApi

Post = Callable[[str, bytes], Awaitable[tuple[int, bytes]]]
Get = Callable[[str], Awaitable[tuple[int, bytes]]]


class ShardAdapters:
    """The adapters loaded in one engine, least recently loaded first."""

    def __init__(self, *, post: Post) -> None:
        self._post = post
        self._loaded: tuple[str, ...] = ()
        self._lock = asyncio.Lock()

    @property
    def loaded(self) -> tuple[str, ...]:
        return self._loaded

    async def load(self, name: str, path: str, api: LoraApi | None) -> tuple[str, ...]:
        """Load `name` from `path` through `api`; the loaded adapters afterwards."""
        api = _require(api, f"load adapter {name!r}")
        async with self._lock:
            if name in self._loaded:
                return self._loaded
            body = json.dumps({"lora_name": name, "lora_path": path}).encode()
            status, answer = await self._post(api.load_path, body)
            if status != 200 and not _already_loaded(answer):
                raise AdapterError(f"the engine refused adapter {name!r}: {_words(answer, status)}")
            self._loaded = (*self._loaded, name)
            return self._loaded

    async def read_loaded(self, get: Get, api: LoraApi) -> tuple[str, ...]:
        """Take the adapters the engine lists (GET `api.list_path`) as loaded, before
        any loaded since; the loaded adapters afterwards. `AdapterError` when the
        engine's answer is not a model list."""
        async with self._lock:
            status, answer = await get(api.list_path)
            if status != 200:
                raise AdapterError(
                    f"GET {api.list_path} answered {status}: {_words(answer, status)}"
                )
            listed = _adapters_listed(answer)
            if listed is None:
                raise AdapterError(f"GET {api.list_path} answered something else than a list")
            self._loaded = (*listed, *(n for n in self._loaded if n not in listed))
            return self._loaded

    async def unload(self, name: str, api: LoraApi | None) -> tuple[str, ...]:
        """Unload `name` (nothing to do when it is not loaded); the loaded ones afterwards."""
        api = _require(api, f"unload adapter {name!r}")
        async with self._lock:
            if name not in self._loaded:
                return self._loaded
            status, answer = await self._post(
                api.unload_path, json.dumps({"lora_name": name}).encode()
            )
            if status != 200:
                raise AdapterError(
                    f"the engine refused to unload adapter {name!r}: {_words(answer, status)}"
                )
            self._loaded = tuple(n for n in self._loaded if n != name)
            return self._loaded


def _require(api: LoraApi | None, what: str) -> LoraApi:
    if api is None:
        raise AdapterError(f"cannot {what}: this engine loads no LoRA adapters at run time")
    return api


def _words(answer: bytes, status: int) -> str:
    """The engine's own message from an OpenAI-style error body, else its text."""
    text = answer.decode("utf-8", "replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return f"HTTP {status}: {text[:300]}"
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str) and isinstance(body, dict):
        message = body.get("message") or body.get("detail")
    return str(message) if message else f"HTTP {status}: {text[:300]}"


def _already_loaded(answer: bytes) -> bool:
    # vLLM answers 400 "The lora adapter 'x' has already been loaded." for a second load
    # (an engine adopted from an earlier agent keeps what it had): it is loaded, so done.
    return b"has already been loaded" in answer


def _adapters_listed(answer: bytes) -> tuple[str, ...] | None:
    """The adapters in an OpenAI-style model list (`{"data": [{"id", "parent"}]}`): the
    entries with a `parent`, as vLLM lists them; None when it is not such a list."""
    try:
        body = json.loads(answer)
    except ValueError:
        return None
    cards = body.get("data") if isinstance(body, dict) else None
    if not isinstance(cards, list):
        return None
    names = [
        card["id"]
        for card in cards
        if isinstance(card, dict)
        and isinstance(card.get("id"), str)
        and isinstance(card.get("parent"), str)
        and card["parent"]
        and card["parent"] != card["id"]
    ]
    return tuple(dict.fromkeys(names))
