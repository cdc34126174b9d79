"""The proxy waits for a replica instead of failing when a control plane can start one.

A real `Proxy` and `Upstream` against small loopback engines; the activator is
the test's own (it plays the control plane: it publishes a replica when asked).
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from llmgw.config import RouterConfig
from llmgw.metrics import RouterMetrics
from llmgw.router.balancer import Balancer
from llmgw.router.endpoints import EjectionPolicy, EndpointPool, EndpointSpec
from llmgw.router.errors import EngineError, EngineUnreachable, ModelUnavailable
from llmgw.router.proxy import Proxy
from llmgw.router.requests import CHAT, parse_request
from llmgw.router.upstream import Upstream

Message = MutableMapping[str, Any]
SSE = (
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":'
    b'[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
    b"data: [DONE]\n\n"
)
JSON = (
    b'{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
)


class Engine:
    """A loopback engine that answers every request with `status` and a body."""

    def __init__(self, status: int = 200, *, hang: bool = False) -> None:
        self.status = status
        self.hang = hang
        self.received = asyncio.Event()
        self.requests = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Engine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = orjson.loads(await reader.readexactly(length))
                self.requests += 1
                self.received.set()
                if self.hang:
                    # A frozen engine: the connection stays open, nothing comes back.
                    await asyncio.Event().wait()
                if self.status != 200:
                    payload = b'{"error":{"message":"busy"}}'
                    kind = b"application/json"
                elif body.get("stream"):
                    payload, kind = SSE, b"text/event-stream"
                else:
                    payload, kind = JSON, b"application/json"
                writer.write(
                    b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                    % (self.status, kind, len(payload), payload)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def dead_url() -> str:
    """A loopback URL nobody listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class ControlPlane:
    """The test's activator: on `activate` it publishes `replacement` (once allowed)."""

    def __init__(self, pool: EndpointPool, replacement: EndpointSpec | None) -> None:
        self.pool = pool
        self.replacement = replacement
        self.activations = 0
        self.allowed = asyncio.Event()
        self.allowed.set()

    def knows(self, model: str) -> bool:
        return model == "m"

    def engines(self, model: str) -> tuple[str, ...]:
        return ()

    async def activate(self, model: str) -> None:
        self.activations += 1
        await self.allowed.wait()
        if self.replacement is None:
            await asyncio.Event().wait()  # never: the proxy's own deadline ends it
        self.pool.set_model_endpoints(model, [self.replacement])

    def request_started(self, model: str) -> None:
        pass

    def activity(self, model: str) -> str:
        return f"is starting model {model}"

    def request_finished(self, model: str) -> None:
        pass

    def saturated(self, model: str) -> None:
        pass


class Client:
    """What the proxy sent to the client."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.kept_alive = asyncio.Event()

    async def send(self, message: Message) -> None:
        self.messages.append(message)
        if message.get("body", b"").startswith(b": llmgw is starting model"):
            self.kept_alive.set()

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    client = Upstream(connect_timeout=1.0, idle_timeout=30.0)
    yield client
    await client.close()


def make_proxy(
    pool: EndpointPool,
    upstream: Upstream,
    activator: ControlPlane | None,
    *,
    activation_timeout: float = 60.0,
) -> Proxy:
    return Proxy(
        pool=pool,
        balancer=Balancer(clock=time.monotonic, rng=random.Random(0)),
        upstream=upstream,
        metrics=RouterMetrics(registry=CollectorRegistry()),
        config=RouterConfig(),
        clock=time.monotonic,
        activator=activator,
        activation_keepalive=0.05,
        activation_timeout=activation_timeout,
    )


def make_pool() -> EndpointPool:
    return EndpointPool(policy=EjectionPolicy(3, 1.0, 30.0), clock=time.monotonic)


def request(*, stream: bool) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return parse_request(CHAT, orjson.dumps(body))


async def serve(proxy: Proxy, req: Any, client: Client) -> Any:
    return await proxy.handle(req, b"req-1", client.send, time.monotonic(), [])


async def withdraw_once_failed(pool: EndpointPool, endpoint_id: str) -> None:
    """Play the control plane hearing that the engine died: take its replica out."""
    while True:
        endpoint = next((e for e in pool.endpoints() if e.id == endpoint_id), None)
        if endpoint is not None and endpoint.last_error is not None:
            pool.set_model_endpoints("m", [])
            return
        await asyncio.sleep(0.01)


async def test_a_dead_engine_with_no_other_replica_waits_for_the_replacement(
    upstream: Upstream,
) -> None:
    pool = make_pool()
    pool.set_model_endpoints("m", [EndpointSpec("dead-1", dead_url(), ("m",))])
    async with Engine() as engine:
        plane = ControlPlane(pool, EndpointSpec("new-1", engine.url, ("m",)))
        proxy = make_proxy(pool, upstream, plane)
        client = Client()

        withdraw = asyncio.create_task(withdraw_once_failed(pool, "dead-1"))
        outcome = await serve(proxy, request(stream=False), client)
        await withdraw

    assert outcome.status == 200
    assert outcome.endpoint == "new-1"
    assert client.status == 200
    assert client.headers[b"x-llmgw-replica"] == b"new-1"
    assert plane.activations == 1
    assert engine.requests == 1


async def test_a_stream_that_waited_names_its_replica_in_a_comment(upstream: Upstream) -> None:
    pool = make_pool()
    pool.set_model_endpoints("m", [EndpointSpec("dead-1", dead_url(), ("m",))])
    async with Engine() as engine:
        plane = ControlPlane(pool, EndpointSpec("new-1", engine.url, ("m",)))
        plane.allowed.clear()
        proxy = make_proxy(pool, upstream, plane)
        client = Client()

        async def release_after_a_keepalive() -> None:
            await client.kept_alive.wait()
            plane.allowed.set()

        helpers = asyncio.gather(withdraw_once_failed(pool, "dead-1"), release_after_a_keepalive())
        outcome = await serve(proxy, request(stream=True), client)
        await helpers

    assert outcome.status == 200
    # The headers went out while it waited: no replica header, a comment instead.
    starts = [m for m in client.messages if m["type"] == "http.response.start"]
    assert len(starts) == 1
    assert b"x-llmgw-replica" not in dict(starts[0]["headers"])
    lines = [line for line in client.body.split(b"\n") if line]
    assert lines[0] == b": llmgw is starting model m"
    replica = lines.index(b": llmgw replica new-1")
    assert lines[replica + 1].startswith(b"data: {")
    assert lines[-1] == b"data: [DONE]"


async def test_the_wait_ends_at_the_activation_timeout_naming_the_failing_replica(
    upstream: Upstream,
) -> None:
    pool = make_pool()
    pool.set_model_endpoints("m", [EndpointSpec("dead-1", dead_url(), ("m",))])
    plane = ControlPlane(pool, None)
    proxy = make_proxy(pool, upstream, plane, activation_timeout=0.5)

    with pytest.raises(ModelUnavailable) as caught:
        await serve(proxy, request(stream=False), Client())

    assert caught.value.code == "activation_timeout"
    assert caught.value.status == 503
    assert "model 'm' has no replica to serve the request after waiting 0.5 s" in (
        caught.value.message
    )
    assert "dead-1" in caught.value.message
    # The replica stayed in the pool: nothing to activate.
    assert plane.activations == 0


async def test_a_stream_that_waited_in_vain_ends_with_an_error_event(upstream: Upstream) -> None:
    pool = make_pool()
    pool.set_model_endpoints("m", [])
    plane = ControlPlane(pool, None)
    proxy = make_proxy(pool, upstream, plane, activation_timeout=0.5)
    client = Client()

    outcome = await serve(proxy, request(stream=True), client)

    assert outcome.status == 503
    assert client.status == 200
    events = client.body.split(b"\n\n")
    assert events[0] == b": llmgw is starting model m"
    error = [e for e in events if e.startswith(b"event: error")]
    assert len(error) == 1
    assert b'"code":"activation_timeout"' in error[0]
    assert plane.activations == 1


async def test_a_busy_engine_is_answered_not_waited_for(upstream: Upstream) -> None:
    pool = make_pool()
    async with Engine(status=503) as engine:
        pool.set_model_endpoints("m", [EndpointSpec("busy-1", engine.url, ("m",))])
        plane = ControlPlane(pool, None)
        proxy = make_proxy(pool, upstream, plane)

        with pytest.raises(EngineError) as caught:
            await serve(proxy, request(stream=False), Client())

    assert caught.value.status == 503
    assert plane.activations == 0


async def test_without_a_control_plane_a_dead_engine_is_a_502_at_once(upstream: Upstream) -> None:
    pool = make_pool()
    pool.set_model_endpoints("m", [EndpointSpec("dead-1", dead_url(), ("m",))])
    proxy = make_proxy(pool, upstream, None)

    with pytest.raises(EngineUnreachable) as caught:
        await serve(proxy, request(stream=False), Client())

    assert "dead-1" in caught.value.message


async def test_a_request_waiting_on_an_abandoned_engine_goes_to_the_replacement(
    upstream: Upstream,
) -> None:
    pool = make_pool()
    async with Engine(hang=True) as frozen, Engine() as engine:
        pool.set_model_endpoints("m", [EndpointSpec("frozen-1", frozen.url, ("m",))])
        plane = ControlPlane(pool, EndpointSpec("new-1", engine.url, ("m",)))
        proxy = make_proxy(pool, upstream, plane)
        client = Client()

        async def node_stops_answering() -> None:
            # The control plane: the node missed its heartbeats.
            await frozen.received.wait()
            assert pool.abandon(["frozen-1"]) == 1
            pool.set_model_endpoints("m", [])

        helper = asyncio.create_task(node_stops_answering())
        outcome = await serve(proxy, request(stream=False), client)
        await helper

    assert outcome.status == 200
    assert client.headers[b"x-llmgw-replica"] == b"new-1"
    assert plane.activations == 1
    # Nothing is left waiting, and abandoning again finds nothing.
    assert pool.abandon(["frozen-1"]) == 0


async def test_abandoning_a_wait_whose_deadline_already_fired_changes_nothing() -> None:
    pool = make_pool()
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout_at(loop.time()) as deadline:
            wait = pool.wait_first_byte("e-1", deadline)
            try:
                await asyncio.sleep(1)  # the deadline fires during this
            except asyncio.CancelledError:
                # The control plane abandons it just then: no error, not marked.
                assert pool.abandon(["e-1"]) == 0
                assert not wait.abandoned
                raise
            finally:
                pool.first_byte_done(wait)
    assert pool.abandon(["e-1"]) == 0
