"""The simulator as one member of a multi-node engine: a TCP rendezvous, as NCCL/Gloo do it.

`llmgw sim --nnodes N --node-rank R --master-addr A --master-port P` plays one
rank of an N-node replica, so that placement, wiring and failure handling of
multi-node replicas are tested with real processes and real sockets:

- Rank 0 listens on A:P (the address it is given, nothing else) and serves
  HTTP; its `/health` (and every inference path) answers 503 until every
  other rank has joined.
- Ranks above 0 serve no HTTP: they connect to A:P, say their rank, and stay
  connected. Until rank 0 listens they retry, as `torch.distributed` does.
- Any member leaving ends the others: rank 0 exits when a joined rank's
  connection closes, a follower when rank 0's does (as an NCCL abort would).
- With `GLOO_SOCKET_IFNAME` set, every rendezvous socket is bound to that
  interface (SO_BINDTODEVICE, which needs root or CAP_NET_RAW), as Gloo binds
  its sockets: given the wrong interface, the rendezvous fails.

Each rank prints one line with its rank, rendezvous and network variables, so
its log says what it was given.

Not guaranteed: anything about data traffic between ranks (there is none), or
a rejoin: a rank that left cannot come back; the replica is restarted whole.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from llmgw.sim.asgi import ASGIApp, Receive, Scope, Send, send_error
from llmgw.sim.errors import SimError

RETRY_SECONDS = 0.2


@dataclass(frozen=True, slots=True)
class GangSettings:
    """This process's place in a multi-node replica."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    # The interface rendezvous sockets are bound to (GLOO_SOCKET_IFNAME), or "".
    interface: str = ""

    def describe(self) -> str:
        env = " ".join(
            f"{name}={os.environ.get(name, '')}"
            for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
        )
        return (
            f"sim rank {self.node_rank} of {self.nnodes}: rendezvous "
            f"{self.master_addr}:{self.master_port}; {env}"
        )


class GangError(Exception):
    """The rendezvous cannot work: the address cannot be bound, the interface is missing."""


@dataclass(slots=True)
class Rendezvous:
    """Rank 0's side: accepts the other ranks and knows when all of them are in."""

    settings: GangSettings
    joined: set[int] = field(default_factory=set)
    complete: asyncio.Event = field(default_factory=asyncio.Event)
    broken: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = ""
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen on the master address; `GangError` when that cannot be done."""
        settings = self.settings
        try:
            sock = _socket(settings.master_addr, settings.interface)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((settings.master_addr, settings.master_port))
        except OSError as exc:
            raise GangError(
                f"cannot listen for the other ranks on {settings.master_addr}:"
                f"{settings.master_port}: {exc}"
            ) from exc
        self._server = await asyncio.start_server(self._member, sock=sock)
        if settings.nnodes <= 1:
            self.complete.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _member(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rank: int | None = None
        try:
            line = await reader.readline()
            rank = _rank(line, self.settings.nnodes)
            if rank is None or rank in self.joined:
                writer.close()
                return
            self.joined.add(rank)
            peer = writer.get_extra_info("peername")
            print(f"sim rank 0: rank {rank} joined from {peer}", flush=True)
            writer.write(b"ok\n")
            await writer.drain()
            if len(self.joined) == self.settings.nnodes - 1:
                print("sim rank 0: every rank has joined; ready", flush=True)
                self.complete.set()
            await reader.read()
            self.why = f"rank {rank} left the replica"
        except OSError as exc:
            # A reset connection is how a killed rank leaves: say so, with the error.
            self.why = f"rank {rank} left the replica ({exc.strerror or exc})"
        self.broken.set()


async def follow(settings: GangSettings, *, sleep: Callable[[float], Awaitable[None]]) -> str:
    """A rank above 0: join rank 0, then wait until it goes; returns why it ended."""
    loop = asyncio.get_running_loop()
    while True:
        sock = _socket(settings.master_addr, settings.interface)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (settings.master_addr, settings.master_port))
        except OSError:
            sock.close()
            await sleep(RETRY_SECONDS)
            continue
        break
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(f"rank {settings.node_rank}\n".encode())
    await writer.drain()
    if (await reader.readline()).strip() != b"ok":
        return "rank 0 refused this rank"
    print(f"sim rank {settings.node_rank}: joined rank 0 at {settings.master_addr}", flush=True)
    await reader.read()
    return "rank 0 left the replica"


def gate(app: ASGIApp, rendezvous: Rendezvous) -> ASGIApp:
    """Rank 0's HTTP: 503 on everything but /metrics until every rank has joined."""

    async def gated(scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and not rendezvous.complete.is_set()
            and scope.get("path") != "/metrics"
        ):
            joined = len(rendezvous.joined) + 1
            await send_error(
                send,
                SimError(
                    503,
                    f"waiting for the other ranks: {joined} of {rendezvous.settings.nnodes} "
                    "have joined",
                    code="ranks_joining",
                ),
            )
            return
        await app(scope, receive, send)

    return gated


def _socket(address: str, interface: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    if interface:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, interface.encode())
        except OSError as exc:
            sock.close()
            raise GangError(
                f"cannot bind to interface {interface} (GLOO_SOCKET_IFNAME): {exc}"
            ) from exc
    return sock


def _rank(line: bytes, nnodes: int) -> int | None:
    word, _, number = line.decode(errors="replace").strip().partition(" ")
    if word != "rank" or not number.isdigit():
        return None
    rank = int(number)
    return rank if 0 < rank < nnodes else None


def fail(message: str) -> None:
    """End this member at once, as an NCCL abort ends a rank."""
    print(f"sim: {message}; exiting", file=sys.stderr, flush=True)
    os._exit(1)
