"""The gateway in front of real `llmgw sim` processes: balancing, retries, relaying."""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import orjson
import pytest
from procs import Server, Sim

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "Tell me about the sea"}]}


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Sim, Sim, Server]]:
    a = Sim("--zero-delay", model="m1")
    b = Sim("--zero-delay", model="m1")
    server = Server("--endpoint", f"a={a.url}=m1", "--endpoint", f"b={b.url}=m1")
    yield a, b, server
    server.proc.stop()
    a.proc.stop()
    b.proc.stop()


def sse_events(text: str) -> list[str]:
    return [e for e in text.replace("\r\n", "\n").split("\n\n") if e.strip()]


def test_balancing_spreads_load(pair: tuple[Sim, Sim, Server]) -> None:
    a, b, server = pair
    before = (a.stats()["requests_total"], b.stats()["requests_total"])
    replicas: Counter[str] = Counter()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for i in range(40):
            # Different prompts: the same one would stay on the replica that caches it.
            messages = [{"role": "user", "content": f"Tell me about sea number {i}"}]
            body = {"model": "m1", "messages": messages, "max_tokens": 4}
            resp = client.post("/v1/chat/completions", json=body)
            assert resp.status_code == 200
            replicas[resp.headers["x-llmgw-replica"]] += 1
    assert set(replicas) == {"a", "b"}
    assert min(replicas.values()) >= 8
    after = (a.stats()["requests_total"], b.stats()["requests_total"])
    assert (after[0] - before[0], after[1] - before[1]) == (replicas["a"], replicas["b"])


def test_a_shared_prefix_stays_on_one_replica_and_the_route_is_explained(
    pair: tuple[Sim, Sim, Server],
) -> None:
    _, _, server = pair
    system = {"role": "system", "content": "You answer questions about the sea. " * 40}
    seen: set[str] = set()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for user in range(6):
            turn = {"role": "user", "content": f"question {user}"}
            body = {"model": "m1", "messages": [system, turn], "max_tokens": 2}
            resp = client.post("/v1/chat/completions", json=body)
            assert resp.status_code == 200
            assert "x-llmgw-route" not in resp.headers
            seen.add(resp.headers["x-llmgw-replica"])
        resp = client.post(
            "/v1/chat/completions",
            json={"model": "m1", "messages": [system], "max_tokens": 2, "stream": True},
            headers={"x-llmgw-route": "1"},
        )
    assert len(seen) == 1
    route = resp.headers["x-llmgw-route"]
    parts = dict(part.split("=") for part in route.split(" -> ")[0].split())
    assert route.endswith(f"-> {seen.pop()}")
    # The predicted time to first token in its parts, and the blocks the replica holds.
    assert set(parts) == {"ttft", "wait", "prefill", "delay", "cached"}
    held, total = (int(n) for n in parts["cached"].split("/"))
    # The system prompt's blocks were sent there before.
    assert held > total / 2
    # The router counts the hits it expected, and mirrors the engines' own counters.
    deadline = time.monotonic() + 30
    while "llmgw_engine_prefix_cache_hits_tokens{" not in (text := server.metrics()):
        assert time.monotonic() < deadline, "the engines' prefix-cache counters never appeared"
        time.sleep(0.2)
    assert 'llmgw_route_expected_hit_blocks_total{model="m1"}' in text


def test_non_streaming_usage_and_ids(pair: tuple[Sim, Sim, Server]) -> None:
    _, _, server = pair
    resp = httpx.post(
        server.url + "/v1/chat/completions",
        json={**CHAT, "max_tokens": 7},
        headers={"x-request-id": "req-123"},
    )
    body = resp.json()
    assert resp.status_code == 200
    assert resp.headers["x-request-id"] == "req-123"
    assert body["usage"]["completion_tokens"] == 7
    assert body["choices"][0]["message"]["content"]
    generated = httpx.post(server.url + "/v1/chat/completions", json=CHAT)
    assert len(generated.headers["x-request-id"]) >= 16


def test_request_id_is_forwarded_to_the_engine(pair: tuple[Sim, Sim, Server]) -> None:
    a, b, server = pair

    def engine_saw(request_id: str) -> tuple[str, str]:
        resp = httpx.post(
            server.url + "/v1/completions",
            json={"model": "m1", "prompt": "hello", "max_tokens": 2},
            headers={"x-request-id": request_id},
        )
        sim = a if resp.headers["x-llmgw-replica"] == "a" else b
        last = sim.stats()["last_request"]
        assert isinstance(last, dict)
        return resp.headers["x-request-id"], last["headers"]["x-request-id"]

    uuid_id = str(uuid.uuid4())
    assert engine_saw(uuid_id) == (uuid_id, uuid_id)
    # Engines such as llama.cpp's server refuse ids that are not UUIDs: the
    # client keeps its own id, the engine gets a fresh UUID.
    client_side, engine_side = engine_saw("trace-77")
    assert client_side == "trace-77"
    assert uuid.UUID(engine_side)


def test_stream_usage_chunk_is_requested_then_removed(pair: tuple[Sim, Sim, Server]) -> None:
    a, b, server = pair
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 5}
    ) as resp:
        text = resp.read().decode()
        replica = resp.headers["x-llmgw-replica"]
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(text)
    assert events[-1] == "data: [DONE]"
    chunks = [orjson.loads(e[len("data: ") :]) for e in events[:-1]]
    assert len(chunks) == 5
    assert all(c["choices"] for c in chunks)
    assert all("usage" not in c or c["usage"] is None for c in chunks)
    sim = a if replica == "a" else b
    forwarded = sim.stats()["last_request"]
    assert isinstance(forwarded, dict)
    assert forwarded["body"]["stream_options"] == {"include_usage": True}
    # The router still counted the tokens it removed from the client's view.
    metrics = server.metrics()
    assert f'llmgw_completion_tokens_total{{endpoint="{replica}",model="m1"}}' in metrics


def test_stream_usage_chunk_is_kept_when_asked(pair: tuple[Sim, Sim, Server]) -> None:
    _, _, server = pair
    body = {**CHAT, "stream": True, "max_tokens": 3, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as resp:
        events = sse_events(resp.read().decode())
    usage_chunk = orjson.loads(events[-2][len("data: ") :])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 3


def test_killed_endpoint_is_retried_elsewhere_and_client_never_notices() -> None:
    healthy = Sim("--zero-delay", model="m1")
    doomed = Sim("--zero-delay", "--crash-after", "0", model="m1")
    # A long probe interval: only the request path can find out the endpoint died.
    server = Server(
        "--endpoint",
        f"doomed={doomed.url}=m1",
        "--endpoint",
        f"ok={healthy.url}=m1",
        "--config",
        str(_write_config("router: {health: {interval: 3600}}\n")),
    )
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            for _ in range(30):
                resp = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})
                assert resp.status_code == 200, resp.text
                assert resp.headers["x-llmgw-replica"] == "ok"
                if doomed.proc.popen.poll() is not None:
                    break
            assert doomed.proc.popen.poll() is not None, "the crashing sim was never picked"
            # And once more after it is dead: connection refused, retried, unnoticed.
            for _ in range(10):
                assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert 'llmgw_retries_total{model="m1"}' in server.metrics()
    finally:
        server.proc.stop()
        healthy.proc.stop()
        doomed.proc.stop()


def test_engine_dying_after_first_byte_ends_stream_with_error_event() -> None:
    sim = Sim("--itl", "0.05", "--itl-per-running", "0", model="m1")
    server = Server("--endpoint", f"s={sim.url}=m1")
    try:
        body = {**CHAT, "stream": True, "max_tokens": 200}
        with httpx.stream(
            "POST", server.url + "/v1/chat/completions", json=body, timeout=10
        ) as resp:
            assert resp.status_code == 200
            received = b""
            stream = resp.iter_bytes()
            while b"\n\n" not in received:
                received += next(stream)
            sim.proc.signal(signal.SIGKILL)
            for chunk in stream:
                received += chunk
        events = sse_events(received.decode())
        assert events[0].startswith("data: {")
        last = events[-1]
        assert last.startswith("event: error\ndata: ")
        error = orjson.loads(last.split("data: ", 1)[1])["error"]
        assert error["code"] == "engine_unreachable"
        assert "mid-stream" in error["message"]
        assert "data: [DONE]" not in events
    finally:
        server.proc.stop()
        sim.proc.stop()


def test_client_disconnect_cancels_the_engine_work() -> None:
    sim = Sim("--itl", "0.05", "--itl-per-running", "0", model="m1")
    server = Server("--endpoint", f"s={sim.url}=m1")
    try:
        body = {**CHAT, "stream": True, "max_tokens": 500}
        with httpx.stream(
            "POST", server.url + "/v1/chat/completions", json=body, timeout=10
        ) as resp:
            next(resp.iter_bytes())
        # Leaving the block closes the connection mid-stream.
        _wait_for(lambda: sim.stats()["requests_cancelled"] == 1, "the sim to see the cancel")
        assert sim.stats()["running"] == 0
        # Non-streaming too: a client that gives up is not served in the void.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                server.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 500}, timeout=0.5
            )
        _wait_for(lambda: sim.stats()["requests_cancelled"] == 2, "the second cancel")
        assert 'llmgw_client_disconnects_total{model="m1"} 2.0' in server.metrics()
    finally:
        server.proc.stop()
        sim.proc.stop()


def test_admin_endpoints_and_metrics_listener(pair: tuple[Sim, Sim, Server]) -> None:
    _, _, server = pair
    endpoints = {e["id"]: e for e in server.endpoints()}
    assert set(endpoints) == {"a", "b"}
    assert endpoints["a"]["models"] == ["m1"]
    assert endpoints["a"]["healthy"] is True
    assert endpoints["a"]["in_flight"] == 0
    metrics = server.metrics()
    for name in (
        "llmgw_requests_total",
        "llmgw_request_duration_seconds_bucket",
        "llmgw_time_to_first_token_seconds_bucket",
        "llmgw_inter_token_seconds_bucket",
        "llmgw_prompt_tokens_total",
        "llmgw_completion_tokens_total",
        'llmgw_endpoint_in_flight{endpoint="a"}',
        'llmgw_endpoint_healthy{endpoint="a"} 1.0',
    ):
        assert name in metrics, name
    assert httpx.get(server.admin + "/healthz").json() == {"status": "ok"}
    assert httpx.get(server.admin + "/readyz").json()["status"] == "ready"
    missing = httpx.get(server.admin + "/admin/api/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_metrics_listener_serves_only_metrics() -> None:
    sim = Sim("--zero-delay", model="m1")
    from procs import free_port

    port = free_port()
    server = Server("--endpoint", f"s={sim.url}=m1", "--metrics-listen", f"127.0.0.1:{port}")
    try:
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics")
        assert metrics.status_code == 200
        assert "llmgw_endpoint_healthy" in metrics.text
        assert httpx.get(f"http://127.0.0.1:{port}/admin/api/endpoints").status_code == 404
    finally:
        server.proc.stop()
        sim.proc.stop()


def _write_config(text: str) -> str:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(text)
        return handle.name


def _wait_for(check: object, what: str, timeout: float = 10.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
