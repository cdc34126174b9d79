"""Real vLLM's life under llmgw: a vLLM that cannot start, an agent restart that
adopts the running vLLM, runtime LoRA, weights that cannot be removed while in use,
and a drain that lets a running stream finish (vLLM aborts what is in flight on
SIGTERM unless told to drain, which llmgw does). The last test removes the model,
so this module runs last.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from lora_adapters import make_peft_adapter
from procs import wait_for
from vllm_fleet import COMMIT, HUB_ID, MODEL, NODE, Fleet, data_events, start_agent

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def test_a_vllm_that_cannot_start_is_reported_with_its_own_output(vllm_fleet: Fleet) -> None:
    vllm_fleet.cli(
        "models", "add", "--name", "broken", "--weights", f"{HUB_ID}@{COMMIT}", "--engine", "vllm",
        "--engine-arg", "--no-such-flag",
    )  # fmt: skip
    try:
        done = vllm_fleet.cli("models", "activate", "broken", "--timeout", "300", check=False)
        assert done.returncode == 1, done.stdout + done.stderr
        # vLLM's own complaint, from the engine's output tail, reaches the operator.
        assert "unrecognized arguments: --no-such-flag" in done.stderr, done.stderr
        failed = [e for e in vllm_fleet.events("broken") if "failed" in e["message"]]
        assert any("--no-such-flag" in e["message"] for e in failed), failed
    finally:
        vllm_fleet.cli("models", "remove", "broken")
    # The model being served was never disturbed.
    assert len(vllm_fleet.ready()) == 1


def chat(fleet: Fleet, **extra: Any) -> httpx.Response:
    with fleet.client() as client:
        return client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "max_tokens": 8, "temperature": 0,
                  "messages": [{"role": "user", "content": "What is the capital of France?"}],
                  **extra},
        )  # fmt: skip


def test_a_restarted_agent_adopts_the_running_vllm(vllm_fleet: Fleet) -> None:
    [before] = vllm_fleet.ready()
    registered = next(
        n["registered_at"] for n in vllm_fleet.admin("/admin/api/nodes")["nodes"] if n["id"] == NODE
    )
    vllm_fleet.agent.popen.kill()
    vllm_fleet.agent.popen.wait(30)
    agent = start_agent(vllm_fleet)
    wait_for(
        lambda: any(
            n["id"] == NODE and n["connected"] and n["registered_at"] != registered
            for n in vllm_fleet.admin("/admin/api/nodes")["nodes"]
        ),
        "the restarted agent to register",
    )
    assert "adopted 1 engine" in agent.output()
    [after] = wait_for(vllm_fleet.ready, "the adopted replica to be ready")
    # The same vLLM process: no reload.
    assert (after["id"], after["pid"]) == (before["id"], before["pid"])
    answer = chat(vllm_fleet)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"].startswith("The capital of France")


def test_a_lora_adapter_made_here_loads_into_the_running_vllm(
    vllm_fleet: Fleet, tmp_path: Path
) -> None:
    snapshot = next((vllm_fleet.hub_repo / "snapshots").iterdir())
    python = vllm_fleet.vllm.parent / "python"
    adapter = make_peft_adapter(python, snapshot, tmp_path / "tiny-lora")
    engine = vllm_fleet.endpoint_url()
    # The profile's adapters turned runtime LoRA on (VLLM_ALLOW_RUNTIME_LORA_UPDATING,
    # --enable-lora): vLLM's own API loads the adapter and serves it under its name.
    loaded = httpx.post(
        engine + "/v1/load_lora_adapter",
        json={"lora_name": "tiny-lora", "lora_path": str(adapter)},
        timeout=120,
    )
    assert loaded.status_code == 200, loaded.text
    models = httpx.get(engine + "/v1/models", timeout=30).json()["data"]
    assert {"id": "tiny-lora", "parent": MODEL}.items() <= next(
        m for m in models if m["id"] == "tiny-lora"
    ).items(), models
    answer = httpx.post(
        engine + "/v1/completions",
        json={"model": "tiny-lora", "prompt": "Hello", "max_tokens": 3},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "tiny-lora"
    unloaded = httpx.post(
        engine + "/v1/unload_lora_adapter", json={"lora_name": "tiny-lora"}, timeout=60
    )
    assert unloaded.status_code == 200, unloaded.text
    # What vLLM answers to bad loads, which `llmgw sim --enable-lora` answers alike.
    missing = httpx.post(
        engine + "/v1/load_lora_adapter",
        json={"lora_name": "ghost", "lora_path": str(tmp_path / "nowhere")},
        timeout=120,
    )
    assert missing.status_code == 404, missing.text
    # vLLM hides file system paths in its error messages.
    assert missing.json()["error"]["message"] == (
        "Loading lora ghost failed: No adapter found for <path>"
    )
    wide = make_peft_adapter(python, snapshot, tmp_path / "wide-lora", rank=16)
    refused = httpx.post(
        engine + "/v1/load_lora_adapter",
        json={"lora_name": "wide", "lora_path": str(wide)},
        timeout=120,
    )
    assert refused.status_code == 500, refused.text
    assert "'LoRA rank 16 is greater than max_lora_rank 8.'" in refused.json()["error"]["message"]


def test_catalog_adapters_load_into_vllm_on_request_and_take_turns_in_its_slot(
    vllm_fleet: Fleet, tmp_path: Path
) -> None:
    snapshot = next((vllm_fleet.hub_repo / "snapshots").iterdir())
    python = vllm_fleet.vllm.parent / "python"
    paths = {
        name: make_peft_adapter(python, snapshot, tmp_path / name)
        for name in ("first-lora", "second-lora")
    }
    paths["ghost-lora"] = tmp_path / "nowhere"
    for name, path in paths.items():
        vllm_fleet.cli("models", "add", name, "--adapter-of", MODEL, "--weights", str(path))
    engine = vllm_fleet.endpoint_url()

    def loaded() -> list[str]:
        cards = httpx.get(engine + "/v1/models", timeout=30).json()["data"]
        return sorted(c["id"] for c in cards if c.get("parent") == MODEL)

    def complete(model: str) -> httpx.Response:
        with vllm_fleet.client() as client:
            return client.post(
                "/v1/completions", json={"model": model, "prompt": "Hello", "max_tokens": 3}
            )

    try:
        # Loaded nowhere: the request loads it through vLLM's runtime API and is answered.
        first = complete("first-lora")
        assert first.status_code == 200, first.text
        assert first.json()["model"] == "first-lora"
        assert loaded() == ["first-lora"]
        # The profile holds one adapter (max_loaded 1): the idle one makes room.
        second = complete("second-lora")
        assert second.status_code == 200, second.text
        assert loaded() == ["second-lora"]
        again = complete("first-lora")
        assert again.status_code == 200, again.text
        assert loaded() == ["first-lora"]
        # vLLM's own words for a missing adapter, answered at once as a client error.
        ghost = complete("ghost-lora")
        assert ghost.status_code == 400, ghost.text
        assert (
            "Loading lora ghost-lora failed: No adapter found for <path>"
            in (ghost.json()["error"]["message"])
        )
    finally:
        for name in paths:
            vllm_fleet.cli("models", "remove", name, check=False)


def remove_weights(fleet: Fleet) -> subprocess.CompletedProcess[str]:
    relative = str(fleet.hub_repo.relative_to(fleet.weights_dir))
    return fleet.cli("nodes", "remove-weights", NODE, relative, check=False)


def test_removing_the_model_drains_vllm_and_a_running_stream_finishes(
    vllm_fleet: Fleet,
) -> None:
    refused = remove_weights(vllm_fleet)
    assert refused.returncode != 0, refused.stdout
    [shard] = vllm_fleet.ready()
    assert shard["id"] in refused.stderr, refused.stderr
    assert vllm_fleet.hub_repo.is_dir()

    answer: dict[str, Any] = {}
    first_token = threading.Event()

    def stream() -> None:
        with vllm_fleet.client(timeout=300) as client:
            body = {
                "model": MODEL, "max_tokens": 48, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "Tell me about Paris."}],
            }  # fmt: skip
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                answer["status"] = response.status_code
                lines: list[str] = []
                for line in response.iter_lines():
                    if line.startswith("data:") and '"content"' in line:
                        first_token.set()
                    if line:
                        lines.append(line)
                answer["lines"] = lines

    reader = threading.Thread(target=stream)
    reader.start()
    try:
        assert first_token.wait(120), "the stream never produced a token"
        removed = vllm_fleet.cli("models", "remove", MODEL)
        assert "removed" in removed.stdout
        wait_for(
            lambda: (
                any(s["state"] == "draining" for s in vllm_fleet.shards()) or not reader.is_alive()
            ),
            "the replica to drain",
        )
    finally:
        reader.join(300)
    assert answer["status"] == 200
    events, done = data_events(answer["lines"])
    errors = [line for line in answer["lines"] if "error" in line]
    assert done and not errors, answer["lines"][-5:]
    # Every token asked for arrived: vLLM finished the request before it stopped.
    assert events[-1]["usage"]["completion_tokens"] == 48, events[-1]
    finish = [
        c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")
    ]
    assert finish == ["length"], finish
    wait_for(lambda: vllm_fleet.shards() == [], "the drained replica to be gone", within=120)
    stops = [e["message"] for e in vllm_fleet.events(MODEL) if e["kind"] == "stop"]
    assert any("no longer in the catalog" in m for m in stops), stops
    # Nothing uses the weights now: they may go, and they are gone from the node's disk.
    done_removing = remove_weights(vllm_fleet)
    assert done_removing.returncode == 0, done_removing.stderr
    assert not vllm_fleet.hub_repo.exists()
