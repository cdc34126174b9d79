"""The sim's runtime LoRA API in-process: load, list, serve, swap, unload, and vLLM's errors.

Sleeps are recorded by a fake `sleep` instead of being slept, so the load time a request
paid is read from the record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from lora_adapters import sim_adapter
from prometheus_client import CollectorRegistry, generate_latest
from test_sim_app import call

from llmgw.cli.sim_wiring import build_app
from llmgw.sim.app import SimApp
from llmgw.sim.faults import FaultSettings
from llmgw.sim.settings import SimSettings


class Slept:
    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def lora_app(slept: Slept, registry: CollectorRegistry | None = None, **settings: Any) -> SimApp:
    defaults: dict[str, Any] = {
        "models": ("base",),
        "enable_lora": True,
        "max_loras": 2,
        "max_lora_rank": 8,
        "lora_load_time": 0.5,
        # No timing model but the adapters' load time: the recorded sleeps are only those.
        "prefill_per_token": 0.0,
        "itl": 0.0,
        "itl_per_running": 0.0,
    }
    return build_app(
        SimSettings(**{**defaults, **settings}),
        faults=FaultSettings(),
        registry=registry or CollectorRegistry(auto_describe=False),
        clock=lambda: 0.0,
        wall_clock=lambda: 1_700_000_000.0,
        sleep=slept,
    )


async def load(app: SimApp, name: str, path: Path | str) -> Any:
    return await call(
        app, "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}
    )


async def complete(app: SimApp, model: str) -> Any:
    body = {"model": model, "prompt": "Hello there", "max_tokens": 2}
    return await call(app, "POST", "/v1/completions", body)


async def test_a_loaded_adapter_is_listed_with_its_parent_and_served(tmp_path: Path) -> None:
    slept = Slept()
    app = lora_app(slept)
    path = sim_adapter(tmp_path, "tone")
    loaded = await load(app, "tone", path)
    assert loaded.status == 200
    assert loaded.body == b"Success: LoRA adapter 'tone' added successfully."
    assert slept.seconds == [0.5]
    models = (await call(app, "GET", "/v1/models")).json()["data"]
    assert [m["id"] for m in models] == ["base", "tone"]
    assert {"parent": "base", "root": str(path)}.items() <= models[1].items()
    answer = await complete(app, "tone")
    assert answer.status == 200
    assert answer.json()["model"] == "tone"
    # Resident since its load: the request did not wait for a swap.
    assert slept.seconds == [0.5]


async def test_more_adapters_than_slots_swap_in_on_request(tmp_path: Path) -> None:
    slept = Slept()
    registry = CollectorRegistry(auto_describe=False)
    app = lora_app(slept, registry)
    for name in ("a", "b", "c"):
        assert (await load(app, name, sim_adapter(tmp_path, name))).status == 200
    stats = (await call(app, "GET", "/sim/stats")).json()["lora"]
    assert stats["registered"] == ["a", "b", "c"]
    assert stats["resident"] == ["b", "c"]
    slept.seconds.clear()
    assert (await complete(app, "a")).status == 200
    assert slept.seconds == [0.5]  # "a" was evicted by "c": swapped back in
    stats = (await call(app, "GET", "/sim/stats")).json()["lora"]
    assert stats["resident"] == ["c", "a"]
    assert stats["swaps"] == 1
    text = generate_latest(registry).decode()
    assert 'vllm:lora_requests_info{max_lora="2"' in text
    # Requests of adapters count under the base model, as vLLM labels them.
    assert 'vllm:request_success_total{engine="0",model_name="base"} 1.0' in text


async def test_unload_forgets_the_adapter(tmp_path: Path) -> None:
    app = lora_app(Slept())
    assert (await load(app, "tone", sim_adapter(tmp_path, "tone"))).status == 200
    gone = await call(app, "POST", "/v1/unload_lora_adapter", {"lora_name": "tone"})
    assert gone.status == 200
    assert gone.body == b"Success: LoRA adapter 'tone' removed successfully."
    answer = await complete(app, "tone")
    assert answer.status == 404
    assert "'tone' does not exist" in answer.json()["error"]["message"]
    again = await call(app, "POST", "/v1/unload_lora_adapter", {"lora_name": "tone"})
    assert again.status == 404
    assert again.json()["error"] == {
        "message": "The lora adapter 'tone' cannot be found.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }


async def test_bad_loads_answer_with_vllms_words(tmp_path: Path) -> None:
    slept = Slept()
    app = lora_app(slept)
    missing = await load(app, "ghost", tmp_path / "nowhere")
    assert missing.status == 404
    # vLLM hides the path (pytest's tmp_path is under /tmp).
    assert missing.json()["error"]["message"] == (
        "Loading lora ghost failed: No adapter found for <path>"
    )
    big = await load(app, "big", sim_adapter(tmp_path, "big", rank=64))
    assert big.status == 500
    assert big.json()["error"]["message"] == (
        "Call to add_lora method failed: Worker failed with error 'LoRA rank 64 is greater "
        "than max_lora_rank 8.', please check the stack trace above for the root cause"
    )
    assert big.json()["error"]["type"] == "InternalServerError"
    clash = await load(app, "base", sim_adapter(tmp_path, "clash"))
    assert clash.status == 400
    assert "conflicts with a served base model" in clash.json()["error"]["message"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    bad_json = await load(app, "broken", broken)
    assert bad_json.status == 400
    assert "is not valid JSON" in bad_json.json()["error"]["message"]
    no_name = await call(app, "POST", "/v1/load_lora_adapter", {"lora_path": str(tmp_path)})
    assert no_name.status == 400
    assert no_name.json()["error"]["message"] == (
        "Both 'lora_name' and 'lora_path' must be provided."
    )
    not_object = await call(app, "POST", "/v1/load_lora_adapter", b"[1]")
    assert not_object.status == 400
    # None of those spent the load time.
    assert slept.seconds == []
    ok = sim_adapter(tmp_path, "ok")
    assert (await load(app, "ok", ok)).status == 200
    twice = await load(app, "ok", ok)
    assert twice.status == 400
    assert twice.json()["error"]["message"].startswith(
        "The lora adapter 'ok' has already been loaded."
    )


async def test_without_enable_lora_the_endpoints_are_not_served(tmp_path: Path) -> None:
    app = lora_app(Slept(), enable_lora=False)
    reply = await load(app, "tone", sim_adapter(tmp_path, "tone"))
    assert reply.status == 404
    assert orjson.loads(reply.body)["error"]["code"] == "not_found"
