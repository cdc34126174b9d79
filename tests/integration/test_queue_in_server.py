"""The router's queue in a real `llmgw server` in front of a real `llmgw sim`.

One place per replica (`router.max_in_flight: 1`): a long stream holds it, and
what a client then sees is checked: a 429 with Retry-After when its wait budget
runs out, SSE keep-alive comments while a stream waits, the answer once the
place is free, a 400 naming a bad queue header, and the queue's metrics.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from procs import Server, Sim

from llmgw.cli.status import queue_lines

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "Tell me about the sea"}]}


def _config(text: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(text)
        return handle.name


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Sim, Server]]:
    # About 0.1 s a token: a 400-token stream holds its place for as long as a test needs.
    sim = Sim("--itl", "0.1", "--itl-per-running", "0", model="m1")
    config = _config(
        "router: {max_in_flight: 1, queue: {max_wait: 60, recheck: 0.2}}\n"
        "control: {activation_keepalive: 0.2}\n"
    )
    server = Server("--endpoint", f"s={sim.url}=m1", "--config", config)
    yield sim, server
    server.proc.stop()
    sim.proc.stop()


def _in_flight(server: Server) -> int:
    return sum(int(str(e["in_flight"])) for e in server.endpoints())


class Holder:
    """A long stream that holds the replica's one place until `release`."""

    def __init__(self, server: Server) -> None:
        self._stop = threading.Event()
        self.first_bytes = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server.url,), daemon=True)
        self._thread.start()

    def _run(self, url: str) -> None:
        body = {**CHAT, "stream": True, "max_tokens": 400}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as resp:
            for _ in resp.iter_bytes():
                self.first_bytes.set()
                if self._stop.is_set():
                    return  # closing the connection cancels the request in the router

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def test_a_request_whose_wait_budget_runs_out_gets_429_with_retry_after(
    fleet: tuple[Sim, Server],
) -> None:
    _, server = fleet
    holder = Holder(server)
    try:
        _wait_for(lambda: _in_flight(server) == 1, "the long stream to hold the replica")
        resp = httpx.post(
            server.url + "/v1/chat/completions",
            json=CHAT,
            headers={"x-llmgw-max-queue-wait": "0.3"},
            timeout=30,
        )
        assert resp.status_code == 429, resp.text
        assert resp.headers["retry-after"] == "5"
        error = resp.json()["error"]
        assert error["code"] == "queue_wait_expired"
        assert error["type"] == "rate_limit_error"
        assert "wait budget of 0.3 s (1 requests waiting in the queue)" in error["message"]
        metrics = server.metrics()
        assert (
            'llmgw_queue_refused_total{class="default",model="m1",reason="wait_expired"} 1.0'
            in metrics
        )
    finally:
        holder.release()
    _wait_for(lambda: _in_flight(server) == 0, "the long stream to end")


def test_a_waiting_stream_gets_keepalives_then_its_answer(fleet: tuple[Sim, Server]) -> None:
    _, server = fleet
    holder = Holder(server)
    received: list[bytes] = []
    status: list[int] = []

    def waiting_stream() -> None:
        body = {**CHAT, "stream": True, "max_tokens": 3}
        with httpx.stream(
            "POST", server.url + "/v1/chat/completions", json=body, timeout=60
        ) as resp:
            status.append(resp.status_code)
            for chunk in resp.iter_bytes():
                received.append(chunk)

    try:
        _wait_for(lambda: _in_flight(server) == 1, "the long stream to hold the replica")
        waiter = threading.Thread(target=waiting_stream, daemon=True)
        waiter.start()
        _wait_for(
            lambda: b": llmgw queued for model m1 (1 waiting)" in b"".join(received),
            "a keep-alive comment while the stream waits",
        )
        assert status == [200]
        assert b"data: " not in b"".join(received)
        assert 'llmgw_queue_depth{class="default",model="m1"} 1.0' in server.metrics()
        (state,) = httpx.get(server.admin + "/admin/api/queue", timeout=10).json()["models"]
        assert state["model"] == "m1"
        assert state["saturated"] is True
        assert state["waiting"] == 1
        assert state["classes"]["default"]["waiting"] == 1
        assert state["replicas"][0]["max_in_flight"] == 1
        lines = queue_lines([state])
        assert lines[0].startswith("queue m1: saturated; waiting: default 1 (oldest ")
    finally:
        holder.release()
    waiter.join(timeout=60)
    text = b"".join(received).decode()
    assert "data: [DONE]" in text
    assert "chat.completion.chunk" in text
    assert 'llmgw_queue_wait_seconds_count{class="default",model="m1"} 1.0' in server.metrics()
    _wait_for(lambda: _in_flight(server) == 0, "every request to end")


def test_bad_queue_headers_are_refused_naming_the_header(fleet: tuple[Sim, Server]) -> None:
    _, server = fleet
    for header, value in (("x-llmgw-priority", "urgent"), ("x-llmgw-max-queue-wait", "soon")):
        resp = httpx.post(
            server.url + "/v1/chat/completions", json=CHAT, headers={header: value}, timeout=30
        )
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["param"] == header
        assert error["type"] == "invalid_request_error"
        assert repr(value) in error["message"]
    # Lowering is fine, and an unsaturated model answers at once.
    resp = httpx.post(
        server.url + "/v1/chat/completions",
        json={**CHAT, "max_tokens": 2},
        headers={"x-llmgw-priority": "batch"},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
