"""Every error a client can get from the gateway: status, OpenAI body, headers."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from procs import Server, Sim, free_port

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / f"cfg-{time.monotonic_ns()}.yaml"
    path.write_text(text)
    return str(path)


def assert_openai_error(
    resp: httpx.Response, status: int, code: str, *, param: str | None = None
) -> str:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert "x-request-id" in resp.headers
    assert "x-llmgw-replica" in resp.headers
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    message: str = error["message"]
    return message


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sim, Server]]:
    sim = Sim("--zero-delay", model="m1")
    cfg = tmp_path_factory.mktemp("cfg") / "llmgw.yaml"
    cfg.write_text("router: {max_body_bytes: 4096}\n")
    server = Server("--endpoint", f"s={sim.url}=m1", "--config", str(cfg))
    yield sim, server
    server.proc.stop()
    sim.proc.stop()


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (b"{not json", "invalid_json", None),
        (b'["a list"]', "invalid_request", None),
        (b'{"messages": []}', "invalid_request", "model"),
        (b'{"model": 7, "messages": []}', "invalid_request", "model"),
        (b'{"model": "m1", "messages": [], "max_tokens": "ten"}', "invalid_request", "max_tokens"),
        (b'{"model": "m1", "messages": [], "stream": "yes"}', "invalid_request", "stream"),
    ],
)
def test_bad_requests_are_400(
    gateway: tuple[Sim, Server], body: bytes, code: str, param: str | None
) -> None:
    _, server = gateway
    resp = httpx.post(server.url + "/v1/chat/completions", content=body)
    assert_openai_error(resp, 400, code, param=param)


def test_unknown_model_is_404(gateway: tuple[Sim, Server]) -> None:
    _, server = gateway
    resp = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "model": "nope"})
    message = assert_openai_error(resp, 404, "model_not_found", param="model")
    assert "'nope'" in message
    assert_openai_error(httpx.get(server.url + "/v1/models/nope"), 404, "model_not_found")


def test_body_over_the_limit_is_413(gateway: tuple[Sim, Server]) -> None:
    sim, server = gateway
    before = sim.stats()["requests_total"]
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    message = assert_openai_error(
        httpx.post(server.url + "/v1/chat/completions", json=big), 413, "request_too_large"
    )
    assert "4096" in message

    # Sent chunked, without a Content-Length: still refused.
    def chunks() -> Iterator[bytes]:
        data = orjson.dumps(big)
        for i in range(0, len(data), 1000):
            yield data[i : i + 1000]

    resp = httpx.post(server.url + "/v1/chat/completions", content=chunks())
    assert_openai_error(resp, 413, "request_too_large")
    assert sim.stats()["requests_total"] == before


def test_unknown_route_and_wrong_method(gateway: tuple[Sim, Server]) -> None:
    _, server = gateway
    assert_openai_error(httpx.get(server.url + "/v1/nothing"), 404, "not_found")
    assert_openai_error(httpx.post(server.url + "/"), 404, "not_found")
    resp = httpx.get(server.url + "/v1/chat/completions")
    assert_openai_error(resp, 405, "method_not_allowed")
    assert resp.headers["allow"] == "POST"
    assert_openai_error(httpx.delete(server.url + "/v1/models"), 405, "method_not_allowed")


def test_engine_errors_are_relayed_with_their_status(gateway: tuple[Sim, Server]) -> None:
    sim, server = gateway
    sim.faults(error_rate=1.0, error_status=500)
    try:
        resp = httpx.post(server.url + "/v1/chat/completions", json=CHAT)
        assert resp.status_code == 500
        assert resp.headers["x-llmgw-replica"] == "s"
        assert resp.json()["error"]["message"]
    finally:
        sim.faults(error_rate=0.0)


def test_engine_unreachable_is_502(tmp_path: Path) -> None:
    sim = Sim("--zero-delay", model="m1")
    server = Server(
        "--endpoint",
        f"s={sim.url}=m1",
        "--config",
        config(tmp_path, "router: {health: {interval: 3600}}\n"),
    )
    try:
        sim.proc.signal(signal.SIGKILL)
        sim.proc.popen.wait(5)
        message = assert_openai_error(
            httpx.post(server.url + "/v1/chat/completions", json=CHAT), 502, "engine_unreachable"
        )
        assert "'s'" in message
    finally:
        server.proc.stop()
        sim.proc.stop()


def test_no_healthy_replica_is_503_with_retry_after(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    server = Server(
        "--endpoint",
        f"gone={dead}=m1",
        "--config",
        config(tmp_path, "router: {retry_after: 7, health: {interval: 0.2}}\n"),
        wait_ready=False,
    )
    try:
        deadline = time.monotonic() + 10
        while server.endpoints()[0]["healthy"] and time.monotonic() < deadline:
            time.sleep(0.05)
        resp = httpx.post(server.url + "/v1/chat/completions", json=CHAT)
        message = assert_openai_error(resp, 503, "no_healthy_replica")
        assert resp.headers["retry-after"] == "7"
        assert "m1" in message
        assert httpx.get(server.admin + "/readyz").status_code == 503
        assert "probe" in (server.endpoints()[0]["last_error"] or "")
    finally:
        server.proc.stop()


def test_first_byte_deadline(tmp_path: Path) -> None:
    sim = Sim("--zero-delay", "--slow-start", "5", model="m1")
    server = Server(
        "--endpoint",
        f"s={sim.url}=m1",
        "--config",
        config(tmp_path, "router: {timeouts: {first_byte: 0.3}}\n"),
    )
    try:
        started = time.monotonic()
        resp = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        message = assert_openai_error(resp, 504, "deadline_exceeded")
        assert "first byte deadline of 0.3s" in message
        assert time.monotonic() - started < 4  # it did not wait for the engine
    finally:
        server.proc.stop()
        sim.proc.stop()


def test_idle_deadline_mid_stream(tmp_path: Path) -> None:
    sim = Sim("--zero-delay", "--stall-after-tokens", "3", model="m1")
    server = Server(
        "--endpoint",
        f"s={sim.url}=m1",
        "--config",
        config(tmp_path, "router: {timeouts: {idle: 0.3}}\n"),
    )
    try:
        body = {**CHAT, "stream": True, "max_tokens": 10}
        with httpx.stream(
            "POST", server.url + "/v1/chat/completions", json=body, timeout=10
        ) as resp:
            assert resp.status_code == 200
            text = resp.read().decode()
        events = [e for e in text.split("\n\n") if e]
        assert len([e for e in events if e.startswith("data: {")]) == 3
        assert events[-1].startswith("event: error\ndata: ")
        error = orjson.loads(events[-1].split("data: ", 1)[1])["error"]
        assert error["code"] == "deadline_exceeded"
        assert "idle deadline of 0.3s" in error["message"]
        # The stalled engine was told: the gateway closed the connection.
        deadline = time.monotonic() + 5
        while sim.stats()["requests_cancelled"] != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sim.stats()["requests_cancelled"] == 1
    finally:
        server.proc.stop()
        sim.proc.stop()


def test_total_deadline(tmp_path: Path) -> None:
    sim = Sim("--itl", "0.05", "--itl-per-running", "0", model="m1")
    server = Server(
        "--endpoint",
        f"s={sim.url}=m1",
        "--config",
        config(tmp_path, "router: {timeouts: {total: 0.5}}\n"),
    )
    try:
        body = {**CHAT, "stream": True, "max_tokens": 100}
        with httpx.stream(
            "POST", server.url + "/v1/chat/completions", json=body, timeout=10
        ) as resp:
            text = resp.read().decode()
        error = orjson.loads(text.rstrip().split("\n\n")[-1].split("data: ", 1)[1])["error"]
        assert "total deadline of 0.5s" in error["message"]
        resp = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 100})
        message = assert_openai_error(resp, 504, "deadline_exceeded")
        assert "total deadline of 0.5s" in message
    finally:
        server.proc.stop()
        sim.proc.stop()


def test_connect_deadline(tmp_path: Path) -> None:
    # A listener that never accepts, with its queue full: SYNs go unanswered.
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(0)
    port = blackhole.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.2)
    server = Server(
        "--endpoint",
        f"hole=http://127.0.0.1:{port}=m1",
        "--config",
        config(
            tmp_path,
            "router: {timeouts: {connect: 0.3}, attempts: 1, health: {interval: 3600, timeout: 0.1}}\n",
        ),
        wait_ready=False,
    )
    try:
        # The first probe fails (timeout) and marks it down; lift that for the request path.
        deadline = time.monotonic() + 5
        while server.endpoints()[0]["probe_ok"] and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        resp = httpx.post(server.url + "/v1/chat/completions", json=CHAT)
        assert resp.status_code == 503  # down after its failed probe, not hanging
        assert time.monotonic() - started < 2
    finally:
        server.proc.stop()
        for filler in fillers:
            filler.close()
        blackhole.close()
