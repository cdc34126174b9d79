"""Rerank, score, tokenizer and audio routes through the real `llmgw server` to `llmgw sim`s.

Two sims serve m1 (the engine routes are passed through as bytes and retried like
chat), and static endpoints declare what their engines serve: "lc" is a llama.cpp
engine (no rerank, no audio) and "chat-only" declares only chat completions.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from procs import Server, Sim, llmgw
from test_gateway_keys_limits_usage import bearer, create_key, error_of

from llmgw.sim.extras import overlap, transcript

_MAX_BODY = 256 * 1024


class Gateway:
    def __init__(self, server: Server, sims: tuple[Sim, Sim], data_dir: Path, key: str) -> None:
        self.server = server
        self.sims = sims
        self.data_dir = data_dir
        self.key = key

    def post(self, path: str, body: dict[str, object], key: str | None = None) -> httpx.Response:
        return httpx.post(
            self.server.url + path, json=body, headers=bearer(key or self.key), timeout=30
        )

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.server.url + "/v1", api_key=self.key, max_retries=0)

    def usage_row(self, request_id: str) -> dict[str, object]:
        """The raw usage record of `request_id`, once the recorder has flushed it."""
        deadline = time.monotonic() + 20
        while True:
            with sqlite3.connect(self.data_dir / "llmgw.db") as db:
                db.row_factory = sqlite3.Row
                row = db.execute(
                    "SELECT * FROM usage_records WHERE request_id = ?", (request_id,)
                ).fetchone()
            if row is not None:
                return dict(row)
            assert time.monotonic() < deadline, f"no usage record for {request_id}"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir = tmp_path_factory.mktemp("data")
    subprocess.run(
        llmgw("db", "upgrade", "--data-dir", str(data_dir)), check=True, capture_output=True
    )
    first = Sim("--zero-delay", model="m1", extra_models=("lc", "chat-only"))
    second = Sim("--zero-delay", model="m1")
    config = data_dir / "llmgw.yaml"
    config.write_text(
        f"""
auth: {{refresh_interval: 0.2}}
usage: {{flush_interval: 0.05}}
router: {{max_body_bytes: {_MAX_BODY}}}
endpoints:
  - {{id: s1, url: "{first.url}", models: [m1], engine: sim}}
  - {{id: s2, url: "{second.url}", models: [m1], engine: sim}}
  - {{id: lc1, url: "{first.url}", models: [lc], engine: llamacpp}}
  - {{id: co1, url: "{first.url}", models: [chat-only], routes: [/v1/chat/completions]}}
models:
  - name: lc-catalog
    weights: /models/tiny.gguf
    profiles: [{{engine: llamacpp}}]
"""
    )
    server = Server("--config", str(config), auth=True, data_dir=data_dir)
    try:
        key = create_key(data_dir, "--name", "routes")
        yield Gateway(server, (first, second), data_dir, key)
    finally:
        server.proc.stop()
        first.proc.stop()
        second.proc.stop()


def test_rerank_orders_documents_and_records_its_tokens(gateway: Gateway) -> None:
    documents = ["the river runs", "a blue mountain river", "nothing alike here"]
    query = "blue river"
    resp = gateway.post(
        "/v1/rerank", {"model": "m1", "query": query, "documents": documents, "top_n": 2}
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-llmgw-replica"] in ("s1", "s2")
    body = resp.json()
    assert [r["index"] for r in body["results"]] == [1, 0]
    assert body["results"][0]["relevance_score"] == overlap(query, documents[1])
    total = body["usage"]["total_tokens"]
    assert total == sum(2 + len(d.split()) for d in documents)

    row = gateway.usage_row(resp.headers["x-request-id"])
    assert row["route"] == "/v1/rerank"
    assert row["model"] == "m1"
    assert row["status"] == 200
    # vLLM's rerank counts only total_tokens: all of them are input.
    assert row["prompt_tokens"] == total
    assert row["completion_tokens"] == 0
    assert row["key_id"] is not None


def test_score_pairs_texts_as_vllm_does(gateway: Gateway) -> None:
    resp = gateway.post(
        "/v1/score",
        {"model": "m1", "text_1": "green river", "text_2": ["green river", "blue sky"]},
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "list"
    assert [d["score"] for d in body["data"]] == [1.0, 0.0]
    assert body["usage"]["prompt_tokens"] == 8
    row = gateway.usage_row(resp.headers["x-request-id"])
    assert (row["route"], row["prompt_tokens"]) == ("/v1/score", 8)


def test_tokenize_and_detokenize_round_trip(gateway: Gateway) -> None:
    resp = gateway.post("/tokenize", {"model": "m1", "prompt": "Hello, big world"})
    assert resp.status_code == 200, resp.text
    tokens = resp.json()
    assert tokens["count"] == 4
    assert len(tokens["tokens"]) == 4
    back = gateway.post("/detokenize", {"model": "m1", "tokens": tokens["tokens"]})
    assert back.status_code == 200, back.text
    assert back.json() == {"prompt": "Hello, big world"}
    row = gateway.usage_row(back.headers["x-request-id"])
    assert (row["route"], row["status"]) == ("/detokenize", 200)


def test_chat_is_recorded_with_its_route_too(gateway: Gateway) -> None:
    resp = gateway.post(
        "/v1/chat/completions",
        {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert resp.status_code == 200, resp.text
    row = gateway.usage_row(resp.headers["x-request-id"])
    assert row["route"] == "/v1/chat/completions"


def test_transcription_with_the_openai_sdk(gateway: Gateway) -> None:
    audio = os.urandom(96_000) + b"\r\n--not-the-boundary\r\n" + os.urandom(100)
    text, seconds = transcript(audio)
    with gateway.client() as client:
        result = client.audio.transcriptions.create(model="m1", file=("speech.wav", audio))
        assert result.text == text
        # 32,000 bytes a second of audio, as 16 kHz 16-bit mono.
        assert seconds == round(len(audio) / 32_000, 3)
        assert result.model_dump()["usage"] == {"type": "duration", "seconds": seconds}
        raw = client.audio.transcriptions.with_raw_response.create(
            model="m1", file=("speech.wav", audio), response_format="text"
        )
    assert raw.http_response.text == text
    assert raw.http_response.headers["content-type"].startswith("text/plain")
    row = gateway.usage_row(raw.http_response.headers["x-request-id"])
    assert (row["route"], row["model"], row["status"]) == ("/v1/audio/transcriptions", "m1", 200)


def test_translation_is_multipart_too(gateway: Gateway) -> None:
    audio = os.urandom(40_000)
    resp = httpx.post(
        gateway.server.url + "/v1/audio/translations",
        files={"file": ("speech.wav", audio)},
        data={"model": "m1"},
        headers=bearer(gateway.key),
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["text"] == transcript(audio, salt=1)[0]
    row = gateway.usage_row(resp.headers["x-request-id"])
    assert row["route"] == "/v1/audio/translations"


def test_a_failing_engine_is_retried_on_another_for_engine_routes(gateway: Gateway) -> None:
    failing = gateway.sims[0]
    failing.faults(error_rate=1.0, error_status=503)
    try:
        for _ in range(4):
            resp = gateway.post("/v1/rerank", {"model": "m1", "query": "a", "documents": ["a"]})
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-llmgw-replica"] == "s2"
    finally:
        failing.faults(error_rate=0.0)


def test_a_model_whose_engine_lacks_the_route_gets_404_naming_both(gateway: Gateway) -> None:
    body = {"model": "lc", "query": "a", "documents": ["a"]}
    error = error_of(gateway.post("/v1/rerank", body), 404)
    assert error["code"] == "route_not_served"
    assert error["message"] == "model 'lc' (engine llama.cpp) does not serve /v1/rerank"
    assert error["param"] == "model"
    with (
        gateway.client() as client,
        pytest.raises(openai.NotFoundError, match="does not serve /v1/audio/transcriptions"),
    ):
        client.audio.transcriptions.create(model="lc", file=("a.wav", b"\x00" * 100))

    declared = error_of(gateway.post("/tokenize", {"model": "chat-only", "prompt": "x"}), 404)
    assert declared["message"] == (
        "model 'chat-only' does not serve /tokenize: its endpoints (co1) leave it out of "
        "their `routes`"
    )
    # What the endpoint does declare still works.
    chat = {"model": "chat-only", "messages": [{"role": "user", "content": "hi"}]}
    assert gateway.post("/v1/chat/completions", {**chat, "max_tokens": 2}).status_code == 200


def test_a_catalog_model_is_not_started_for_a_route_its_engines_lack(gateway: Gateway) -> None:
    body = {"model": "lc-catalog", "query": "a", "documents": ["a"]}
    error = error_of(gateway.post("/v1/rerank", body), 404)
    assert error["message"] == "model 'lc-catalog' (engine llama.cpp) does not serve /v1/rerank"
    models = httpx.get(gateway.server.admin + "/admin/api/models", timeout=10).json()
    (model,) = [m for m in models["models"] if m["name"] == "lc-catalog"]
    assert (model["status"]["state"], model["status"]["desired_replicas"]) == ("stopped", 0)
    assert model["status"]["activating"] is False
    assert model["status"]["replicas"] == []


def test_llamacpp_tokenize_goes_to_its_extras_path(gateway: Gateway) -> None:
    # The sim has no /extras/tokenize: its 404 shows where the router sent the request.
    resp = gateway.post("/tokenize", {"model": "lc", "input": "hello"})
    assert resp.status_code == 404
    assert "/extras/tokenize" in resp.json()["error"]["message"]


def test_bad_inputs_are_refused_naming_the_field(gateway: Gateway) -> None:
    missing = error_of(gateway.post("/v1/rerank", {"query": "a", "documents": ["a"]}), 400)
    assert missing["param"] == "model"
    assert "/v1/rerank is routed by model" in missing["message"]
    assert error_of(gateway.post("/detokenize", {"model": 3, "tokens": []}), 400)["param"] == (
        "model"
    )
    not_json = httpx.post(
        gateway.server.url + "/v1/score", content=b"{nope", headers=bearer(gateway.key)
    )
    assert error_of(not_json, 400)["code"] == "invalid_json"

    unknown = error_of(gateway.post("/v1/score", {"model": "nope", "text_1": "a"}), 404)
    assert unknown["code"] == "model_not_found"
    assert "'nope'" in unknown["message"]

    url = gateway.server.url + "/v1/audio/transcriptions"
    no_model = httpx.post(
        url, files={"file": ("a.wav", b"\x01" * 64)}, headers=bearer(gateway.key), timeout=30
    )
    error = error_of(no_model, 400)
    assert error["param"] == "model"
    assert "form field" in error["message"]

    boundary = "b0undary"
    broken = httpx.post(
        url,
        content=b'--b0undary\r\nContent-Disposition: form-data; name="model"\r\n\r\nm1',
        headers={
            **bearer(gateway.key),
            "content-type": f"multipart/form-data; boundary={boundary}",
        },
        timeout=30,
    )
    assert "not valid multipart/form-data" in error_of(broken, 400)["message"]
    as_json = httpx.post(url, json={"model": "m1"}, headers=bearer(gateway.key), timeout=30)
    assert "must be multipart/form-data" in error_of(as_json, 400)["message"]

    too_big = httpx.post(
        url,
        files={"file": ("a.wav", b"\x02" * (_MAX_BODY + 1))},
        data={"model": "m1"},
        headers=bearer(gateway.key),
        timeout=30,
    )
    assert "router.max_body_bytes" in error_of(too_big, 413)["message"]


def test_keys_are_checked_as_on_every_route(gateway: Gateway) -> None:
    url = gateway.server.url + "/v1/rerank"
    body = {"model": "m1", "query": "a", "documents": ["a"]}
    assert error_of(httpx.post(url, json=body), 401)["code"] == "missing_api_key"
    only_m2 = create_key(gateway.data_dir, "--name", "only-m2", "--models", "m2")
    for path in ("/v1/rerank", "/tokenize"):
        denied = error_of(gateway.post(path, body, key=only_m2), 403)
        assert denied["code"] == "model_not_allowed"
        assert "m1" in denied["message"]
    client = openai.OpenAI(base_url=gateway.server.url + "/v1", api_key=only_m2, max_retries=0)
    with client, pytest.raises(openai.PermissionDeniedError, match="m1"):
        client.audio.transcriptions.create(model="m1", file=("a.wav", b"\x00" * 100))


def test_metrics_count_requests_by_route(gateway: Gateway) -> None:
    assert (
        gateway.post("/v1/score", {"model": "m1", "text_1": "a", "text_2": "a"}).status_code == 200
    )
    gateway.post("/v1/rerank", {"model": "lc", "query": "a", "documents": ["a"]})
    wanted = (
        'llmgw_route_requests_total{model="m1",route="/v1/score",status="200"}',
        'llmgw_route_requests_total{model="lc",route="/v1/rerank",status="404"}',
    )
    # The router counts a request as its answer goes out: wait for the count to show.
    deadline = time.monotonic() + 20
    while not all(line in gateway.server.metrics() for line in wanted):
        assert time.monotonic() < deadline, gateway.server.metrics()
        time.sleep(0.05)


def test_count_tokens_does_not_ask_an_engine_without_a_tokenizer(gateway: Gateway) -> None:
    messages = [{"role": "user", "content": "How wide is the sea?"}]
    resp = httpx.post(
        gateway.server.url + "/v1/messages/count_tokens",
        json={"model": "chat-only", "messages": messages},
        headers={"x-api-key": gateway.key},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-llmgw-estimated"] == "true"
    counted = httpx.post(
        gateway.server.url + "/v1/messages/count_tokens",
        json={"model": "m1", "messages": messages},
        headers={"x-api-key": gateway.key},
        timeout=30,
    )
    assert counted.status_code == 200, counted.text
    assert "x-llmgw-estimated" not in counted.headers


def test_rates_and_token_budgets_hold_on_engine_routes(gateway: Gateway) -> None:
    one_a_minute = create_key(gateway.data_dir, "--name", "one-rpm", "--rpm", "1")
    body = {"model": "m1", "query": "blue river", "documents": ["blue river"]}
    assert gateway.post("/v1/rerank", body, key=one_a_minute).status_code == 200
    limited = error_of(gateway.post("/tokenize", {"model": "m1", "prompt": "x"}, one_a_minute), 429)
    assert limited["code"] == "rate_limit_exceeded"

    # Rerank's total_tokens count against the budget: 40 documents of 2 + 2 tokens each.
    budget = create_key(
        gateway.data_dir, "--name", "tiny-budget", "--budget-tokens", "100", "--period", "day"
    )
    many = {**body, "documents": ["blue river"] * 40}
    statuses = []
    for _ in range(6):
        resp = gateway.post("/v1/rerank", many, key=budget)
        statuses.append(resp.status_code)
        if resp.status_code == 429:
            assert resp.json()["error"]["code"] == "insufficient_quota"
            break
    # The first answer alone spends the budget; how soon the next request sees it is the
    # limiter's business (as for chat), so only the outcome is asserted.
    assert statuses[0] == 200
    assert statuses[-1] == 429
