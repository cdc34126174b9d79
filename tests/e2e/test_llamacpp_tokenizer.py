"""End to end: `/tokenize` and `/detokenize` through the real `llmgw server` to the real
llama.cpp engine, declared as one (`engine: llamacpp`), which tokenizes at
`/extras/tokenize` and `/extras/detokenize` with bodies of its own (`input`, `tokens`;
vLLM's `prompt` is renamed on the way) and answers of its own (`tokens`, `text`)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import httpx
import pytest
from procs import Server, llmgw

pytestmark = pytest.mark.engine

# The name the engine serves the model under (`--model_alias`, tests/e2e/conftest.py).
MODEL = "gemma-3-270m"


@pytest.fixture(scope="module")
def gateway_client(
    engine_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """A router-only `llmgw server` whose one endpoint is the engine, declared llama.cpp."""
    data_dir = tmp_path_factory.mktemp("llmgw-tokenizer")
    config = data_dir / "llmgw.yaml"
    config.write_text(
        f"endpoints:\n  - {{id: gemma, url: '{engine_url}', models: [{MODEL}], engine: llamacpp}}\n"
    )
    subprocess.run(
        llmgw("db", "upgrade", "--data-dir", str(data_dir)), check=True, capture_output=True
    )
    created = subprocess.run(
        llmgw("keys", "create", "--name", "e2e", "--json", "--data-dir", str(data_dir)),
        capture_output=True,
        text=True,
        check=True,
    )
    api_key = json.loads(created.stdout)["secret"]
    server = Server("--config", str(config), auth=True, data_dir=data_dir)
    try:
        headers = {"Authorization": f"Bearer {api_key}"}
        with httpx.Client(base_url=server.url, timeout=60, headers=headers) as client:
            yield client
    finally:
        server.proc.stop()


def test_tokenize_and_detokenize_reach_llamacpps_extras_routes(
    gateway_client: httpx.Client,
) -> None:
    resp = gateway_client.post("/tokenize", json={"model": MODEL, "input": "The capital of France"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-llmgw-replica"] == "gemma"
    tokens = resp.json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)

    back = gateway_client.post("/detokenize", json={"model": MODEL, "tokens": tokens})
    assert back.status_code == 200, back.text
    assert "The capital of France" in back.json()["text"]


def test_vllms_prompt_field_is_renamed_for_llamacpp(gateway_client: httpx.Client) -> None:
    # llama-cpp-python calls it `input`, and answers a body without it with a 500.
    text = "The capital of France"
    own = gateway_client.post("/tokenize", json={"model": MODEL, "input": text})
    vllm = gateway_client.post("/tokenize", json={"model": MODEL, "prompt": text})
    assert vllm.status_code == 200, vllm.text
    assert vllm.json()["tokens"] == own.json()["tokens"]


def test_rerank_is_refused_naming_the_engine(gateway_client: httpx.Client) -> None:
    resp = gateway_client.post(
        "/v1/rerank", json={"model": MODEL, "query": "a", "documents": ["a"]}
    )
    assert resp.status_code == 404
    assert resp.json()["error"]["message"] == (
        f"model '{MODEL}' (engine llama.cpp) does not serve /v1/rerank"
    )
