"""Stalled and numerous clients against a real `llmgw server`, with raw sockets.

One server for the module, with short limits from its config file
(`server: {header_timeout: 1, body_timeout: 1, max_connections: 4}`) so each
attack ends quickly. Every test tries what an attacker would: half a request
line, headers that keep coming but never end, a body that stops, more
connections than allowed; on the API, admin and metrics listeners. Nothing
asserts a duration: each test waits for the server to act (a closed socket, an
answer), and the cut counters in /metrics say why it acted.
"""

from __future__ import annotations

import json
import re
import select
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import httpx
import pytest
from procs import Server, Sim, free_port, wait_for

LIMITS = "server: {header_timeout: 1, body_timeout: 1, max_connections: 4}\n"
# The longest any single socket read may wait: far beyond every limit above, so
# a server that never acts fails the test here instead of hanging it.
READ_SECONDS = 60.0


@dataclass
class Gateway:
    server: Server
    sim: Sim
    metrics_port: int

    def address(self, listener: str) -> tuple[str, int]:
        port = {
            "API": self.server.port,
            "admin": self.server.admin_port,
            "metrics": self.metrics_port,
        }[listener]
        return ("127.0.0.1", port)

    def cut(self, listener: str, reason: str) -> float:
        text = httpx.get(self.server.admin + "/metrics", timeout=10).text
        pattern = rf'^llmgw_http_connections_cut_total\{{listener="{listener}",reason="{reason}"\}} (\S+)$'
        found = re.search(pattern, text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    config = tmp_path_factory.mktemp("stalled") / "llmgw.yaml"
    config.write_text(LIMITS)
    # Tokens 50 ms apart: a 60-token stream outlasts every limit above.
    sim = Sim("--itl", "0.05", "--itl-per-running", "0", model="m")
    metrics_port = free_port()
    server = Server(
        "--config", str(config), "--endpoint", f"s={sim.url}=m",
        "--metrics-listen", f"127.0.0.1:{metrics_port}",
    )  # fmt: skip
    try:
        yield Gateway(server, sim, metrics_port)
    finally:
        server.proc.stop()
        sim.proc.stop()


def connect(gw: Gateway, listener: str = "API") -> socket.socket:
    sock = socket.create_connection(gw.address(listener), timeout=READ_SECONDS)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (readable, and the read says end of stream)."""
    readable, _, _ = select.select([sock], [], [], 0.05)
    if not readable:
        return False
    try:
        return sock.recv(65536, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


GET_HEALTH = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def keep_alive_get(sock: socket.socket) -> int:
    """Send GET /healthz on a kept-alive connection and read one whole answer."""
    sock.sendall(GET_HEALTH)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed a kept-alive connection"
        data += chunk
    status, headers, body = response(data)
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return status


@pytest.mark.parametrize("listener", ["API", "admin", "metrics"])
def test_half_a_request_line_is_closed_on_every_listener(gw: Gateway, listener: str) -> None:
    before = gw.cut(listener, "header_timeout")
    with connect(gw, listener) as sock:
        sock.sendall(b"GET /v1/mod")
        # No answer: nothing was understood to answer to. The server just closes.
        assert read_all(sock) == b""
    assert gw.cut(listener, "header_timeout") == before + 1


def test_a_connection_that_never_sends_a_byte_is_closed(gw: Gateway) -> None:
    with connect(gw) as sock:
        assert read_all(sock) == b""


def test_headers_that_keep_coming_but_never_end_are_cut(gw: Gateway) -> None:
    # Slowloris: a new header line every 50 ms keeps the connection busy, but the
    # headers as a whole must be in within header_timeout.
    before = gw.cut("API", "header_timeout")
    with connect(gw) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for line in range(2000):
            if closed_by_server(sock):
                break
            try:
                sock.sendall(f"X-Drip-{line}: {'a' * 10}\r\n".encode())
            except (BrokenPipeError, ConnectionResetError):
                break
        else:
            pytest.fail("the server kept a connection whose headers never ended")
    assert gw.cut("API", "header_timeout") > before


def test_a_body_that_stops_midway_gets_408_and_is_closed(gw: Gateway) -> None:
    before = gw.cut("API", "body_timeout")
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 500}]})
    with connect(gw) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:100].encode()
        )
        status, headers, answer = response(read_all(sock))
    assert status == 408
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    error = json.loads(answer)["error"]
    assert error["code"] == "request_timeout"
    assert error["type"] == "invalid_request_error"
    assert "server.body_timeout" in error["message"]
    assert gw.cut("API", "body_timeout") == before + 1


def test_a_slow_body_that_keeps_arriving_is_served(gw: Gateway) -> None:
    # Gaps far below body_timeout, the whole body taking longer than it: the
    # timeout is for a stall, not for the body as a whole.
    body = json.dumps(
        {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "y" * 300}]}
    ).encode()
    with connect(gw) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\n" + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        pieces = [body[i : i + 20] for i in range(0, len(body), 20)]
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.1)
        status, _, answer = response(read_all(sock))
    assert status == 200, answer
    assert json.loads(answer)["choices"][0]["message"]["content"]


def test_idle_keep_alive_and_long_streams_are_not_cut(gw: Gateway) -> None:
    with ExitStack() as stack:
        idle = stack.enter_context(connect(gw))
        assert keep_alive_get(idle) == 200
        stream = stack.enter_context(
            httpx.stream(
                "POST",
                gw.server.url + "/v1/chat/completions",
                json={"model": "m", "max_tokens": 60, "stream": True,
                      "messages": [{"role": "user", "content": "tell me"}]},
                timeout=READ_SECONDS,
            )
        )  # fmt: skip
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        # A connection opened now is cut once header_timeout has passed: by then
        # the kept-alive one has idled, and the stream run, longer than the limits.
        with connect(gw) as probe:
            probe.sendall(b"GET /")
            assert read_all(probe) == b""
        rest = list(lines)
        assert rest[-1] == "data: [DONE]" or "data: [DONE]" in rest
        assert stream.status_code == 200
        assert keep_alive_get(idle) == 200


def test_connections_beyond_the_cap_get_503_until_one_closes(gw: Gateway) -> None:
    before = gw.cut("API", "over_limit")
    with ExitStack() as stack:
        held = []
        for _ in range(4):
            sock = stack.enter_context(connect(gw))
            assert keep_alive_get(sock) == 200
            held.append(sock)
        with connect(gw) as extra:
            extra.sendall(GET_HEALTH)
            status, headers, body = response(read_all(extra))
        assert status == 503
        assert headers["retry-after"] == "1"
        assert headers["connection"] == "close"
        error = json.loads(body)["error"]
        assert error["code"] == "too_many_connections"
        assert "server.max_connections" in error["message"]
        # Admitted connections keep being served while the listener is full.
        assert keep_alive_get(held[0]) == 200
        # The admin listener counts its own connections.
        assert httpx.get(gw.server.admin + "/healthz", timeout=10).status_code == 200
        held.pop().close()

        def admitted_again() -> bool:
            with connect(gw) as sock:
                sock.sendall(
                    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                )
                return response(read_all(sock))[0] == 200

        wait_for(admitted_again, "a connection to be admitted once one closed", within=30)
    assert gw.cut("API", "over_limit") > before
