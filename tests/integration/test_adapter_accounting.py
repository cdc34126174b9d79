"""Adapters an engine has loaded, served by a router-only `llmgw server` that lists them
among the endpoint's models: a key allowed one adapter cannot use another, and usage is
recorded per adapter with the engine's own token counts.

The sim (`--enable-lora`) stands in for vLLM: the adapters are loaded through vLLM's
runtime API before the server starts, as an operator of a static vLLM fleet does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from lora_adapters import sim_adapter
from procs import Server, Sim, wait_for
from test_gateway_keys_limits_usage import bearer, create_key, error_of, usage_rows


@pytest.fixture
def adapters_gateway(tmp_path: Path) -> Iterator[tuple[Sim, Server, Path]]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    config = data_dir / "llmgw.yaml"
    config.write_text("auth: {refresh_interval: 0.2}\nusage: {flush_interval: 0.05}\n")
    sim = Sim("--zero-delay", "--enable-lora", "--max-loras", "2", model="base")
    try:
        for name in ("tone", "terse"):
            loaded = httpx.post(
                sim.url + "/v1/load_lora_adapter",
                json={"lora_name": name, "lora_path": str(sim_adapter(tmp_path, name))},
                timeout=30,
            )
            assert loaded.status_code == 200, loaded.text
        server = Server(
            "--endpoint", f"s={sim.url}=base,tone,terse", "--config", str(config),
            auth=True, data_dir=data_dir,
        )  # fmt: skip
    except BaseException:
        sim.proc.stop()
        raise
    yield sim, server, data_dir
    server.proc.stop()
    sim.proc.stop()


def test_a_key_allowed_one_adapter_cannot_use_another_and_usage_is_per_adapter(
    adapters_gateway: tuple[Sim, Server, Path],
) -> None:
    _, server, data_dir = adapters_gateway
    only_tone = create_key(data_dir, "--name", "only-tone", "--models", "tone")
    url = server.url + "/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "Say it kindly"}], "max_tokens": 4}
    answer = httpx.post(url, json={"model": "tone", **body}, headers=bearer(only_tone), timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "tone"
    engine_usage = answer.json()["usage"]
    for other in ("terse", "base"):
        denied = httpx.post(
            url, json={"model": other, **body}, headers=bearer(only_tone), timeout=30
        )
        assert error_of(denied, 403)["code"] == "model_not_allowed"
    listed = httpx.get(server.url + "/v1/models", headers=bearer(only_tone), timeout=30).json()
    assert [m["id"] for m in listed["data"]] == ["tone"]

    def tone_usage() -> list[object]:
        return [r for r in usage_rows(data_dir, model="tone") if r.requests]

    [row] = wait_for(tone_usage, "the adapter's usage to be recorded", within=30)
    assert row.model == "tone"
    assert (row.requests, row.errors) == (1, 0)
    assert (row.prompt_tokens, row.completion_tokens) == (
        engine_usage["prompt_tokens"],
        engine_usage["completion_tokens"],
    )
