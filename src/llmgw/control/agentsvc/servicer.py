"""The gRPC AgentService: one stream per node, reports up, commands down.

An agent opens `Connect`; its first message must be `Register` (otherwise the
stream ends with INVALID_ARGUMENT saying so). The servicer answers
`Registered`, then reads reports (heartbeats, shard statuses, command results)
and writes commands concurrently: a reader task feeds the inventory and
resolves command answers; a writer task drains the session's queue. A node
has one stream: a second Register for a connected node id is refused unless it
comes with the key that owns the id (then it is the node reconnecting, and the
old stream ends with ABORTED); see `identity.py`. When a stream ends, the node
is marked disconnected in the inventory (unless a newer stream already took
over).

The interval in `Registered` grows with the number of connected nodes above
`heartbeat_scale_above` (`cadence.py`); agents whose Register says they follow
changes get a `HeartbeatInterval` when it changes, and each node's thresholds
in the inventory follow the interval that node was told.

`AgentServicer` also implements `Dispatcher`: it is the only object that can
deliver a command to a node. Given a registry, it times every message it
handles and reports its open streams (see `metrics.py`).

Every shard a node reports, at Register and later, is judged against the
placement records first (`ShardVetting`, the `PlacementBook`): a shard the
leader never placed on that node, or recorded for another model, never reaches
the inventory; a recorded shard whose engine URL is not where the node is
reaches it as failed; either way the node is told to stop it (`refusals`).
Registers wait (up to `LOAD_WAIT_SECONDS`) until this term's records are read.

Two gates come before a stream is served. `admission` is asked first, before
any message is read: a standby answers with why it refuses (naming the
leader), and the stream ends UNAVAILABLE with that text and the trailing
metadata `llmgw-refused: standby`, so the agent tries its next server. Then
the `pacer` (see `pacing.py`): in a registration storm, a stream beyond the
pace, or beyond the registrations the server is answering in time, ends, once
its first message is read, RESOURCE_EXHAUSTED with `llmgw-refused: busy` and
`llmgw-retry-after-ms`, and the agent comes back after that delay. With
`require_identity` (mTLS on), the Register's node id must be one of the names
on the agent's client certificate; otherwise the attempt is logged and the
stream ends PERMISSION_DENIED before the node touches the inventory. Then the
`IdentityGate` claims the node id for the certificate's key in the store (a
revoked key, or an id owned by another key, is refused) and refuses a second
live stream; every refusal happens before the node touches the inventory and
is counted in `llmgw_agent_registers_total{outcome}`.

Not guaranteed:
- Authentication without TLS. On a plaintext listener any client that reaches
  it may register as any node id that is not connected; run it on a trusted
  network.
- Exactly-once commands. A command whose stream breaks fails with
  `NodeNotConnected` even if the agent had already acted on it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import Protocol

import grpc
from opentelemetry.trace import NoOpTracer, Span, Tracer
from prometheus_client import CollectorRegistry

from llmgw.control.agentsvc import convert
from llmgw.control.agentsvc.cadence import HeartbeatCadence
from llmgw.control.agentsvc.errors import (
    BadAgentMessage,
    CommandFailed,
    CommandTimeout,
    NodeNotConnected,
)
from llmgw.control.agentsvc.identity import (
    IdentityGate,
    NodeIdentities,
    Refused,
    certificate_refusal,
    peer_key_hash,
    reserved_name_refusal,
)
from llmgw.control.agentsvc.metrics import AgentMetrics
from llmgw.control.agentsvc.pacing import RegistrationPacer
from llmgw.control.agentsvc.refusals import ShardRefusals
from llmgw.control.agentsvc.session import CommandOutcome, NodeSession
from llmgw.control.inventory.model import (
    GpuUsage,
    HeldWeights,
    HostReading,
    NodeRegistration,
    ShardReport,
    ShardSpec,
    WeightsDownload,
    is_loopback,
)
from llmgw.control.placements import NodeAddress, Verdict
from llmgw.proto import agent_pb2, agent_pb2_grpc

log = logging.getLogger("llmgw.control.agentsvc")
# How long a stream that ends waits for a write still in flight (see `_write`).
_WRITE_SETTLE_S = 2.0

Context = grpc.aio.ServicerContext[agent_pb2.AgentMessage, agent_pb2.ServerMessage]

# Sent with an admission refusal, so an agent can tell "a standby, try the next
# server" from a transport failure without parsing the message text.
REFUSED_METADATA_KEY = "llmgw-refused"
REFUSED_STANDBY = "standby"
# A registration storm: come back after the milliseconds `RETRY_AFTER_METADATA_KEY` says.
REFUSED_BUSY = "busy"
RETRY_AFTER_METADATA_KEY = "llmgw-retry-after-ms"
# How long a Register waits for a new leader to read its placement records; the
# agent's own connect timeout is longer, and it simply retries after a refusal.
LOAD_WAIT_SECONDS = 5.0


class ShardVetting(Protocol):
    """Judges shard reports against the placement records; the `PlacementBook` satisfies it."""

    @property
    def loaded(self) -> bool: ...

    async def wait_loaded(self) -> None: ...

    def vet(self, node_id: str, where: NodeAddress, report: ShardReport, /) -> Verdict: ...

    def registered(self, node_id: str, reported: Collection[str], /) -> None: ...


class NodeReports(Protocol):
    """Where the servicer puts what agents report: the `Inventory` satisfies it."""

    def register(self, registration: NodeRegistration, /) -> object: ...

    def heartbeat(
        self,
        node_id: str,
        gpus: Sequence[GpuUsage],
        weights: Sequence[HeldWeights],
        host: HostReading,
        downloads: Sequence[WeightsDownload],
        /,
    ) -> None: ...

    def shard_status(self, node_id: str, report: ShardReport, /) -> object: ...

    def disconnected(self, node_id: str, /) -> None: ...

    def heartbeat_factor(self, node_id: str, factor: float, /) -> None: ...


async def _next(context: Context) -> agent_pb2.AgentMessage | None:
    """The next message from the agent, or None once it closed its side."""
    # The stubs type read() as the message only; at the end it returns EOF.
    message: object = await context.read()
    if message is grpc.aio.EOF:
        return None
    assert isinstance(message, agent_pb2.AgentMessage)
    return message


def _log_addresses(registration: NodeRegistration) -> None:
    """Where the agent is seen from, and a warning when its engines cannot work from here."""
    advertised = registration.advertise_host or "(not said: an older agent)"
    log.info(
        "node %s connects from %s; its engines are advertised at %s",
        registration.node_id,
        registration.seen_from,
        advertised,
    )
    if is_loopback(registration.advertise_host) and not is_loopback(registration.seen_from):
        log.warning(
            "node %s advertises %s (loopback) for its engines but connects from %s: this "
            "server cannot reach them; start its agent without --advertise-host, or with an "
            "address this server can dial",
            registration.node_id,
            registration.advertise_host,
            registration.seen_from,
        )


class _ClosedByServer(Exception):
    """The session was closed from this side (a newer stream for the node, or shutdown)."""


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """Holds one `NodeSession` per connected node; implements `Dispatcher`."""

    def __init__(
        self,
        *,
        inventory: NodeReports,
        placements: ShardVetting,
        heartbeat_interval: float,
        leader_id: str,
        server_version: str,
        command_timeout: float,
        registry: CollectorRegistry | None = None,
        require_identity: bool = False,
        admission: Callable[[], str | None] | None = None,
        identities: NodeIdentities | None = None,
        record_event: Callable[[str, str], None] | None = None,
        reserved_names: Callable[[], Collection[str]] = tuple,
        stop_grace: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        tracer: Tracer | None = None,
        pacer: RegistrationPacer | None = None,
        heartbeat_scale_above: int | None = None,
    ) -> None:
        """`tracer`: a span per registration (default: none). `pacer`: how many
        registrations a second are taken; the others are told when to come back
        (default: all are taken at once). `heartbeat_scale_above`: connected
        nodes above which the interval handed out grows (`cadence.py`; default:
        never).

        `admission()` returns None to take a stream, or the reason it is refused.

        `require_identity`: the node id must be a name on the client certificate
        (turn on with mTLS; without a certificate every stream is refused).
        `identities`: where node ids are claimed for certificate keys (the
        store); `record_event(node_id, message)` notes refused registrations.
        `reserved_names()`: the names on this server's own certificate (lower
        case); a Register under one of them is refused. `placements` judges every
        shard report; a refused shard is stopped with `stop_grace` seconds' grace.
        """
        self._tracer = tracer or NoOpTracer()
        self._pacer = pacer
        self._inventory = inventory
        self._placements = placements
        self._clock = clock
        # Three heartbeats missed: the agent's stream is dead even if its TCP
        # connection was never closed (the same margin the inventory gives).
        self._gate = IdentityGate(
            identities=identities,
            silent_after=3 * heartbeat_interval,
            clock=clock,
            wall_clock=wall_clock,
            record_event=record_event,
        )
        self._require_identity = require_identity
        self._reserved_names = reserved_names
        self._admission = admission
        self._cadence = HeartbeatCadence(
            interval=heartbeat_interval, scale_above=heartbeat_scale_above or sys.maxsize
        )
        self._leader_id = leader_id
        self._server_version = server_version
        self._command_timeout = command_timeout
        self._sessions: dict[str, NodeSession] = {}
        self._metrics = (
            None
            if registry is None
            else AgentMetrics(registry=registry, streams=lambda: len(self._sessions))
        )
        self._refusals = ShardRefusals(
            record_event=record_event, clock=clock, stop_grace=stop_grace, metrics=self._metrics
        )

    def connected(self) -> list[str]:
        """Ids of the nodes with an open stream."""
        return sorted(self._sessions)

    async def close_all(self, reason: str) -> None:
        """End every session (waiting commands fail); call before stopping the gRPC server."""
        # The inventory is updated here, not when each handler gets round to it:
        # once this returns, no node is shown as connected through a stream
        # that is ending (the handlers' own `_close` then finds them gone).
        sessions = tuple(self._sessions.values())
        self._sessions.clear()
        for session in sessions:
            session.close(reason)
            self._inventory.disconnected(session.node_id)
            log.info("node %s disconnected (%s): %s", session.node_id, session.peer, reason)
        # Let the handlers see the end and finish their streams.
        await asyncio.sleep(0)

    def disconnect(self, node_id: str, reason: str) -> str | None:
        """End the node's stream now, without marking it disconnected in the inventory
        (the caller is about to forget the node); the peer it was connected from, or
        None when it had no stream."""
        session = self._sessions.pop(node_id, None)
        if session is None:
            return None
        session.close(reason)
        log.info("closed node %s's stream from %s: %s", node_id, session.peer, reason)
        return session.peer

    # ---- the stream ----

    async def Connect(
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: Context
    ) -> None:
        # Before reading anything: a standby must not look at (or be slowed by)
        # what the agent sends, and the agent learns at once to try elsewhere.
        refusal = None if self._admission is None else self._admission()
        if refusal is not None:
            log.debug("refused the agent stream from %s: %s", context.peer(), refusal)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                refusal,
                trailing_metadata=((REFUSED_METADATA_KEY, REFUSED_STANDBY),),
            )
        first = await _next(context)
        # After reading the Register: refused before its write completed, the agent
        # may see only INTERNAL, without the delay to come back after.
        await self._pace(context)
        taken = time.perf_counter()
        try:
            if first is None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "the agent stream closed before its first message; send Register first",
                )
            kind = first.WhichOneof("kind")
            if kind != "register":
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "the first message on the agent stream must be Register, got "
                    f"{kind or 'nothing'}",
                )
            with self._tracer.start_as_current_span(
                "llmgw.agent.register", attributes={"llmgw.peer": context.peer()}
            ) as span:
                session = await self._register(first, context, span)
        finally:
            # Answered, refused or abandoned: the pacer learns how long it took.
            if self._pacer is not None:
                self._pacer.answered(time.perf_counter() - taken)
        try:
            await self._serve(session, context)
        except _ClosedByServer:
            await context.abort(
                grpc.StatusCode.ABORTED, f"the server closed this stream: {session.closed_because}"
            )
        except BadAgentMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            self._close(session)

    async def _pace(self, context: Context) -> None:
        """Tell the agent to come back later when registrations arrive faster than
        the pacer takes them; before the Register is decoded or checked, so a
        deferral costs only reading it."""
        wait = None if self._pacer is None else self._pacer.take()
        if wait is None or self._pacer is None:
            return
        if self._metrics is not None:
            self._metrics.registered("deferred")
        log.debug("told the agent at %s to come back in %.1f s", context.peer(), wait)
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"this server takes {self._pacer.rate:g} registrations a second and more are "
            f"arriving (many nodes reconnecting at once); come back in {wait:.1f} s",
            trailing_metadata=(
                (REFUSED_METADATA_KEY, REFUSED_BUSY),
                (RETRY_AFTER_METADATA_KEY, str(math.ceil(wait * 1000))),
            ),
        )

    async def _register(
        self, first: agent_pb2.AgentMessage, context: Context, span: Span
    ) -> NodeSession:
        """Check a Register and open the node's session, or abort the stream saying why."""
        started = time.perf_counter()
        try:
            registration = convert.registration(first.register)
        except BadAgentMessage as exc:
            log.warning("refused a Register from %s: %s", context.peer(), exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        span.set_attribute("llmgw.node", registration.node_id)
        span.set_attribute("llmgw.running_shards", len(registration.running_shards))
        reserved = reserved_name_refusal(registration.node_id, self._reserved_names())
        if reserved is not None:
            log.warning("refused a Register from %s: %s", context.peer(), reserved)
            await self._refuse(
                Refused(grpc.StatusCode.INVALID_ARGUMENT, reserved, "invalid"), context
            )
        if self._require_identity:
            wrong = certificate_refusal(
                registration.node_id, context.auth_context(), context.peer()
            )
            if wrong is not None:
                await context.abort(wrong.code, wrong.message)
        await self._wait_for_placements(context)
        session = await self._admit(
            registration, context, follows_interval=first.register.follows_heartbeat_interval
        )
        if self._metrics is not None:
            self._metrics.handled("register", time.perf_counter() - started)
        return session

    async def _wait_for_placements(self, context: Context) -> None:
        """Abort UNAVAILABLE unless this term's placement records are read in time."""
        if self._placements.loaded:
            return
        try:
            async with asyncio.timeout(LOAD_WAIT_SECONDS):
                await self._placements.wait_loaded()
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                "this server has not read its placement records yet (it has just taken over "
                "the control plane, or cannot reach its store); the agent retries",
            )

    async def _admit(
        self, registration: NodeRegistration, context: Context, *, follows_interval: bool
    ) -> NodeSession:
        """Open the node's session, or end the stream with why the Register is refused."""
        node_id, peer = registration.node_id, context.peer()
        key_hash = peer_key_hash(context.auth_context())
        claimed = await self._gate.claim(node_id, key_hash, peer)
        if isinstance(claimed, Refused):
            await self._refuse(claimed, context)
        # From the live-stream check to the open session: no await, so of two
        # Registers for one id only one can pass.
        refused = self._gate.live_stream(node_id, key_hash, peer, self._sessions.get(node_id))
        if refused is not None:
            await self._refuse(refused, context)
        replacing = node_id in self._sessions
        binding = None if isinstance(claimed, Refused) else claimed  # a refusal aborted
        registration = self._gate.bind_labels(registration, binding, peer)
        session = self._open(
            registration, peer=peer, key_hash=key_hash, follows_interval=follows_interval
        )
        if self._metrics is not None:
            self._metrics.registered("reconnected" if replacing else "accepted")
        return session

    async def _refuse(self, refused: Refused, context: Context) -> None:
        if self._metrics is not None:
            self._metrics.registered(refused.outcome)
        await context.abort(refused.code, refused.message)

    def _open(
        self,
        registration: NodeRegistration,
        *,
        peer: str,
        key_hash: str | None = None,
        follows_interval: bool = False,
    ) -> NodeSession:
        node_id = registration.node_id
        registration = dataclasses.replace(registration, seen_from=convert.peer_host(peer))
        where = NodeAddress(
            advertise_host=registration.advertise_host,
            seen_from=registration.seen_from,
            port_range=registration.port_range,
            interfaces=registration.interfaces,
            same_host=convert.on_this_host(registration.seen_from),
        )
        verdicts = [
            (r.shard_id, self._placements.vet(node_id, where, r))
            for r in registration.running_shards
        ]
        self._placements.registered(node_id, {r.shard_id for r in registration.running_shards})
        registration = dataclasses.replace(
            registration,
            running_shards=tuple(v.report for _, v in verdicts if v.report is not None),
        )
        # Inventory first: if it refuses, no session state has changed. No await
        # from here to the end, so no other stream sees a half-open session.
        self._inventory.register(registration)
        _log_addresses(registration)
        session = NodeSession(node_id=node_id, peer=peer, key_hash=key_hash, opened=self._clock())
        session.where = where
        session.follows_interval = follows_interval
        old = self._sessions.get(node_id)
        self._sessions[node_id] = session
        # The fleet's size sets the interval: this node is told the current one, and
        # agents already connected hear of a change (after this one's Registered).
        changed = self._cadence.update(len(self._sessions))
        session.beat_factor = self._cadence.factor
        self._inventory.heartbeat_factor(node_id, session.beat_factor)
        if old is not None:
            log.warning(
                "node %s connected again from %s while its stream from %s was open; "
                "closing the old stream",
                node_id,
                peer,
                old.peer,
            )
            old.close(f"replaced by a newer stream from {peer}")
        session.send(
            agent_pb2.ServerMessage(
                registered=agent_pb2.Registered(
                    heartbeat_interval_seconds=self._cadence.interval,
                    leader_id=self._leader_id,
                    server_version=self._server_version,
                )
            )
        )
        # After Registered: the agent acts on commands only once it is registered.
        for shard_id, verdict in verdicts:
            if verdict.refused is not None:
                self._refusals.refused(session, shard_id, verdict)
        if changed:
            self._retell_interval()
        return session

    def _retell_interval(self) -> None:
        """Tell every agent that follows interval changes the current interval, and
        scale its node's thresholds to it. Others keep what they were told."""
        factor, interval = self._cadence.factor, self._cadence.interval
        log.info(
            "%d agents connected: the heartbeat interval is now %g s (%d x the configured "
            "%g s); telling the agents that follow changes",
            len(self._sessions),
            interval,
            factor,
            self._cadence.interval_for(1),
        )
        message = agent_pb2.ServerMessage(
            heartbeat_interval=agent_pb2.HeartbeatInterval(seconds=interval)
        )
        for session in self._sessions.values():
            if not session.follows_interval or session.beat_factor == factor:
                continue
            if session.closed_because is not None:
                continue
            # Thresholds first: growing, the next beat may come a new interval after
            # the last; shrinking, 3 x the shorter interval still covers the longer
            # one the agent may be sleeping through when the message arrives.
            session.beat_factor = factor
            self._inventory.heartbeat_factor(session.node_id, factor)
            session.send(message)

    def _close(self, session: NodeSession) -> None:
        replaced = self._sessions.get(session.node_id) is not session
        session.close("its stream closed")
        if not replaced:
            del self._sessions[session.node_id]
            if self._cadence.update(len(self._sessions)):
                self._retell_interval()
            self._inventory.disconnected(session.node_id)
            log.info("node %s disconnected (%s)", session.node_id, session.peer)

    async def _serve(self, session: NodeSession, context: Context) -> None:
        """Read and write until the agent closes the stream or the session is closed."""
        reader = asyncio.create_task(self._read(session, context))
        writer = asyncio.create_task(self._write(session, context))
        try:
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, writer):
                task.cancel()
            await asyncio.wait({reader, writer})
        # Surface what ended the stream: an error in the reader or writer, else
        # a reader that finished means the agent closed, a writer one that this
        # side closed the session.
        for task in done:
            task.result()
        if writer in done and reader not in done:
            raise _ClosedByServer

    async def _read(self, session: NodeSession, context: Context) -> None:
        metrics = self._metrics
        while True:
            message = await _next(context)
            if message is None:
                return
            session.last_heard = self._clock()
            started = time.perf_counter()
            kind = self._handle(session, message)
            if metrics is not None:
                metrics.handled(kind, time.perf_counter() - started)

    def _handle(self, session: NodeSession, message: agent_pb2.AgentMessage) -> str | None:
        """Apply one report from the agent; returns its kind. Never awaits."""
        node_id = session.node_id
        kind: str | None = message.WhichOneof("kind")
        if kind == "heartbeat":
            self._inventory.heartbeat(
                node_id,
                convert.gpu_usage(message.heartbeat.gpus),
                convert.held_weights(message.heartbeat.weights),
                convert.host_reading(message.heartbeat),
                convert.weights_downloads(message.heartbeat.downloads),
            )
        elif kind == "shard_status":
            report = convert.shard_report(message.shard_status)
            assert session.where is not None  # set when the session was opened
            verdict = self._placements.vet(node_id, session.where, report)
            if verdict.report is not None:
                self._inventory.shard_status(node_id, verdict.report)
            if verdict.refused is not None:
                self._refusals.refused(session, report.shard_id, verdict)
        elif kind == "command_result":
            result = message.command_result
            outcome = CommandOutcome(ok=result.ok, error=result.error)
            if not session.answer(result.command_id, outcome):
                log.warning(
                    "node %s answered command %s, which nobody waits for (it timed out); ok=%s %s",
                    node_id,
                    result.command_id,
                    result.ok,
                    result.error,
                )
        elif kind == "register":
            raise BadAgentMessage(
                "Register is only valid as the first message of a stream; "
                "open a new stream to register again"
            )
        else:
            # A newer agent may send kinds this server does not know yet.
            log.debug("node %s sent a message this server does not know; ignored", node_id)
        return kind

    @staticmethod
    async def _write(session: NodeSession, context: Context) -> None:
        while (message := await session.next_outgoing()) is not None:
            write = asyncio.ensure_future(context.write(message))
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                # gRPC refuses to end the stream (an abort) while a write is still
                # in flight, and the agent would never learn why: let it finish first.
                await asyncio.wait({write}, timeout=_WRITE_SETTLE_S)
                raise

    # ---- Dispatcher ----

    async def start_shard(self, node_id: str, spec: ShardSpec) -> None:
        await self._command(
            node_id,
            agent_pb2.ServerMessage(
                start_shard=agent_pb2.StartShard(spec=convert.shard_spec_message(spec))
            ),
            f"start shard {spec.shard_id!r} ({spec.model})",
            self._command_timeout,
        )

    async def stop_shard(self, node_id: str, shard_id: str, grace_seconds: float) -> None:
        await self._command(
            node_id,
            agent_pb2.ServerMessage(
                stop_shard=agent_pb2.StopShard(shard_id=shard_id, grace_seconds=grace_seconds)
            ),
            f"stop shard {shard_id!r}",
            # The agent may answer only once the process is gone.
            self._command_timeout + grace_seconds,
        )

    async def drain_shard(self, node_id: str, shard_id: str, grace_seconds: float) -> None:
        await self._command(
            node_id,
            agent_pb2.ServerMessage(
                drain_shard=agent_pb2.DrainShard(shard_id=shard_id, grace_seconds=grace_seconds)
            ),
            f"drain shard {shard_id!r}",
            self._command_timeout + grace_seconds,
        )

    async def sleep_shard(
        self, node_id: str, shard_id: str, level: int, wait_seconds: float
    ) -> None:
        await self._command(
            node_id,
            agent_pb2.ServerMessage(
                sleep_shard=agent_pb2.SleepShard(shard_id=shard_id, level=level)
            ),
            f"put shard {shard_id!r} to sleep",
            self._command_timeout + wait_seconds,
        )

    async def wake_shard(self, node_id: str, shard_id: str, wait_seconds: float) -> None:
        await self._command(
            node_id,
            agent_pb2.ServerMessage(wake_shard=agent_pb2.WakeShard(shard_id=shard_id)),
            f"wake shard {shard_id!r}",
            self._command_timeout + wait_seconds,
        )

    async def pull_weights(self, node_id: str, repo: str, revision: str) -> None:
        await self._command(
            node_id,
            agent_pb2.ServerMessage(
                pull_weights=agent_pb2.PullWeights(repo=repo, revision=revision)
            ),
            f"pull {repo}@{revision[:7]}",
            self._command_timeout,
        )

    async def load_adapter(
        self, node_id: str, shard_id: str, name: str, path: str, wait_seconds: float
    ) -> None:
        await self._command(
            node_id,
            agent_pb2.ServerMessage(
                load_adapter=agent_pb2.LoadAdapter(shard_id=shard_id, name=name, path=path)
            ),
            f"load adapter {name!r} into shard {shard_id!r}",
            self._command_timeout + wait_seconds,
        )

    async def unload_adapter(
        self, node_id: str, shard_id: str, name: str, wait_seconds: float
    ) -> None:
        await self._command(
            node_id,
            agent_pb2.ServerMessage(
                unload_adapter=agent_pb2.UnloadAdapter(shard_id=shard_id, name=name)
            ),
            f"unload adapter {name!r} from shard {shard_id!r}",
            self._command_timeout + wait_seconds,
        )

    async def remove_weights(self, node_id: str, path: str) -> None:
        await self._command(
            node_id,
            agent_pb2.ServerMessage(remove_weights=agent_pb2.RemoveWeights(path=path)),
            f"remove weights {path!r}",
            self._command_timeout,
        )

    async def _command(
        self, node_id: str, message: agent_pb2.ServerMessage, what: str, wait_seconds: float
    ) -> None:
        session = self._sessions.get(node_id)
        if session is None:
            raise NodeNotConnected(
                f"cannot {what} on node {node_id!r}: it has no open agent stream "
                "(not registered, or its agent is down or reconnecting)",
                node_id=node_id,
            )
        command_id = uuid.uuid4().hex
        message.command_id = command_id
        answer = session.expect(command_id)
        try:
            session.send(message)
            async with asyncio.timeout(wait_seconds):
                outcome = await answer
        except TimeoutError as exc:
            raise CommandTimeout(
                f"node {node_id!r} did not answer '{what}' (command {command_id}) within "
                f"{wait_seconds:g} s; it may still act on it",
                node_id=node_id,
            ) from exc
        finally:
            session.forget(command_id)
            if not answer.done():
                answer.cancel()
        if not outcome.ok:
            raise CommandFailed(
                f"node {node_id!r} refused to {what}: {outcome.error or 'no reason given'}",
                node_id=node_id,
                error=outcome.error,
            )
        log.debug("node %s did %s (command %s)", node_id, what, command_id)
