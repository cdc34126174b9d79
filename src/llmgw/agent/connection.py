"""The agent's stream to the control plane: dial, register, serve commands, reconnect.

`Connection.run()` loops forever. One *pass* tries each server address in turn;
an address fails when the connection is refused, when the server refuses the
stream (any gRPC error before `Registered`: a standby naming its leader, a
PERMISSION_DENIED node id, a failed TLS handshake), when the connection is not
up within the connect timeout, or when no `Registered` arrives within the
register timeout after the Register was sent; the next address is tried at once. An
address that timed out (here, while joining or while renewing) is tried after
the others for a while (`silence.py`), so one silent server costs one timeout. Only
when every address has just failed does the loop sleep a full-jitter backoff;
a registration resets it. After a registered stream ends, the next pass starts
at once from the address *after* the one that served it (see `run_pass`). With
one address that is simply "dial it again". Failures that need an operator
(TLS on one side only, a refused certificate or node id) and a standby's
refusal are logged as warnings that say what to do (`refusal.py`). A node id
refused because another agent holds it backs off like any failed pass (never
the short standby retry), so two agents sharing an id do not storm the server.
A leader busy with a registration storm answers RESOURCE_EXHAUSTED with the
delay to come back after (`llmgw-retry-after-ms`); the agent waits at least
that long (longer when its own backoff has grown past it).

With `tls` (the files, or a callable read at every dial so that a renewed
certificate is used from the next dial on), the channel is TLS with this
node's client certificate, and the server's certificate must verify against
the CA and carry the dialled host. Each address keeps its channel between dials
while its connection is up or still being set up (a dial that timed out during
the TLS handshake resumes it next time instead of starting over); a failed
connection or a renewed certificate gets a new one.
HTTP/2 keepalive pings notice a server that stopped answering (a frozen
process, a vanished host) on an established stream within
keepalive_time + keepalive_timeout seconds.

While registered, the agent sends a heartbeat every interval the server gave
(at registration, and again in a HeartbeatInterval message when a big fleet's
interval changes: the next heartbeat is then due that long after the last),
every shard transition as a ShardStatus, and one CommandResult per command.
Each Register carries the current report of every shard (running ones, and
stopped or failed ones the server has not been told about yet), so transitions
that happen while disconnected are not lost and running engines are adopted.

Commands run concurrently. StartShard is answered once the process is spawned
(readiness follows as ShardStatus), StopShard and DrainShard once the process
is gone, RemoveWeights once the files are, PullWeights once the download is
under way (its progress and outcome go up in the heartbeats). A command interrupted by a dropped
stream still completes on the node, but its CommandResult is not resent; the
next Register shows the outcome.

Not guaranteed: exactly-once delivery (a ShardStatus may repeat across a
reconnect; the latest `since_unix` wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any

import grpc
import grpc.aio

from llmgw.agent import interfaces, wire
from llmgw.agent.addresses import EngineAddresses, local_address_towards
from llmgw.agent.backoff import Backoff
from llmgw.agent.errors import CommandError, ConnectError
from llmgw.agent.feed import StatusFeed
from llmgw.agent.hardware import Hardware
from llmgw.agent.hub import Snapshots
from llmgw.agent.refusal import explain, is_standby, retry_after
from llmgw.agent.settings import ConnectionSettings
from llmgw.agent.shard import ShardReport
from llmgw.agent.silence import SilentServers
from llmgw.agent.supervisor import Supervisor
from llmgw.config.hub import HubRef, hub_ref
from llmgw.pki import TlsMaterial
from llmgw.proto import agent_pb2, agent_pb2_grpc

log = logging.getLogger("llmgw.agent.connection")

_Call = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ServerMessage]
_Outgoing = agent_pb2.AgentMessage | ShardReport


class _StreamBroken(Exception):
    """A write failed: the stream is gone (ends the session, not the agent)."""


def describe_rpc_error(exc: grpc.aio.AioRpcError) -> str:
    details = exc.details() or ""
    return f"{exc.code().name}: {details}" if details else exc.code().name


def _lost_to_a_racing_write(exc: grpc.aio.AioRpcError) -> bool:
    """The status gRPC gives a call whose send failed because the other side ended it."""
    return exc.code() == grpc.StatusCode.INTERNAL and (exc.details() or "").startswith(
        "Internal error from Core"
    )


def channel_options(settings: ConnectionSettings) -> list[tuple[str, int]]:
    options = [
        # A fresh subchannel per attempt: the process-wide pool would keep a failed
        # address in gRPC's own reconnect backoff (up to 2 minutes) and fail our
        # attempts instantly long after the server is back.
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.enable_retries", 0),
    ]
    if settings.keepalive_time_seconds is not None:
        options += [
            ("grpc.keepalive_time_ms", int(settings.keepalive_time_seconds * 1000)),
            ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout_seconds * 1000)),
            ("grpc.http2.ping_timeout_ms", int(settings.keepalive_timeout_seconds * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            # No cap on pings between data frames: a frozen server sends nothing, and
            # that is exactly when the pings must go on. The agent listener allows a
            # ping a second (agentsvc.server.server_options), so no "too_many_pings".
            ("grpc.http2.max_pings_without_data", 0),
        ]
    return options


def _credentials(tls: TlsMaterial) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
    )


# A kept channel in one of these states is replaced (see `Connection._channel`).
FAILED_CONNECTIVITY = frozenset(
    {grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN}
)

# Refusals of this node's identity (its id is another agent's, its key revoked).
IDENTITY_REFUSALS = frozenset({grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.PERMISSION_DENIED})

# The longest wait between passes while a standby answers (see `run`).
STANDBY_RETRY_SECONDS = 1.0


class Connection:
    """Keeps this node registered with one of the control-plane servers, forever."""

    def __init__(
        self,
        *,
        addresses: Sequence[str],
        identity: wire.NodeIdentity,
        supervisor: Supervisor,
        feed: StatusFeed,
        hardware: Hardware,
        backoff: Backoff,
        settings: ConnectionSettings,
        tls: TlsMaterial | Callable[[], TlsMaterial] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        engine_addresses: EngineAddresses | None = None,
        silent: SilentServers | None = None,
        snapshots: Snapshots | None = None,
    ) -> None:
        """`engine_addresses`: told the local address of each connection before
        Register (unless --advertise-host fixed it), for the engines' URLs.
        `silent`: the servers that just timed out, shared with joining and renewal."""
        if not addresses:
            raise ValueError("Connection needs at least one server address")
        self._addresses = tuple(addresses)
        self._first = 0  # index of the address the next pass starts with
        # A callable is read at every dial: a renewed certificate is used from the next one.
        self._tls_source = tls if callable(tls) else None
        self._tls_fixed = None if callable(tls) else tls
        self._tls = tls is not None
        # The channel to each address, kept between dials (see `_channel`), with the
        # TLS material it was made with.
        self._channels: dict[str, tuple[TlsMaterial | None, grpc.aio.Channel]] = {}
        self._identity = identity
        self._supervisor = supervisor
        self._feed = feed
        self._hardware = hardware
        self._snapshots = snapshots  # the hub weights on disk, listed in every heartbeat
        self._backoff = backoff
        self._settings = settings
        self._sleep = sleep
        self._engine_addresses = engine_addresses
        self._options = channel_options(settings)
        self._silent = silent if silent is not None else SilentServers()
        self._sequence = 0
        self._live_outbox: asyncio.Queue[_Outgoing] | None = None  # of a registered stream
        # A standby refused this agent since it last registered. Sticky, because
        # the same standby may answer a racing write with INTERNAL instead.
        self._saw_standby = False
        # A server refused this node's identity in the last pass (id in use,
        # revoked): a person must act, so the full backoff applies.
        self._identity_refused = False
        # The longest wait a busy server asked for in the last pass (None: none asked).
        self._come_back_after: float | None = None

    async def run(self) -> None:
        """Dial, serve, redial; returns only by cancellation."""
        try:
            await self._run()
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the channels kept between dials (`run` does on its way out)."""
        channels = [channel for _, channel in self._channels.values()]
        self._channels.clear()
        for channel in channels:
            await channel.close()

    async def _run(self) -> None:
        while True:
            if not await self.run_pass():
                delay = self._backoff.next_delay()
                if self._saw_standby and not self._identity_refused:
                    # A standby answered: a control plane is up and a takeover is at
                    # most one lease TTL away, so keep the retries short. Wrapping the
                    # uniform draw into [0, 1 s) keeps a fleet's retries spread out.
                    delay %= STANDBY_RETRY_SECONDS
                if self._come_back_after is not None and not self._identity_refused:
                    # A busy server said when to come back (spread over its backlog);
                    # the backoff still grows if it keeps saying so.
                    delay = max(self._come_back_after, delay)
                log.info("retrying the control plane in %.2fs", delay)
                await self._sleep(delay)

    async def flush(self, *, grace: float) -> None:
        """Wait (up to `grace` seconds) until a registered stream has sent all it queued.

        Used on shutdown, so that the last shard reports reach the control plane
        before the stream is cancelled. Returns at once when disconnected.
        """
        outbox = self._live_outbox
        if outbox is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await outbox.join()

    async def run_pass(self) -> bool:
        """Try each address in turn until one registers and its stream ends.

        True when a stream was registered (and has ended since); False when every
        address failed before registration. A pass starts at `self._first`
        (the first address given, until a stream has been served) and wraps round.
        """
        count = len(self._addresses)
        self._identity_refused = False
        self._come_back_after = None
        failures: list[str] = []  # those not already logged as a warning of their own
        rotated = [(self._first + step) % count for step in range(count)]
        # A server that just let a dial time out goes last (see `silence.py`).
        order = sorted(rotated, key=lambda i: self._silent.is_silent(self._addresses[i]))
        for step, index in enumerate(order):
            address = self._addresses[index]
            try:
                await self._session(address)
            except ConnectError as exc:
                if exc.timed_out:
                    self._silent.timed_out(address)
                else:
                    self._silent.answered(address)
                if exc.notable:
                    more = step + 1 < count
                    log.warning("%s%s", exc, "; trying the next server" if more else "")
                else:
                    log.debug("control plane %s", exc)
                    failures.append(str(exc))
                continue
            # The stream this address served has ended. Start the next pass at the
            # address after it: a stream usually ends because that server died or
            # is shutting down, and the next address (a standby about to take over,
            # or already leading) answers at once, where redialling the dead one
            # could cost a whole connect timeout (a host that vanished answers
            # nothing). A leader that merely restarted is reached one refusal later.
            self._first = (index + 1) % count
            return True
        if failures:
            explained = count - len(failures)
            log.warning(
                "no control plane reachable (%d of %d addresses%s): %s",
                len(failures),
                count,
                f"; {explained} more refused as logged above" if explained else "",
                "; ".join(failures),
            )
        return False

    async def _channel(self, address: str) -> grpc.aio.Channel:
        """The channel to dial `address` on: the one of the last dial, unless its
        connection failed (gRPC would hold the address in its own reconnect backoff)
        or the certificate changed since; else a new one.

        Kept because a whole fleet dials at once after a failover. A dial that timed
        out during its TLS handshake would, on a new channel, throw away the
        handshake the server was working on and make it start another; kept, the
        next dial picks up where it left. And the connection a standby refused the
        agent on is the one it registers on once that standby leads: no handshake
        storm on a new leader."""
        material = self._tls_source() if self._tls_source is not None else self._tls_fixed
        kept = self._channels.get(address)
        if kept is not None:
            made_with, channel = kept
            if made_with == material and channel.get_state() not in FAILED_CONNECTIVITY:
                return channel
            await channel.close()
        channel = (
            grpc.aio.insecure_channel(address, options=self._options)
            if material is None
            else grpc.aio.secure_channel(address, _credentials(material), options=self._options)
        )
        self._channels[address] = (material, channel)
        return channel

    async def _session(self, address: str) -> None:
        channel = await self._channel(address)
        call: _Call | None = None
        try:
            stub = agent_pb2_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Connect()
            outbox: asyncio.Queue[_Outgoing] = asyncio.Queue()
            # Subscribe before the snapshot: a transition after it is queued and sent
            # once registered, so the server never misses one.
            with self._feed.subscribe(outbox.put_nowait):
                shards = self._supervisor.reports()
                registered = await self._register(address, call, shards)
                self._silent.answered(address)
                self._backoff.reset()
                self._saw_standby = False
                # A leader took the list: adopted engines on it are its to keep or stop.
                self._supervisor.confirm(shards)
                for report in shards:
                    if report.state.terminal:
                        self._supervisor.forget(report)
                await self._serve(address, call, registered, outbox)
        finally:
            if call is not None:
                call.cancel()

    async def _advertise_host(self, address: str) -> str:
        """The host engine URLs use, learned from the route to `address` by default."""
        engines = self._engine_addresses
        if engines is None:
            return ""
        if not engines.explicit:
            try:
                local = await asyncio.to_thread(local_address_towards, address)
            except OSError as exc:
                raise ConnectError(address, f"cannot find a route to it: {exc}") from exc
            if engines.learn(local):
                log.info(
                    "engines on this node are advertised at %s (this connection's local "
                    "address; --advertise-host overrides)",
                    local,
                )
        return engines.advertise

    async def _register(
        self, address: str, call: _Call, shards: list[ShardReport]
    ) -> agent_pb2.Registered:
        message = wire.register(
            self._identity,
            await self._hardware.report(),
            shards,
            advertise_host=await self._advertise_host(address),
            interfaces=await asyncio.to_thread(interfaces.discover),
        )
        connect = self._settings.connect_timeout_seconds
        answer_within = self._settings.register_timeout_seconds
        written = False
        try:
            async with asyncio.timeout(connect) as deadline:
                try:
                    # Completes once the connection is up (gRPC holds the message until
                    # the server's HTTP/2 settings arrive) and has taken the Register.
                    await call.write(message)
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                    # The server refused the stream before reading (a standby). The
                    # call's status says why (e.g. which server leads), except when the
                    # write raced the refusal: gRPC then reports INTERNAL instead.
                    raise self._refused(
                        address,
                        await call.code(),
                        await call.details(),
                        await call.trailing_metadata(),
                    ) from exc
                # The server has the Register: under a storm it may answer late, and
                # dialling again would discard its work. A dead one is left by the
                # keepalive pings; a busy one tells the agent when to come back.
                written = True
                deadline.reschedule(asyncio.get_running_loop().time() + answer_within)
                answer = await call.read()
        except TimeoutError as exc:
            why = (
                f"no Registered answer within {answer_within:g}s of sending Register"
                if written
                else f"no connection within {connect:g}s"
            )
            raise ConnectError(address, why, timed_out=True) from exc
        except grpc.aio.AioRpcError as exc:
            # The call's own status, as for the write: a read racing the server's
            # refusal may raise INTERNAL where the status says why.
            raise self._refused(
                address, await call.code(), await call.details(), await call.trailing_metadata()
            ) from exc
        if not isinstance(answer, agent_pb2.ServerMessage):
            raise ConnectError(address, "the server ended the stream without answering Register")
        if not answer.HasField("registered"):
            raise ConnectError(
                address,
                f"the server's first message was {answer.WhichOneof('kind')}, not Registered",
            )
        return answer.registered

    def _refused(
        self,
        address: str,
        code: grpc.StatusCode,
        details: str | None,
        metadata: Iterable[tuple[str, object]] | None,
    ) -> ConnectError:
        standby = is_standby(metadata)
        self._saw_standby = self._saw_standby or standby
        self._identity_refused = self._identity_refused or code in IDENTITY_REFUSALS
        wait = retry_after(metadata)
        if wait is not None:
            self._come_back_after = max(wait, self._come_back_after or 0.0)
        refusal = explain(
            address,
            code,
            details or "",
            tls=self._tls,
            standby=standby,
        )
        return ConnectError(
            address,
            f"{code.name}: {details}" if details else code.name,
            message=refusal.message,
            notable=refusal.notable,
        )

    async def _serve(
        self,
        address: str,
        call: _Call,
        registered: agent_pb2.Registered,
        outbox: asyncio.Queue[_Outgoing],
    ) -> None:
        seconds = registered.heartbeat_interval_seconds
        if seconds <= 0:
            seconds = self._settings.default_heartbeat_seconds
        interval = _Interval(seconds)
        log.info(
            "registered as %s with %s (leader %s, server %s); heartbeat every %gs",
            self._identity.node_id,
            address,
            registered.leader_id or "?",
            registered.server_version or "?",
            seconds,
        )
        commands: set[asyncio.Task[None]] = set()
        self._live_outbox = outbox
        try:
            async with asyncio.TaskGroup() as group:
                writer = group.create_task(self._write_loop(call, outbox))
                beats = group.create_task(self._heartbeat_loop(outbox, interval))
                await self._read_loop(address, call, outbox, group, commands, interval)
                for task in (writer, beats, *commands):
                    task.cancel()
        except* _StreamBroken as broken:
            log.warning("stream to %s broke: %s", address, broken.exceptions[0])
        finally:
            self._live_outbox = None

    async def _read_loop(
        self,
        address: str,
        call: _Call,
        outbox: asyncio.Queue[_Outgoing],
        group: asyncio.TaskGroup,
        commands: set[asyncio.Task[None]],
        interval: _Interval,
    ) -> None:
        while True:
            try:
                message = await call.read()
            except grpc.aio.AioRpcError as exc:
                if "ping timeout" in (exc.details() or ""):
                    log.warning(
                        "stream to %s ended: the server stopped answering (no answer to a "
                        "keepalive ping within %gs; %s)",
                        address,
                        self._settings.keepalive_timeout_seconds,
                        describe_rpc_error(exc),
                    )
                elif _lost_to_a_racing_write(exc):
                    # The server ended the stream while this agent was sending (a
                    # heartbeat, a report): gRPC reports the failed send as INTERNAL
                    # and loses the server's own status.
                    log.warning("the control plane at %s closed the stream", address)
                else:
                    log.warning("stream to %s ended: %s", address, describe_rpc_error(exc))
                return
            if not isinstance(message, agent_pb2.ServerMessage):
                log.warning("the control plane at %s closed the stream", address)
                return
            if message.HasField("heartbeat_interval"):
                interval.change(message.heartbeat_interval.seconds)
                continue
            command = self._command(message)
            if command is None:
                continue
            task = group.create_task(self._answer(message.command_id, command, outbox))
            commands.add(task)
            task.add_done_callback(commands.discard)

    def _command(
        self, message: agent_pb2.ServerMessage
    ) -> Coroutine[Any, Any, object] | CommandError | None:
        kind = message.WhichOneof("kind")
        log.info("command %s: %s", message.command_id or "-", kind)
        supervisor = self._supervisor
        if kind == "start_shard":
            return supervisor.start(message.start_shard.spec)
        if kind == "stop_shard":
            stop = message.stop_shard
            return supervisor.stop(stop.shard_id, grace=stop.grace_seconds)
        if kind == "drain_shard":
            drain = message.drain_shard
            return supervisor.stop(drain.shard_id, grace=drain.grace_seconds, drain=True)
        if kind == "remove_weights":
            return self._remove(message.remove_weights.path)
        if kind == "pull_weights":
            return self._pull(message.pull_weights)
        if kind == "sleep_shard":
            sleep = message.sleep_shard
            return supervisor.sleep(sleep.shard_id, sleep.level)
        if kind == "wake_shard":
            return supervisor.wake(message.wake_shard.shard_id)
        if kind == "load_adapter":
            load = message.load_adapter
            return supervisor.load_adapter(load.shard_id, load.name, load.path)
        if kind == "unload_adapter":
            unload = message.unload_adapter
            return supervisor.unload_adapter(unload.shard_id, unload.name)
        if kind == "registered":
            log.warning("ignoring a second Registered on an established stream")
            return None
        return CommandError(
            f"unknown command {kind or '(empty)'!r}; this agent knows StartShard, StopShard, "
            "DrainShard, SleepShard, WakeShard, LoadAdapter, UnloadAdapter, RemoveWeights and "
            "PullWeights"
        )

    async def _remove(self, path: str) -> None:
        await self._supervisor.remove_weights(path)
        if self._snapshots is not None:
            self._snapshots.rescan()  # the next heartbeat lists what is left

    async def _pull(self, pull: agent_pb2.PullWeights) -> None:
        ref = HubRef(pull.repo, pull.revision)
        if self._snapshots is None:
            raise CommandError(
                f"cannot pull {ref}: this agent has no weights directory for hub snapshots"
            )
        if hub_ref(str(ref)) != ref or not ref.pinned:
            raise CommandError(
                f"cannot pull {ref!s}: PullWeights needs a hub repo (org/name) and a commit SHA"
            )
        await self._supervisor.pull_weights(ref)

    async def _answer(
        self,
        command_id: str,
        command: Coroutine[Any, Any, object] | CommandError,
        outbox: asyncio.Queue[_Outgoing],
    ) -> None:
        error: str | None = None
        try:
            if isinstance(command, CommandError):
                raise command
            await command
        except CommandError as exc:
            error = str(exc)
            log.warning("command %s refused: %s", command_id or "-", error)
        finally:
            if not isinstance(command, CommandError):
                command.close()  # a no-op once awaited; cancelled before starting, it never was
        outbox.put_nowait(wire.command_result(command_id, error))

    async def _write_loop(self, call: _Call, outbox: asyncio.Queue[_Outgoing]) -> None:
        while True:
            item = await outbox.get()
            message = wire.status_message(item) if isinstance(item, ShardReport) else item
            try:
                await call.write(message)
            except (grpc.RpcError, asyncio.InvalidStateError) as exc:
                # A failed write means the call has ended, and the read loop reads
                # why and reports it once. Only if it never does is this the news.
                log.debug("write to the control plane failed: %r", exc)
                await asyncio.sleep(self._settings.connect_timeout_seconds)
                reason = describe_rpc_error(exc) if isinstance(exc, grpc.aio.AioRpcError) else ""
                raise _StreamBroken(
                    f"a write failed{': ' + reason if reason else ''} and the stream never ended"
                ) from exc
            outbox.task_done()
            if isinstance(item, ShardReport) and item.state.terminal:
                self._supervisor.forget(item)

    async def _heartbeat_loop(self, outbox: asyncio.Queue[_Outgoing], interval: _Interval) -> None:
        while True:
            usage = await self._hardware.usage()
            held = await self._snapshots.held() if self._snapshots is not None else []
            host = await self._hardware.host()
            pulls = (
                await asyncio.to_thread(self._snapshots.downloads)
                if self._snapshots is not None
                else []
            )
            self._sequence += 1
            outbox.put_nowait(wire.heartbeat(self._sequence, usage, held, host, pulls))
            await interval.wait(self._sleep)


class _Interval:
    """The heartbeat interval of one stream; the server may change it while it runs."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._changed = asyncio.Event()

    def change(self, seconds: float) -> None:
        """A HeartbeatInterval from the server; one that is not positive is ignored."""
        if seconds <= 0 or seconds == self.seconds:
            return
        log.info("the control plane set the heartbeat interval to %gs", seconds)
        self.seconds = seconds
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, sleep: Callable[[float], Awaitable[None]]) -> None:
        """Until the next heartbeat is due: an interval after this call began, by the
        interval in force (a change while waiting moves the due time)."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        remaining = self.seconds
        while remaining > 0:
            changed = asyncio.ensure_future(self._changed.wait())
            slept = asyncio.ensure_future(sleep(remaining))
            try:
                await asyncio.wait((changed, slept), return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                woken = not slept.done()
                slept.cancel()
            if not woken:
                return
            remaining = self.seconds - (loop.time() - began)
