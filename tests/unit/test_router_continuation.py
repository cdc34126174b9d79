"""Continuation in-process: a real `Proxy`, `Continuation` and `Upstream` against small
loopback engines that count (` w1 w2 ...`, continuing from the final assistant message).

Here the control plane's word that a node stopped answering (`EndpointPool.abandon`)
moves a stream that began on it; the other causes (a broken connection, the idle
deadline) run through real processes in tests/integration/test_continuation.py.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from llmgw.config import RouterConfig
from llmgw.config.continuation import ContinuationConfig
from llmgw.metrics import RouterMetrics
from llmgw.router.balancer import Balancer
from llmgw.router.continuation import Continuation
from llmgw.router.endpoints import EjectionPolicy, EndpointPool, EndpointSpec
from llmgw.router.proxy import Proxy
from llmgw.router.requests import CHAT, parse_request
from llmgw.router.upstream import Upstream

Message = MutableMapping[str, Any]


class CountingEngine:
    """Streams ` w(N+1) ...` after the `wN` a continued final message ends with; with
    `freeze_after` it stops sending after that many tokens and keeps the connection
    open, as a frozen node does."""

    def __init__(self, *, freeze_after: int | None = None) -> None:
        self.freeze_after = freeze_after
        self.bodies: list[dict[str, Any]] = []
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> CountingEngine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            body = orjson.loads(await reader.readexactly(length))
            self.bodies.append(body)
            after = 0
            if body.get("continue_final_message"):
                found = re.findall(r"w(\d+)", body["messages"][-1]["content"])
                after = int(found[-1]) if found else 0
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            count = body["max_tokens"]
            for index in range(count):
                if self.freeze_after is not None and index >= self.freeze_after:
                    # Frozen: nothing more, until the router gives up on the connection.
                    await reader.read()
                    return
                delta = {"content": f" w{after + index + 1}"}
                if index == 0:
                    delta["role"] = "assistant"
                chunk = {
                    "id": f"chatcmpl-{id(body)}",
                    "object": "chat.completion.chunk",
                    "created": len(self.bodies),
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "delta": delta,
                            "finish_reason": "length" if index == count - 1 else None,
                        }
                    ],
                }
                self._chunk(writer, b"data: " + orjson.dumps(chunk) + b"\n\n")
                await writer.drain()
                await asyncio.sleep(0)
            usage = {"prompt_tokens": 5 + after, "completion_tokens": count}
            self._chunk(writer, b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
            self._chunk(writer, b"data: [DONE]\n\n")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))


class Client:
    def __init__(self, tokens_wanted: int) -> None:
        self.messages: list[Message] = []
        self.tokens_wanted = tokens_wanted
        self.has_tokens = asyncio.Event()

    async def send(self, message: Message) -> None:
        self.messages.append(message)
        if self.body.count(b'"content":') >= self.tokens_wanted:
            self.has_tokens.set()

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    client = Upstream(connect_timeout=1.0, idle_timeout=30.0)
    yield client
    await client.close()


async def test_a_stream_on_a_node_in_doubt_is_continued_on_another_replica(
    upstream: Upstream,
) -> None:
    pool = EndpointPool(policy=EjectionPolicy(3, 1.0, 30.0), clock=time.monotonic)
    metrics = RouterMetrics(registry=CollectorRegistry())
    balancer = Balancer(clock=time.monotonic, rng=random.Random(0))
    continuation = Continuation(
        pool=pool,
        balancer=balancer,
        upstream=upstream,
        metrics=metrics,
        config=ContinuationConfig(),
        clock=time.monotonic,
        first_byte=60.0,
        idle=600.0,
        keepalive=0.05,
        wait_limit=60.0,
    )
    proxy = Proxy(
        pool=pool,
        balancer=balancer,
        upstream=upstream,
        metrics=metrics,
        # An idle deadline far beyond the test's: only the abandon can move the stream.
        config=RouterConfig.model_validate({"timeouts": {"idle": 600}}),
        clock=time.monotonic,
        continuation=continuation,
    )
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 10,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = parse_request(CHAT, orjson.dumps(body))
    client = Client(tokens_wanted=3)
    async with CountingEngine(freeze_after=3) as frozen, CountingEngine() as healthy:
        pool.set_model_endpoints("m", [EndpointSpec("frozen", frozen.url, ("m",), engine="sim")])
        serving = asyncio.create_task(proxy.handle(req, b"r1", client.send, time.monotonic(), []))
        await asyncio.wait_for(client.has_tokens.wait(), 60)
        pool.set_model_endpoints(
            "m",
            [
                EndpointSpec("frozen", frozen.url, ("m",), engine="sim"),
                EndpointSpec("healthy", healthy.url, ("m",), engine="sim"),
            ],
        )
        assert pool.abandon(["frozen"]) == 1
        outcome = await asyncio.wait_for(serving, 60)
    events = [e for e in client.body.split(b"\n\n") if e.startswith(b"data: {")]
    chunks = [orjson.loads(e[len(b"data: ") :]) for e in events]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text.split() == [f"w{n}" for n in range(1, 11)]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert sum("role" in c["choices"][0]["delta"] for c in chunks if c["choices"]) == 1
    [usage] = [c["usage"] for c in chunks if not c["choices"]]
    assert usage["completion_tokens"] == 10
    # The first attempt's prompt (5) estimated from the continuation's (5 + 3) less 3.
    assert usage["prompt_tokens"] == 5 + 8
    assert client.body.endswith(b"data: [DONE]\n\n")
    assert (outcome.endpoint, outcome.continued, outcome.completion_tokens) == ("healthy", 1, 10)
    [continued] = healthy.bodies
    assert continued["messages"][-1] == {"role": "assistant", "content": " w1 w2 w3"}
    assert continued["max_tokens"] == 7
    assert (continued["continue_final_message"], continued["add_generation_prompt"]) == (
        True,
        False,
    )
    sample = metrics.registry.get_sample_value(
        "llmgw_continuations_total", {"model": "m", "cause": "abandoned"}
    )
    assert sample == 1.0


@pytest.mark.parametrize(
    ("path", "extra", "expected"),
    [
        (CHAT, {}, True),
        (CHAT, {"n": 1}, True),
        (CHAT, {"n": 2}, False),
        (CHAT, {"logprobs": True}, False),
        (CHAT, {"top_logprobs": 2, "logprobs": True}, False),
        (CHAT, {"echo": True}, False),
        (CHAT, {"stream": False}, False),
        (CHAT, {"model": "quiet"}, False),
        ("/v1/completions", {"prompt": "Count:"}, True),
        ("/v1/completions", {"prompt": ["Count:"]}, True),
        ("/v1/completions", {"prompt": [1, 2, 3]}, False),
        ("/v1/completions", {"prompt": "Count:", "suffix": "!"}, False),
        ("/v1/completions", {"prompt": "Count:", "logprobs": 2}, False),
    ],
)
async def test_which_requests_may_be_continued(
    upstream: Upstream, path: str, extra: dict[str, Any], expected: bool
) -> None:
    pool = EndpointPool(policy=EjectionPolicy(3, 1.0, 30.0), clock=time.monotonic)
    continuation = Continuation(
        pool=pool,
        balancer=Balancer(clock=time.monotonic, rng=random.Random(0)),
        upstream=upstream,
        metrics=RouterMetrics(registry=CollectorRegistry()),
        config=ContinuationConfig(models={"quiet": False}),
        clock=time.monotonic,
        first_byte=60.0,
        idle=60.0,
        keepalive=1.0,
        wait_limit=60.0,
    )
    body: dict[str, Any] = {"model": "m", "stream": True}
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": "count"}]
    body.update(extra)
    assert continuation.continuable(parse_request(path, orjson.dumps(body))) is expected
