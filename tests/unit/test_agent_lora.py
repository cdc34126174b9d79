"""The agent's side of runtime LoRA adapters: the engine calls it makes, the names it
keeps, and the engine's own words when the engine refuses."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest

from llmgw.agent.errors import AdapterError
from llmgw.agent.lora import ShardAdapters
from llmgw.engines import LoraApi

API = LoraApi(
    load_path="/v1/load_lora_adapter",
    unload_path="/v1/unload_lora_adapter",
    list_path="/v1/models",
)


class Engine:
    """Answers POSTs from a script of (status, body) and records what it was sent."""

    def __init__(self, *answers: tuple[int, bytes]) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, dict[str, object]]] = []

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.sent.append((path, json.loads(body)))
        return self.answers.pop(0)


async def test_loads_and_unloads_through_the_engines_api_in_order() -> None:
    engine = Engine((200, b"Success"), (200, b"Success"), (200, b"Success"))
    adapters = ShardAdapters(post=engine.post)
    assert await adapters.load("red", "/a/red", API) == ("red",)
    assert await adapters.load("blue", "/a/blue", API) == ("red", "blue")
    # A second load of a loaded one asks the engine nothing.
    assert await adapters.load("red", "/a/red", API) == ("red", "blue")
    assert await adapters.unload("red", API) == ("blue",)
    assert await adapters.unload("red", API) == ("blue",)
    assert engine.sent == [
        ("/v1/load_lora_adapter", {"lora_name": "red", "lora_path": "/a/red"}),
        ("/v1/load_lora_adapter", {"lora_name": "blue", "lora_path": "/a/blue"}),
        ("/v1/unload_lora_adapter", {"lora_name": "red"}),
    ]


async def test_a_refusal_carries_the_engines_words() -> None:
    vllm_error = {
        "error": {
            "message": "Loading lora red failed: No adapter found for <path>",
            "type": "NotFoundError",
            "code": 404,
        }
    }
    adapters = ShardAdapters(
        post=Engine((404, json.dumps(vllm_error).encode()), (500, b"oops")).post
    )
    with pytest.raises(AdapterError) as refused:
        await adapters.load("red", "/nowhere", API)
    assert str(refused.value) == (
        "the engine refused adapter 'red': Loading lora red failed: No adapter found for <path>"
    )
    with pytest.raises(AdapterError) as plain:
        await adapters.load("red", "/nowhere", API)
    assert "HTTP 500: oops" in str(plain.value)
    assert adapters.loaded == ()


async def test_one_the_engine_already_has_counts_as_loaded() -> None:
    # An engine adopted from an earlier agent kept its adapters; vLLM says so with a 400.
    already = {"error": {"message": "The lora adapter 'red' has already been loaded."}}
    adapters = ShardAdapters(post=Engine((400, json.dumps(already).encode())).post)
    assert await adapters.load("red", "/a/red", API) == ("red",)


async def test_an_engine_without_the_api_is_refused_saying_so() -> None:
    adapters = ShardAdapters(post=Engine().post)
    with pytest.raises(AdapterError) as refused:
        await adapters.load("red", "/a/red", None)
    assert "this engine loads no LoRA adapters at run time" in str(refused.value)


def listing(status: int, body: object) -> Callable[[str], Awaitable[tuple[int, bytes]]]:
    async def get(path: str) -> tuple[int, bytes]:
        assert path == "/v1/models"
        return status, json.dumps(body).encode()

    return get


async def test_an_adopted_engines_adapters_are_read_from_its_model_list() -> None:
    # vLLM's /v1/models: the base (no parent), then each adapter with its parent.
    models = {
        "object": "list",
        "data": [
            {"id": "base", "root": "/w/base", "parent": None},
            {"id": "red", "root": "/a/red", "parent": "base"},
            {"id": "blue", "root": "/a/blue", "parent": "base"},
        ],
    }
    engine = Engine((200, b"Success"))
    adapters = ShardAdapters(post=engine.post)
    assert await adapters.load("green", "/a/green", API) == ("green",)
    # Read after a load: the engine's own count as loaded before it.
    assert await adapters.read_loaded(listing(200, models), API) == ("red", "blue", "green")
    # Loading one it listed asks the engine nothing.
    assert await adapters.load("red", "/a/red", API) == ("red", "blue", "green")
    assert len(engine.sent) == 1


async def test_a_model_list_that_is_not_one_is_an_error() -> None:
    adapters = ShardAdapters(post=Engine().post)
    with pytest.raises(AdapterError) as refused:
        await adapters.read_loaded(listing(200, ["not", "a", "list"]), API)
    assert "answered something else than a list" in str(refused.value)
    with pytest.raises(AdapterError) as failed:
        await adapters.read_loaded(listing(503, {"error": {"message": "asleep"}}), API)
    assert str(failed.value) == "GET /v1/models answered 503: asleep"
    assert adapters.loaded == ()
