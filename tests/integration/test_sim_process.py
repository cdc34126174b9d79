"""The real `llmgw sim` as a process on loopback: API shapes, metrics, faults, lifecycle.

Three sims start in parallel for the whole module: a main one with fast timings, one
that is still loading (and fails every request once loaded), and one that crashes on
its third inference request. Waits poll with a deadline; nothing asserts on wall-clock
durations.
"""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import orjson
import pytest
from procs import Sim

CHAT = {"model": "sim-a", "messages": [{"role": "user", "content": "Tell me about the sea."}]}
LOAD_TIME = "4"


@dataclass(frozen=True)
class Sims:
    main: Sim
    loading: Sim
    crashing: Sim


@pytest.fixture(scope="module")
def sims() -> Iterator[Sims]:
    started: list[Sim] = []
    try:
        loading = Sim(
            "--load-time", LOAD_TIME, "--error-rate", "1.0", "--error-status", "502",
            model="sim-a", wait=False,
        )  # fmt: skip
        started.append(loading)
        crashing = Sim("--zero-delay", "--crash-after", "2", model="sim-a", wait=False)
        started.append(crashing)
        main = Sim(
            "--model", "sim-b", "--itl", "0.002", "--prefill-per-token", "0",
            "--output-tokens", "6", "--block-size", "4",
            model="sim-a", wait=False,
        )  # fmt: skip
        started.append(main)
        loading.proc.wait_http(loading.url + "/sim/stats")
        crashing.proc.wait_http(crashing.url + "/health")
        main.proc.wait_http(main.url + "/health")
        yield Sims(main=main, loading=loading, crashing=crashing)
    finally:
        for sim in started:
            sim.proc.stop()


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _events(text: str) -> list[object]:
    out: list[object] = []
    for event in text.split("\n\n"):
        if event:
            assert event.startswith("data: ")
            data = event[len("data: ") :]
            out.append(data if data == "[DONE]" else orjson.loads(data))
    return out


def _assert_openai_error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code


def test_loading_sim_answers_503_except_metrics_and_sim_routes() -> None:
    # A sim of its own that loads for longer than the test can take, however loaded
    # the machine: the module's loading sim may be done loading by the time this runs.
    loading = Sim("--load-time", "600", model="sim-a", wait=False)
    try:
        loading.proc.wait_http(loading.url + "/sim/stats")
        _assert_loading(loading.url)
    finally:
        loading.proc.stop()


def _assert_loading(url: str) -> None:
    for resp in (
        httpx.get(url + "/health"),
        httpx.get(url + "/v1/models"),
        httpx.post(url + "/v1/chat/completions", json=CHAT),
    ):
        assert resp.status_code == 503
        assert resp.json() == {
            "error": {
                "message": "model is loading",
                "type": "service_unavailable",
                "param": None,
                "code": "loading",
            }
        }
    assert httpx.get(url + "/metrics").status_code == 200
    assert httpx.get(url + "/sim/stats").status_code == 200


def test_health_and_models(sims: Sims) -> None:
    health = httpx.get(sims.main.url + "/health")
    assert (health.status_code, health.content) == (200, b"")
    models = httpx.get(sims.main.url + "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["sim-a", "sim-b"]
    assert {m["object"] for m in models["data"]} == {"model"}
    assert {m["owned_by"] for m in models["data"]} == {"llmgw-sim"}
    assert all(isinstance(m["created"], int) for m in models["data"])


def test_chat_non_streaming_usage_and_determinism(sims: Sims) -> None:
    with httpx.Client(base_url=sims.main.url, timeout=10) as client:
        first = client.post("/v1/chat/completions", json=CHAT).json()
        second = client.post("/v1/chat/completions", json=CHAT).json()
        limited = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3}).json()
    assert first["object"] == "chat.completion"
    assert first["choices"][0]["finish_reason"] == "stop"
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]
    # 6 words of the prompt and "." plus 4 tokens of chat overhead for the one message.
    assert first["usage"] == {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}
    assert limited["usage"]["completion_tokens"] == 3
    assert limited["choices"][0]["finish_reason"] == "length"


def test_chat_streaming_with_and_without_include_usage(sims: Sims) -> None:
    body = {**CHAT, "model": "sim-b", "stream": True, "max_tokens": 4}
    with httpx.stream("POST", sims.main.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        plain = _events(resp.read().decode())
    assert plain[-1] == "[DONE]"
    chunks = plain[:-1]
    assert len(chunks) == 4
    assert all(isinstance(c, dict) and "usage" not in c for c in chunks)

    body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", sims.main.url + "/v1/chat/completions", json=body) as resp:
        events = _events(resp.read().decode())
    *tokens, usage_chunk, done = events
    assert done == "[DONE]"
    assert isinstance(usage_chunk, dict)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    first = tokens[0]
    assert isinstance(first, dict)
    assert first["object"] == "chat.completion.chunk"
    assert first["model"] == "sim-b"
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert [t["choices"][0]["finish_reason"] for t in tokens if isinstance(t, dict)] == [
        None,
        None,
        None,
        "length",
    ]
    last = httpx.get(sims.main.url + "/sim/stats").json()["last_request"]
    assert last["body"]["stream_options"] == {"include_usage": True}


def test_completions_and_embeddings(sims: Sims) -> None:
    with httpx.Client(base_url=sims.main.url, timeout=10) as client:
        body = {"model": "sim-a", "prompt": "The capital of France is", "max_tokens": 2}
        done = client.post("/v1/completions", json=body).json()
        assert done["object"] == "text_completion"
        assert done["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            events = _events(resp.read().decode())
        texts = [e["choices"][0]["text"] for e in events if isinstance(e, dict)]
        assert "".join(texts) == done["choices"][0]["text"]

        emb = client.post("/v1/embeddings", json={"model": "sim-a", "input": ["a b", "c"]}).json()
        assert emb["object"] == "list"
        assert emb["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
        vector = emb["data"][0]["embedding"]
        assert len(vector) == 64
        assert sum(v * v for v in vector) == pytest.approx(1.0)
        b64 = client.post(
            "/v1/embeddings", json={"input": "a b", "encoding_format": "base64"}
        ).json()
        decoded = struct.unpack("<64f", base64.b64decode(b64["data"][0]["embedding"]))
        assert decoded == pytest.approx(vector, rel=1e-6)


def test_errors_are_openai_shaped(sims: Sims) -> None:
    with httpx.Client(base_url=sims.main.url, timeout=10) as client:
        unknown = client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
        _assert_openai_error(unknown, 404, "model_not_found")
        bad_json = client.post("/v1/chat/completions", content=b"{oops")
        _assert_openai_error(bad_json, 400, "invalid_request")
        missing = client.post("/v1/completions", json={"model": "sim-a"})
        _assert_openai_error(missing, 400, "invalid_request")
        _assert_openai_error(client.get("/v2/anything"), 404, "not_found")
        _assert_openai_error(client.get("/v1/embeddings"), 405, "method_not_allowed")


def test_metrics_have_vllm_names_per_model(sims: Sims) -> None:
    prompt = {"model": "sim-b", "prompt": "one two three four five six seven eight"}
    httpx.post(sims.main.url + "/v1/completions", json=prompt)
    httpx.post(sims.main.url + "/v1/completions", json=prompt)
    resp = httpx.get(sims.main.url + "/metrics")
    assert resp.headers["content-type"].startswith("text/plain")
    lines = resp.text.splitlines()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
    ):
        for model in ("sim-a", "sim-b"):
            assert any(
                line.startswith(f'{name}{{engine="0",model_name="{model}"}} ') for line in lines
            ), name
    hits = next(
        line
        for line in lines
        if line.startswith('vllm:prefix_cache_hits_total{engine="0",model_name="sim-b"}')
    )
    assert float(hits.split()[-1]) >= 8.0  # the second prompt hit both 4-token blocks


def test_runtime_faults(sims: Sims) -> None:
    url = sims.main.url
    try:
        current = httpx.post(url + "/sim/faults", json={"error_rate": 1.0, "error_status": 503})
        assert current.json()["error_rate"] == 1.0
        failed = httpx.post(url + "/v1/chat/completions", json=CHAT)
        _assert_openai_error(failed, 503, "injected_fault")
        rejected = httpx.post(url + "/sim/faults", json={"crash_after": "never"})
        _assert_openai_error(rejected, 400, "invalid_request")
        assert "crash_after" in rejected.json()["error"]["message"]
    finally:
        httpx.post(url + "/sim/faults", json={"error_rate": 0.0, "error_status": 500})
    assert httpx.post(url + "/v1/chat/completions", json=CHAT).status_code == 200


def test_client_disconnects_are_counted_and_free_the_slot(sims: Sims) -> None:
    url = sims.main.url

    def stats() -> dict[str, int]:
        data: dict[str, int] = httpx.get(url + "/sim/stats").json()
        return data

    before = stats()["requests_cancelled"]
    body = {**CHAT, "stream": True, "max_tokens": 100_000}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        chunks = resp.iter_bytes()  # kept: dropping the iterator would close the stream
        assert next(chunks).startswith(b"data: ")
        assert stats()["running"] == 1
    _wait_for(lambda: stats()["requests_cancelled"] == before + 1, "the streaming cancel")
    assert stats()["running"] == 0

    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 100_000}, timeout=0.3)
    _wait_for(lambda: stats()["requests_cancelled"] == before + 2, "the non-streaming cancel")
    assert stats()["running"] == 0


def test_crash_after_exits_on_the_next_request(sims: Sims) -> None:
    url = sims.crashing.url
    for _ in range(2):
        assert httpx.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
    with pytest.raises(httpx.TransportError):
        httpx.post(url + "/v1/chat/completions", json=CHAT)
    assert sims.crashing.proc.popen.wait(10) == 1


def test_loading_sim_becomes_healthy_then_fails_on_purpose(sims: Sims) -> None:
    loading = sims.loading
    loading.proc.wait_http(loading.url + "/health", timeout=float(LOAD_TIME) + 10)
    failed = httpx.post(loading.url + "/v1/chat/completions", json=CHAT)
    _assert_openai_error(failed, 502, "injected_fault")
    assert loading.stats()["requests_failed"] >= 1
