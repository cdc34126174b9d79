"""Sharing the prefix index between router replicas through Redis, off the request path.

Every router learns where it sent each prompt (the prefix index); alone, a router
does not know what the others sent, so two routers may place the first request of
a conversation group on different replicas and compute its prefix twice. With a
Redis URL (`router.routing.redis_url`), each router publishes its placements
(endpoint id, the prompt's block chain, and whether the prefix was new) on one
pub/sub channel in batches, every `interval` seconds, and applies the other
routers' placements to its own index (and a new prefix to its count of new
prefixes per endpoint, so that every router's bounded-load placement counts the
same placements).

The request path only appends to a bounded list (`note`); publishing and
applying run in `run`, a background task. Redis being down or slow never fails
or slows a request: a batch that cannot be sent is dropped, the subscriber
reconnects with a pause, and the outage is logged once and again when it ends.

Not guaranteed: delivery. Pub/sub drops what is sent while a router is
disconnected, and two routers placing the same new prefix within one interval
still each choose alone (rendezvous hashing makes them agree on most). Block
hashes are compared, never prompts: nothing of a prompt's text leaves the router.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import struct
import sys
from array import array
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from llmgw.limits.redis_counters import fail_fast_client
from llmgw.metrics.routing import RoutingMetrics

log = logging.getLogger("llmgw.router.scoring.share")

# (endpoint id, chain, new prefix) per placement.
Apply = Callable[[str, Sequence[int], bool], None]

_ENTRY = struct.Struct("<BHI")  # new prefix, endpoint id bytes, chain length
_ID_BYTES = 8
_SWAP = sys.byteorder != "little"


def encode_batch(sender: bytes, entries: Sequence[tuple[str, Sequence[int], bool]]) -> bytes:
    """One message: the sender's id, then each placement (chains as little-endian u64)."""
    parts = [sender]
    for endpoint_id, chain, new in entries:
        name = endpoint_id.encode()
        blocks = array("Q", chain)
        if _SWAP:
            blocks.byteswap()
        parts += [_ENTRY.pack(int(new), len(name), len(blocks)), name, blocks.tobytes()]
    return b"".join(parts)


def decode_batch(data: bytes) -> tuple[bytes, list[tuple[str, list[int], bool]]]:
    """The sender and placements of a message; ValueError when it is malformed."""
    if len(data) < _ID_BYTES:
        raise ValueError("message shorter than a sender id")
    view = memoryview(data)
    sender = bytes(view[:_ID_BYTES])
    entries: list[tuple[str, list[int], bool]] = []
    at = _ID_BYTES
    try:
        while at < len(data):
            new, name_len, count = _ENTRY.unpack_from(view, at)
            at += _ENTRY.size
            name = bytes(view[at : at + name_len]).decode()
            at += name_len
            end = at + 8 * count
            if end > len(data):
                raise ValueError("chain runs past the end of the message")
            blocks = array("Q")
            blocks.frombytes(view[at:end])
            if _SWAP:
                blocks.byteswap()
            at = end
            entries.append((name, blocks.tolist(), bool(new)))
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed placement at byte {at}: {exc}") from exc
    return sender, entries


class PrefixShare:
    """Publishes this router's placements and applies the other routers' ones."""

    def __init__(
        self,
        *,
        redis_url: str,
        channel: str,
        interval: float,
        max_pending: int = 10000,
        timeout: float = 0.5,
        reconnect: float = 1.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        metrics: RoutingMetrics | None = None,
    ) -> None:
        self._channel = channel
        self._interval = interval
        self._max_pending = max_pending
        self._reconnect = reconnect
        self._sleep = sleep
        self._metrics = metrics
        self._id = secrets.token_bytes(_ID_BYTES)
        self._pending: list[tuple[str, Sequence[int], bool]] = []
        # Commands time out fast; the subscriber's connection waits for messages.
        self._client = fail_fast_client(redis_url, timeout)
        self._listener = aioredis.Redis.from_url(
            redis_url,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._up = {"publish": True, "subscribe": True}

    def note(self, endpoint_id: str, chain: Sequence[int], new: bool) -> None:
        """A placement to publish (the request path: an append, nothing more)."""
        if len(self._pending) >= self._max_pending:
            self._count("dropped", 1)
            return
        self._pending.append((endpoint_id, chain, new))

    async def run(self, apply: Apply) -> None:
        """Publish and subscribe until cancelled; `apply` gets the others' placements."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._publish_forever())
                group.create_task(self._subscribe_forever(apply))
        finally:
            await self._client.aclose()
            await self._listener.aclose()

    def _state(self, what: str, up: bool, exc: BaseException | None = None) -> None:
        if self._up[what] == up:
            return
        self._up[what] = up
        if up:
            log.info("routing index sharing: Redis %s works again", what)
        else:
            log.warning(
                "routing index sharing: Redis %s failed (%s); this router routes on its "
                "own index until Redis answers again",
                what,
                exc,
            )

    async def flush(self) -> None:
        """Send what is pending in one message (dropped when Redis fails)."""
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        try:
            await self._client.publish(self._channel, encode_batch(self._id, batch))
        except (RedisError, OSError) as exc:
            self._count("dropped", len(batch))
            self._state("publish", False, exc)
            return
        self._count("sent", len(batch))
        self._state("publish", True)

    def _count(self, outcome: str, placements: int) -> None:
        if self._metrics is not None:
            self._metrics.index_shared.labels(outcome).inc(placements)

    async def _publish_forever(self) -> None:
        while True:
            await self._sleep(self._interval)
            await self.flush()

    async def _subscribe_forever(self, apply: Apply) -> None:
        while True:
            try:
                await self._listen(apply)
            except (RedisError, OSError) as exc:
                self._state("subscribe", False, exc)
            await self._sleep(self._reconnect)

    async def _listen(self, apply: Apply) -> None:
        pubsub = self._listener.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self._channel)
            self._state("subscribe", True)
            while True:
                message = await pubsub.get_message(timeout=1.0)
                if message is None or message.get("type") != "message":
                    continue
                self._apply(message["data"], apply)
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2

    def _apply(self, data: object, apply: Apply) -> None:
        if not isinstance(data, bytes):
            return
        try:
            sender, entries = decode_batch(data)
        except ValueError as exc:
            log.warning("routing index sharing: ignored a malformed message: %s", exc)
            return
        if sender == self._id:
            return
        for endpoint_id, chain, new in entries:
            apply(endpoint_id, chain, new)
        self._count("applied", len(entries))
