"""Agents heartbeating: what 1,000 node agents cost one `llmgw server`.

One run starts `llmgw server` (router-only, `--auth-mode open`, a dead static
endpoint because router-only mode needs one) pinned to core 0, and simulates
the agents in this process, pinned to core 1: real grpc.aio streams to the
agent listener on 127.0.0.1, spread over channels of `--streams-per-channel`
streams, each channel its own TCP connection. With `--mtls` the server runs its
default agent listener (mTLS with the cluster CA): the bench makes a join token
(`llmgw nodes token create`), joins every agent with it as `llmgw agent --token`
does (its own key and CSR; the join time is printed, not part of the
registration time), and each agent dials with its node certificate over a TLS
connection of its own, as real agents do. Every agent registers with 8
declared GPUs, then heartbeats with the usage of its 8 GPUs every interval the
server hands out (`control.heartbeat_interval`, set from `--interval`); the
agents' phases are spread evenly over the interval, not in lockstep. Above
`--scale-above` connected nodes (`control.heartbeat_scale_above`; the server's
default unless given) the server hands out a multiple of the interval and tells
agents already connected; the simulated agents follow it, as `llmgw agent` does
(told the new interval: how many times). The simulated agents' channels carry
the options `llmgw agent` dials with (`agent.connection.channel_options` with
the default `ConnectionSettings`): HTTP/2 keepalive pings every 5 s, as real
agents send; `--agent-pings off` leaves them out. `--server-pings SECONDS|off`
sets `control.agent_ping_interval` (the server's own pings on each
connection). `--ping-matrix` measures the main row four times, alternating
server pings on/off and agent pings on/off, each on a fresh server, to show
what the pings cost.

All agents register at once (as after a server restart); the registration
time is from the first `Register` sent to the last `Registered` received.
One interval after the last registration a window of `--window` seconds is
measured: the server's CPU time (utime + stime from /proc, all threads) in %
of one core, its RSS at the end, and the server-side handling time of the
heartbeats in the window, from the difference of two scrapes of
`llmgw_agent_message_seconds{kind="heartbeat"}` on the admin listener's
/metrics (quantiles interpolated inside the histogram's buckets, as
Prometheus' histogram_quantile does). At the end `GET /admin/api/nodes` must
list every agent as ready. A baseline row with `--baseline` agents (100) runs
first, on a fresh server, so the scaling is visible. During each window the
busy time of both cores is sampled; a row disturbed by other processes is
measured again (`--retries`, 1) while the whole run still fits `--time-limit`
(240 s), the main row first, and one still disturbed is marked †.

`--failover` measures the storm after a leader failover instead of the rows: two
`llmgw server` processes (both pinned to core 0) on a fresh PostgreSQL database
(`--pg`; created per run and dropped after), `--agents` mTLS agents joined with a
token that know both servers, leader first, each following `llmgw agent`'s
connection loop (`FailoverFleet`). Once all are registered with the leader and
have heartbeated for an interval, the leader gets SIGKILL; measured are the time
from the kill until the standby leads and until every agent is registered with
it (target 60 s), the new leader's CPU and RSS over that time, streams ended,
refusals by kind and errors. Both servers' logs are kept (their paths are
printed). A row whose server lost its lease, or that failed, keeps its log too.

The markdown section goes to stdout, progress to stderr. Exit status: 0 when
every row ran and every node was ready, 1 when a check failed (a node not
ready, a stream ended, no heartbeat observed, the server lost its leadership
lease), 2 when the server could not
start, 3 when stopped (Ctrl-C, SIGTERM, `--time-limit`; the rows finished by
then are still printed). The server is stopped in every case, and dies with
this process even when it is killed.

Not guaranteed: that the numbers hold for real agents on real hosts. Here all
streams share 127.0.0.1 and one TCP connection per `--streams-per-channel`
agents instead of one connection per node, and the agents' process shares
the machine; its CPU and how late it sent its heartbeats are reported so a
limit on the agents' side is visible.
Numbers are only comparable between runs on the same, otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import http.client
import json
import math
import os
import platform
import random
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.backoff import Backoff
from llmgw.agent.connection import FAILED_CONNECTIVITY, STANDBY_RETRY_SECONDS, channel_options
from llmgw.agent.enroll import EnrollError, NodeCredentials, join
from llmgw.agent.refusal import is_standby, retry_after
from llmgw.agent.settings import ConnectionSettings
from llmgw.pki.cluster import parse_join_token
from llmgw.proto import agent_pb2, agent_pb2_grpc

HOST = "127.0.0.1"
SERVER_CORE = 0
AGENT_CORE = 1
GPUS_PER_NODE = 8
GPU_MEMORY = 80 << 30
MIB = 1 << 20
HEARTBEAT = "heartbeat"
HISTOGRAM = "llmgw_agent_message_seconds"
REGISTER_TIMEOUT = 60.0
# --failover: the target from the kill until every agent is registered with
# the new leader, and how long the bench waits for it (and for the first storm).
FAILOVER_TARGET = 60.0
FAILOVER_TIMEOUT = 180.0
# With --mtls: Joins in flight at once, and tries per node (a server that has just
# started may not lead yet).
JOIN_CONCURRENCY = 32
JOIN_ATTEMPTS = 10
STARTUP_TIMEOUT = 20.0
# % of the server's core used by others (other processes, unattributed kernel
# work such as loopback softirqs) above which a row counts as disturbed and is
# measured again. Load on the agents' core matters only when it makes the
# heartbeats late, which LATE_LIMIT catches.
NOISE_LIMIT = 20.0
# A row whose heartbeats left later than this share of the interval (p99) was
# limited by the agents' side, not the server.
LATE_LIMIT = 0.1
# What a row costs besides its window: start, registration, settling, stop.
ROW_OVERHEAD = 20.0

# Runs as the server's parent process image between this process and `llmgw
# server`: asks the kernel to SIGTERM it when this process dies (also on
# SIGKILL), pins it, then becomes the server. Done after exec, not in a
# preexec_fn: this process runs gRPC's threads, and forking with threads and
# running Python before exec can deadlock.
_LAUNCHER = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit("the benchmark exited before the server started")
if sys.argv[2] != "-":
    os.sched_setaffinity(0, {int(sys.argv[2])})
os.execv(sys.argv[3], sys.argv[3:])
"""


class BenchError(Exception):
    """The benchmark could not run; the message says why, `detail` shows the server's output."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


# --- the server ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Server:
    """One `llmgw server` subprocess; `stop()` ends it, always."""

    def __init__(
        self,
        *,
        interval: float,
        pin: bool,
        scale_above: int | None = None,
        mtls: bool = False,
        pings: float | str | None = "default",
        store: str | None = None,
        cluster_key: Path | None = None,
    ) -> None:
        """`pings`: `control.agent_ping_interval` (None: off), "default": the server's own.
        `store`: a database URL (`--store`); None: SQLite in a data dir of its own.
        `cluster_key`: `control.cluster_key_file` (servers sharing a store share it)."""
        self._dir = Path(tempfile.mkdtemp(prefix="llmgw-agents-bench-"))
        self.admin_port = _free_port()
        self.agent_port = _free_port()
        self.api_port = _free_port()
        self.log = self._dir / "server.log"
        config = self._dir / "server.yaml"
        # Unreachable after 3 missed beats, lost after 12: the ratios of the defaults.
        config.write_text(
            json.dumps(
                {
                    "control": {
                        "heartbeat_interval": interval,
                        "unreachable_after": 3 * interval,
                        "lost_after": 12 * interval,
                    }
                    | ({} if scale_above is None else {"heartbeat_scale_above": scale_above})
                    | ({} if pings == "default" else {"agent_ping_interval": pings})
                    | ({} if cluster_key is None else {"cluster_key_file": str(cluster_key)})
                }
            )
        )
        self.argv = [
            sys.executable, "-m", "llmgw", "server",
            "--config", str(config),
            "--endpoint", "x=http://127.0.0.1:1=m",
            "--listen", f"{HOST}:{self.api_port}",
            "--admin-listen", f"{HOST}:{self.admin_port}",
            "--agent-listen", f"{HOST}:{self.agent_port}",
            *(["--store", store] if store else []),
            "--data-dir", str(self._dir / "data"),
            "--auth-mode", "open",
            "--log-level", "warning",
        ]  # fmt: skip
        if not mtls:
            # Plaintext channels: this measures the agent service, not TLS handshakes.
            self.argv.append("--insecure-agents")
        core = str(SERVER_CORE) if pin else "-"
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _LAUNCHER, str(os.getpid()), core, *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.pid = self._proc.pid

    def lease_events(self) -> tuple[int, int, int]:
        """From the log: leadership terms lost, lease renewals failed, slow renewals."""
        text = self.log.read_text(errors="replace")
        return (
            text.count("lost the lease"),
            text.count("cannot renew the lease"),
            text.count("renewing the lease took"),
        )

    def unreachable_marks(self) -> int:
        """How many times the log says a node turned unreachable (missed heartbeats)."""
        return self.log.read_text(errors="replace").count(" is unreachable: ")

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last lines of the server's output ({self.log}) ---\n" + "\n".join(text)

    def check_alive(self) -> None:
        if self._proc.poll() is not None:
            raise BenchError(f"the server exited with status {self._proc.returncode}", self.tail())

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(OSError):
                status, _ = await asyncio.to_thread(_get, self.admin_port, "/healthz", 1.0)
                if status == 200:
                    return
            await asyncio.sleep(0.1)
        raise BenchError(
            f"the server did not answer /healthz within {STARTUP_TIMEOUT:g} s", self.tail()
        )

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise BenchError(f"no VmRSS in /proc/{self.pid}/status")

    def kill(self) -> None:
        """SIGKILL, as a host that dies: no release of the lease, no goodbye."""
        self._proc.kill()
        self._proc.wait(timeout=10)

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)

    def finish(self, *, keep_log: bool) -> None:
        """Remove the server's files; with `keep_log`, keep its log (for a failed row)
        and say where it is."""
        if keep_log:
            kept = Path(tempfile.mkdtemp(prefix="llmgw-agents-bench-log-")) / "server.log"
            with contextlib.suppress(OSError):
                kept.write_bytes(self.log.read_bytes())
                say(f"kept the server's log: {kept}")
        self.remove_files()

    def remove_files(self) -> None:
        for path in sorted(self._dir.rglob("*"), reverse=True):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        self._dir.rmdir()


class ApiProbe:
    """GET /healthz on the API port, one after another over one keep-alive connection,
    in a thread, while running; the latencies are kept (what a client sees during a storm)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.latencies: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ApiProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=30)
        try:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    conn.request("GET", "/healthz")
                    conn.getresponse().read()
                except (OSError, http.client.HTTPException):
                    self.errors += 1
                    conn.close()
                    conn = http.client.HTTPConnection(HOST, self.port, timeout=30)
                    continue
                self.latencies.append(time.perf_counter() - started)
                # About 50 probes a second: a client's steady trickle, not a load.
                self._stop.wait(0.02)
        finally:
            conn.close()


def core_busy_seconds() -> dict[int, float]:
    """Busy time of each core since boot (all but idle and iowait), from /proc/stat."""
    hz = os.sysconf("SC_CLK_TCK")
    busy: dict[int, float] = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *values = line.split()
            if name.startswith("cpu") and name != "cpu":
                ticks = [int(v) for v in values[:8]]
                busy[int(name[3:])] = (sum(ticks) - ticks[3] - ticks[4]) / hz
    return busy


# --- the histogram ---------------------------------------------------------------


Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), by bound


@dataclass(frozen=True)
class Histogram:
    """One kind's series of `llmgw_agent_message_seconds`."""

    buckets: Buckets
    total: float  # the _sum, seconds

    @property
    def count(self) -> float:
        return self.buckets[-1][1]

    def minus(self, earlier: Histogram) -> Histogram:
        old = dict(earlier.buckets)
        return Histogram(
            [(le, count - old.get(le, 0.0)) for le, count in self.buckets],
            self.total - earlier.total,
        )


async def scrape(port: int) -> dict[str, Histogram]:
    """`llmgw_agent_message_seconds` by kind, from the admin listener's /metrics."""
    status, body = await asyncio.to_thread(_get, port, "/metrics")
    if status != 200:
        raise BenchError(f"GET /metrics on the admin listener answered {status}")
    buckets: dict[str, Buckets] = {}
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        if family.name != HISTOGRAM:
            continue
        for sample in family.samples:
            kind = sample.labels.get("kind", "")
            if sample.name == f"{HISTOGRAM}_bucket":
                buckets.setdefault(kind, []).append((float(sample.labels["le"]), sample.value))
            elif sample.name == f"{HISTOGRAM}_sum":
                sums[kind] = sample.value
    if HEARTBEAT not in buckets:
        raise BenchError(
            f"the server's /metrics has no {HISTOGRAM}{{kind={HEARTBEAT!r}}}: is the agent "
            "servicer built with the metrics registry (AgentServicer(..., registry=registry))?"
        )
    return {kind: Histogram(sorted(b), sums.get(kind, 0.0)) for kind, b in buckets.items()}


def quantile(q: float, buckets: Buckets) -> float:
    """Like histogram_quantile: linear inside the bucket; the top finite bound if above it."""
    total = buckets[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = le, count
    return lower


# --- the simulated agents ----------------------------------------------------------


Call = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ServerMessage]


def node_name(index: int) -> str:
    return f"bench-node-{index:05d}"


def register_message(index: int) -> agent_pb2.Register:
    node_id = node_name(index)
    return agent_pb2.Register(
        node_id=node_id,
        hostname=f"{node_id}.bench",
        agent_version="bench",
        hardware=agent_pb2.Hardware(
            gpus=[
                agent_pb2.Gpu(
                    index=g,
                    uuid=f"GPU-{index:05d}-{g}",
                    name="NVIDIA H100 80GB HBM3",
                    memory_total_bytes=GPU_MEMORY,
                    memory_free_bytes=GPU_MEMORY - (1 << 30),
                )
                for g in range(GPUS_PER_NODE)
            ],
            cpu_count=128,
            memory_total_bytes=2048 << 30,
            weights_disk_free_bytes=4 << 40,
            gpu_source="declared",
        ),
        labels={"zone": f"zone-{index % 4}", "pool": "bench"},
        fabric={"ib-domain": f"pod{index // 32}"},
        port_range_start=20000,
        port_range_end=20099,
        weights_dir="/var/lib/llmgw/weights",
        follows_heartbeat_interval=True,
    )


def heartbeat_message(sequence: int, rng: random.Random) -> agent_pb2.AgentMessage:
    gpus = []
    for g in range(GPUS_PER_NODE):
        used = rng.randrange(GPU_MEMORY)
        gpus.append(
            agent_pb2.GpuUsage(
                index=g,
                utilization_percent=rng.uniform(0, 100),
                memory_used_bytes=used,
                memory_free_bytes=GPU_MEMORY - used,
            )
        )
    return agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(gpus=gpus, sequence=sequence))


@dataclass
class Fleet:
    """N agents' streams in this process.

    `connect()` opens the channels; `start()` has every agent register at once,
    then heartbeat; `close()` cancels the streams and closes the channels.
    """

    agents: int
    port: int
    per_channel: int
    # With mTLS: each agent's key and certificate from its Join, one channel (one
    # TLS connection) per agent, as real agents have.
    credentials: list[NodeCredentials] | None = None
    # Keepalive pings as `llmgw agent` sends them (its channel options), or none.
    pings: bool = True
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    registered: int = 0
    # Registers the server told to come back later (a paced storm), and the longest wait.
    deferred: int = 0
    longest_wait: float = 0.0
    all_registered: asyncio.Event = field(default_factory=asyncio.Event)
    registration_seconds: float = math.nan
    interval: float = math.nan
    late: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # HeartbeatInterval messages received (the fleet grew past a step), and each
    # agent's interval in force.
    retold: int = 0
    _intervals: dict[int, float] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _calls: list[Call] = field(default_factory=list)
    _started: float = 0.0  # perf_counter, for the registration time
    _epoch: float = 0.0  # the loop's time at start, for the heartbeats' phases

    async def connect(self) -> None:
        # The agent's own options; they include a local subchannel pool per channel:
        # without it gRPC shares one TCP connection between channels to the same target.
        settings = (
            ConnectionSettings() if self.pings else ConnectionSettings(keepalive_time_seconds=None)
        )
        options = channel_options(settings)
        if self.credentials is not None:
            for creds in self.credentials:
                tls = grpc.ssl_channel_credentials(
                    root_certificates=creds.ca_pem,
                    private_key=creds.key_pem,
                    certificate_chain=creds.cert_pem,
                )
                self.channels.append(
                    grpc.aio.secure_channel(f"{HOST}:{self.port}", tls, options=options)
                )
        for _ in range(0 if self.credentials else math.ceil(self.agents / self.per_channel)):
            channel = grpc.aio.insecure_channel(f"{HOST}:{self.port}", options=options)
            self.channels.append(channel)
        async with asyncio.timeout(10 if self.credentials is None else 120):
            await asyncio.gather(*(c.channel_ready() for c in self.channels))

    def start(self) -> None:
        self._started = time.perf_counter()
        self._epoch = asyncio.get_running_loop().time()
        # Generated code carries no annotations.
        stubs = [agent_pb2_grpc.AgentServiceStub(c) for c in self.channels]  # type: ignore[no-untyped-call]
        for i in range(self.agents):
            self._tasks.append(asyncio.create_task(self._agent(i, stubs[i // self.per_channel])))

    async def _connect(
        self, index: int, stub: agent_pb2_grpc.AgentServiceStub
    ) -> tuple[Call, object]:
        """Open the stream and register, coming back when a busy server says to (as
        `llmgw agent` does); the stream and the server's first answer."""
        while True:
            call: Call = stub.Connect()
            self._calls.append(call)
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await call.write(agent_pb2.AgentMessage(register=register_message(index)))
            try:
                return call, await call.read()
            except grpc.aio.AioRpcError:
                # The call's own status: a read racing the server's refusal may
                # raise INTERNAL where the status says RESOURCE_EXHAUSTED.
                wait = retry_after(await call.trailing_metadata())
                if await call.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or wait is None:
                    raise
            self.deferred += 1
            self.longest_wait = max(self.longest_wait, wait)
            await asyncio.sleep(wait)

    async def _agent(self, index: int, stub: agent_pb2_grpc.AgentServiceStub) -> None:
        try:
            call, reply = await self._connect(index, stub)
            if not isinstance(reply, agent_pb2.ServerMessage) or not reply.HasField("registered"):
                raise BenchError(f"agent {index}: expected Registered, got {reply!r}")
            interval = reply.registered.heartbeat_interval_seconds
            self.interval = interval
            self._intervals[index] = interval
            self.registered += 1
            if self.registered == self.agents:
                self.registration_seconds = time.perf_counter() - self._started
                self.all_registered.set()
            reader = asyncio.create_task(self._read(index, call))
            try:
                await self._heartbeat(index, call, interval)
            finally:
                reader.cancel()
        except grpc.aio.AioRpcError as exc:
            self.errors.append(f"agent {index}: stream ended: {exc.code().name} {exc.details()}")
        except BenchError as exc:
            self.errors.append(str(exc))

    async def _heartbeat(self, index: int, call: Call, interval: float) -> None:
        loop = asyncio.get_running_loop()
        rng = random.Random(index)
        # Phases spread evenly over the interval, counted from a common start.
        due = self._epoch + interval * index / self.agents
        while due <= loop.time():
            due += interval
        sequence = 0
        while True:
            await asyncio.sleep(due - loop.time())
            sequence += 1
            await call.write(heartbeat_message(sequence, rng))
            self.late.append(loop.time() - due)
            # The interval in force (the server may have changed it since).
            due += self._intervals[index]

    async def _read(self, index: int, call: Call) -> None:
        # After Registered the server sends only interval changes, unless it ends
        # the stream. A changed interval spaces the heartbeats after the one due.
        while True:
            try:
                message = await call.read()
            except grpc.aio.AioRpcError as exc:
                message = f"{exc.code().name} {exc.details()}"
            if isinstance(message, agent_pb2.ServerMessage) and message.HasField(
                "heartbeat_interval"
            ):
                self._intervals[index] = self.interval = message.heartbeat_interval.seconds
                self.retold += 1
                continue
            self.errors.append(f"agent {index}: unexpected message or end of stream: {message!r}")
            return

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for call in self._calls:
            call.cancel()
        await asyncio.gather(*(c.close() for c in self.channels), return_exceptions=True)


# --- the failover storm ---------------------------------------------------------------


@dataclass
class FailoverFleet:
    """N agents that know several servers, as `llmgw agent --server A --servers B` does.

    Each agent follows the agent's connection loop (`llmgw.agent.connection`): a pass
    dials each address in turn over its TLS channel to it (its node certificate; kept
    between dials unless its connection failed, or a fresh one per dial with
    `dial="fresh"`) and registers; a refusal, no connection within the connect timeout or no
    `Registered` within the register timeout after it tries the next address at
    once; after a registered stream ends the next pass starts at the address after
    the one that served it. When every address failed it sleeps
    a full-jitter backoff, cut below a second while a standby answered, and at
    least as long as a busy server asked. While registered it heartbeats at the
    interval the server gave.
    """

    addresses: list[str]
    credentials: list[NodeCredentials]
    # "kept": each agent keeps its channel (TLS connection) to each address between
    # dials unless its connection failed, as `llmgw agent` does; "fresh": a new channel
    # per dial, as `llmgw agent` did before; "reuse": one channel per agent and address
    # for the whole run, failed or not (see `--failover-dial`).
    dial: str = "kept"
    connect_timeout: float = ConnectionSettings().connect_timeout_seconds
    register_timeout: float = ConnectionSettings().register_timeout_seconds
    # The index of the address each agent is registered with now (absent: none).
    registered_with: dict[int, int] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # When each agent last registered (perf_counter), by address index.
    registered_at: dict[int, float] = field(default_factory=dict)
    # Streams that ended after Registered, by (address index, gRPC code), and when
    # the last one ended.
    ended: dict[tuple[int, str], int] = field(default_factory=dict)
    # Refusals before Registered, by kind: standby, busy (told to come back),
    # timed out (no connection within the connect timeout, or no Registered within the
    # register timeout after it), other (by code).
    refused: dict[str, int] = field(default_factory=dict)
    dials: int = 0
    longest_wait: float = 0.0
    # (when sent, seconds late) for every heartbeat.
    late: list[tuple[float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _options: list[tuple[str, int]] = field(
        default_factory=lambda: channel_options(ConnectionSettings())
    )
    _kept: dict[tuple[int, int], grpc.aio.Channel] = field(default_factory=dict)

    def start(self) -> None:
        for i in range(len(self.credentials)):
            self._tasks.append(asyncio.create_task(self._agent(i)))

    def count(self, address: int) -> int:
        return sum(1 for a in self.registered_with.values() if a == address)

    def _refuse(self, kind: str) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1

    async def _agent(self, index: int) -> None:
        backoff = Backoff(rng=random.Random(index))
        first = 0
        count = len(self.addresses)
        # As the agent's: sticky until a registration, since a standby may answer a
        # racing write with INTERNAL, without its metadata.
        saw_standby = False
        try:
            while True:
                come_back: float | None = None
                served = False
                for step in range(count):
                    at = (first + step) % count
                    outcome = await self._session(index, at)
                    if outcome == "served":
                        backoff.reset()
                        saw_standby = False
                        first = (at + 1) % count
                        served = True
                        break
                    if outcome == "standby":
                        saw_standby = True
                    elif isinstance(outcome, float):
                        come_back = max(outcome, come_back or 0.0)
                if served:
                    continue
                delay = backoff.next_delay()
                if saw_standby:
                    delay %= STANDBY_RETRY_SECONDS
                if come_back is not None:
                    delay = max(come_back, delay)
                    self.longest_wait = max(self.longest_wait, come_back)
                await asyncio.sleep(delay)
        except Exception as exc:  # a bug here must show, not stop one agent silently
            self.errors.append(f"agent {index}: {type(exc).__name__}: {exc}")

    async def _session(self, index: int, at: int) -> str | float | None:
        """One dial: "served" (registered, then the stream ended), "standby", the
        delay a busy server asked for, or None (another failure)."""
        self.dials += 1
        channel = self._kept.pop((index, at), None)
        failed = channel is not None and channel.get_state() in FAILED_CONNECTIVITY
        if self.dial == "kept" and channel is not None and failed:
            # As the agent: a failed connection gets a new channel (gRPC would hold
            # the address in its reconnect backoff).
            await channel.close()
            channel = None
        if channel is None:
            creds = self.credentials[index]
            tls = grpc.ssl_channel_credentials(
                root_certificates=creds.ca_pem,
                private_key=creds.key_pem,
                certificate_chain=creds.cert_pem,
            )
            channel = grpc.aio.secure_channel(self.addresses[at], tls, options=self._options)
        if self.dial != "fresh":
            self._kept[(index, at)] = channel
        call: Call | None = None
        try:
            stub = agent_pb2_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Connect()
            written = False
            try:
                async with asyncio.timeout(self.connect_timeout) as deadline:
                    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                        await call.write(agent_pb2.AgentMessage(register=register_message(index)))
                    # As the agent: once the connection has taken the Register, its
                    # answer gets the register timeout.
                    written = True
                    loop = asyncio.get_running_loop()
                    deadline.reschedule(loop.time() + self.register_timeout)
                    reply = await call.read()
            except TimeoutError:
                self._refuse(
                    f"no Registered within the register timeout (server {at + 1})"
                    if written
                    else f"no connection within the connect timeout (server {at + 1})"
                )
                return None
            except grpc.aio.AioRpcError:
                metadata = await call.trailing_metadata()
                if is_standby(metadata):
                    self._refuse("standby")
                    return "standby"
                wait = retry_after(metadata)
                if wait is not None:
                    self._refuse("busy: told to come back")
                    return wait
                self._refuse(f"{(await call.code()).name}")
                return None
            if not isinstance(reply, agent_pb2.ServerMessage) or not reply.HasField("registered"):
                self._refuse("no Registered answer")
                return None
            self.registered_with[index] = at
            self.registered_at[index] = time.perf_counter()
            self.changed.set()
            try:
                await self._serve(index, call, reply.registered.heartbeat_interval_seconds)
            finally:
                self.registered_with.pop(index, None)
                self.changed.set()
            return "served"
        finally:
            if call is not None:
                call.cancel()
            if self.dial == "fresh":
                await channel.close()

    async def _serve(self, index: int, call: Call, interval: float) -> None:
        """Heartbeat until the stream ends; count how it ended."""
        rng = random.Random(index)
        intervals = [interval]

        async def beat() -> None:
            loop = asyncio.get_running_loop()
            due = loop.time() + rng.uniform(0, intervals[0])
            sequence = 0
            while True:
                await asyncio.sleep(due - loop.time())
                sequence += 1
                await call.write(heartbeat_message(sequence, rng))
                # How late this process sent it (its own event loop behind, not the
                # server's), by when it was sent.
                self.late.append((time.perf_counter(), loop.time() - due))
                due += intervals[0]

        beats = asyncio.create_task(beat())
        code = "stream ended"
        try:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    code = "OK (end of stream)"
                    break
                if isinstance(message, agent_pb2.ServerMessage) and message.HasField(
                    "heartbeat_interval"
                ):
                    intervals[0] = message.heartbeat_interval.seconds
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
        finally:
            beats.cancel()
            await asyncio.gather(beats, return_exceptions=True)
        key = (self.registered_with.get(index, -1), code)
        self.ended[key] = self.ended.get(key, 0) + 1

    async def wait_until(self, check: Callable[[], bool], within: float) -> bool:
        """Wait (up to `within` s) until `check()` holds, re-checked on every change."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not check():
            self.changed.clear()
            left = deadline - loop.time()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 1.0)):
                    await self.changed.wait()
        return True

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in self._kept.values()), return_exceptions=True)


@dataclass
class FailoverResult:
    agents: int
    joined_seconds: float
    first_registration_seconds: float
    registered_before: int
    took_over_seconds: float  # from the kill until the standby reported itself leader
    reregistered_seconds: float  # from the kill until every agent was registered with it
    reregistered: int
    new_leader_cpu: float  # seconds, from the kill until all re-registered (or gave up)
    new_leader_rss: int
    new_leader_rss_before: int
    agents_cpu: float
    dials: int
    ended: dict[tuple[int, str], int]
    refused: dict[str, int]
    longest_wait: float
    states: dict[str, int]
    errors: list[str]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    leader_lease_lost: int
    dial: str = "kept"
    # Heartbeats this process sent late (p99, max seconds), during the first storm and
    # from the kill until all re-registered; nodes each server's log marked unreachable.
    late_first: tuple[float, float] = (math.nan, math.nan)
    late_failover: tuple[float, float] = (math.nan, math.nan)
    unreachable: tuple[int, int] = (0, 0)

    @property
    def ok(self) -> bool:
        ended_by_new = sum(n for (at, _), n in self.ended.items() if at == 1)
        return (
            not self.errors
            and self.reregistered == self.agents
            and self.reregistered_seconds <= FAILOVER_TARGET
            and ended_by_new == 0
            and self.states.get("ready", 0) == self.agents
            and self.leader_lease_lost == 0
        )


async def _pg(url: str, sql: str) -> None:
    import asyncpg  # only the failover mode needs PostgreSQL's client

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _role(server: Server) -> str:
    with contextlib.suppress(OSError, ValueError):
        status, body = await asyncio.to_thread(_get, server.admin_port, "/admin/api/leader", 2.0)
        if status == 200:
            return str(json.loads(body)["role"])
    return "unknown"


async def _wait_role(server: Server, role: str, within: float) -> None:
    deadline = time.monotonic() + within
    while await _role(server) != role:
        server.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"the server did not become {role} within {within:g} s", server.tail())
        await asyncio.sleep(0.05)


async def run_failover(args: argparse.Namespace, pinned: bool) -> FailoverResult:
    """Two servers on a fresh PostgreSQL database, `--agents` agents registered with
    the leader; SIGKILL the leader and time the storm onto the standby."""
    base = args.pg.rsplit("/", 1)[0]
    database = f"llmgw_bench_{random.getrandbits(32):08x}"
    store = f"{base}/{database}"
    try:
        await _pg(args.pg, f"CREATE DATABASE {database}")
    except OSError as exc:
        raise BenchError(f"PostgreSQL is not reachable at {args.pg} ({exc})") from exc
    servers: list[Server] = []
    fleet: FailoverFleet | None = None
    # The first server creates the cluster key; the second must have the same file.
    keys = Path(tempfile.mkdtemp(prefix="llmgw-agents-bench-keys-"))
    try:
        say(f"failover: two servers on PostgreSQL database {database}")
        # One after the other: the first takes the lease, the second stands by.
        for role in ("leader", "standby"):
            server = Server(
                interval=args.interval, pin=pinned, mtls=True, store=store,
                scale_above=args.scale_above, cluster_key=keys / "cluster.key",
            )  # fmt: skip
            servers.append(server)
            await server.wait_ready()
            await _wait_role(server, role, STARTUP_TIMEOUT)
        first, second = servers
        credentials, joined = await join_fleet(first, args.agents)
        say(f"failover: {args.agents} agents joined with a token in {joined:.1f} s")
        addresses = [f"{HOST}:{first.agent_port}", f"{HOST}:{second.agent_port}"]
        fleet = FailoverFleet(addresses=addresses, credentials=credentials, dial=args.failover_dial)
        started = time.perf_counter()
        fleet.start()
        if not await fleet.wait_until(lambda: fleet.count(0) == args.agents, FAILOVER_TIMEOUT):
            raise BenchError(
                f"only {fleet.count(0)} of {args.agents} agents registered with the leader "
                f"within {FAILOVER_TIMEOUT:g} s; refusals {fleet.refused}, "
                f"errors {fleet.errors[:3]}",
                first.tail(),
            )
        registered_in = time.perf_counter() - started
        say(
            f"failover: all {args.agents} registered with the leader in {registered_in:.1f} s; "
            f"settling for one interval"
        )
        await asyncio.sleep(args.interval)
        registered_before = fleet.count(0)
        rss_before = second.rss()
        load_before = os.getloadavg()
        cpu0, agents_cpu0 = second.cpu_seconds(), time.process_time()
        say("failover: SIGKILL to the leader")
        killed = time.perf_counter()
        first.kill()

        async def took_over() -> float:
            await _wait_role(second, "leader", FAILOVER_TIMEOUT)
            return time.perf_counter() - killed

        leading = asyncio.create_task(took_over())
        done = await fleet.wait_until(lambda: fleet.count(1) == args.agents, FAILOVER_TIMEOUT)
        reregistered_in = (
            max(fleet.registered_at[i] for i in fleet.registered_with) - killed
            if done
            else math.nan
        )
        cpu1, agents_cpu1 = second.cpu_seconds(), time.process_time()
        rss = second.rss()
        load_after = os.getloadavg()
        took = await leading if leading.done() else math.nan
        leading.cancel()
        say(
            f"failover: {fleet.count(1)} of {args.agents} registered with the new leader "
            f"{reregistered_in:.1f} s after the kill (it led {took:.1f} s after the kill)"
        )
        # One interval and a half for the nodes to show ready (a heartbeat each).
        await asyncio.sleep(1.5 * args.interval)
        second.check_alive()
        status, body = await asyncio.to_thread(_get, second.admin_port, "/admin/api/nodes", 60)
        states: dict[str, int] = {}
        if status == 200:
            for node in json.loads(body)["nodes"]:
                states[node["state"]] = states.get(node["state"], 0) + 1
        lost, _, _ = second.lease_events()

        def late(since: float, until: float) -> tuple[float, float]:
            values = [v for at, v in fleet.late if since <= at <= until]
            return (_pct(values, 0.99), max(values)) if values else (math.nan, math.nan)

        return FailoverResult(
            agents=args.agents,
            joined_seconds=joined,
            first_registration_seconds=registered_in,
            registered_before=registered_before,
            took_over_seconds=took,
            reregistered_seconds=reregistered_in,
            reregistered=fleet.count(1),
            new_leader_cpu=cpu1 - cpu0,
            new_leader_rss=rss,
            new_leader_rss_before=rss_before,
            agents_cpu=agents_cpu1 - agents_cpu0,
            dials=fleet.dials,
            ended=dict(fleet.ended),
            refused=dict(fleet.refused),
            longest_wait=fleet.longest_wait,
            states=states,
            errors=list(fleet.errors),
            load_before=load_before,
            load_after=load_after,
            leader_lease_lost=lost,
            dial=args.failover_dial,
            late_first=late(started, started + registered_in),
            late_failover=late(killed, killed + reregistered_in),
            unreachable=(first.unreachable_marks(), second.unreachable_marks()),
        )
    finally:
        if fleet is not None:
            await fleet.close()
        for server in servers:
            server.stop()
            server.finish(keep_log=True)
        with contextlib.suppress(OSError):
            await _pg(args.pg, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        await asyncio.to_thread(shutil.rmtree, keys, True)


def render_failover(r: FailoverResult, pinned: bool, command: str) -> str:
    placement = (
        f"both servers pinned to core {SERVER_CORE}, the simulated agents (this process) to "
        f"core {AGENT_CORE}, PostgreSQL unpinned"
        if pinned
        else "nothing pinned (fewer than 2 cores)"
    )
    ended_old = sum(n for (at, _), n in r.ended.items() if at == 0)
    ended_new = sum(n for (at, _), n in r.ended.items() if at == 1)
    codes = ", ".join(f"{code} {n:,}" for (at, code), n in sorted(r.ended.items()) if at == 0)
    refused = ", ".join(f"{kind} {n:,}" for kind, n in sorted(r.refused.items())) or "none"
    target = "met" if r.ok else "**missed**"
    lines = [
        f"## Failover storm: {r.agents:,} agents onto the standby (PostgreSQL)",
        "",
        f"`{command}` · {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC · "
        f"{machine()} · tree {_tree_state()} · load average before the kill "
        f"{r.load_before[0]:.2f} / {r.load_before[1]:.2f} / {r.load_before[2]:.2f}, "
        f"after {r.load_after[0]:.2f} / {r.load_after[1]:.2f} / {r.load_after[2]:.2f}",
        "",
        f"Two `llmgw server` processes on one fresh PostgreSQL database (default lease TTL, "
        f"mTLS agent listeners with the cluster CA), {placement}. {r.agents:,} agents joined "
        f"with a token ({r.joined_seconds:.1f} s) and know both servers, leader first; each "
        "follows `llmgw agent`'s connection loop ("
        + (
            "a fresh TLS channel per dial, as `llmgw agent` did before it kept them "
            "(`--failover-dial fresh`)"
            if r.dial == "fresh"
            else "each agent's TLS channel to each server kept between dials unless its "
            "connection failed, as `llmgw agent` does"
            if r.dial == "kept"
            else "one TLS channel per agent and server for the whole run, even to the dead "
            "leader (`--failover-dial reuse`: a dial to the dead leader costs this process "
            "nothing, as a refused connection costs an agent with a host of its own nothing)"
        )
        + ", the next address on a refusal, the standby retry under a second, a busy "
        "server's come-back delay). All registered with the leader "
        f"({r.first_registration_seconds:.1f} s), then the leader got SIGKILL.",
        "",
        "| agents | standby led after | all re-registered after | re-registered "
        "| new leader CPU % (kill → all) | new leader RSS MiB before → after "
        "| streams ended by the new leader | nodes ready | 60 s target |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| {r.agents:,} | {r.took_over_seconds:.1f} s | {r.reregistered_seconds:.1f} s "
        f"| {r.reregistered:,} / {r.agents:,} "
        f"| {100 * r.new_leader_cpu / max(r.reregistered_seconds, 1e-9):.0f} "
        f"| {r.new_leader_rss_before / MIB:.0f} → {r.new_leader_rss / MIB:.0f} "
        f"| {ended_new} | {r.states.get('ready', 0):,} | {target} |",
        "",
        f"- Streams to the killed leader that ended: {ended_old:,} ({codes or 'none'}).",
        f"- Dials by all agents over the run: {r.dials:,}; refusals before Registered: "
        f"{refused}; longest come-back delay asked: {r.longest_wait:.1f} s.",
        f"- The agents' process used {100 * r.agents_cpu / max(r.reregistered_seconds, 1e-9):.0f}"
        " % of its core from the kill until all re-registered (every simulated agent's "
        "dials and heartbeats on one core: real agents each have a host of their own).",
        f"- Heartbeats this process sent late, p99 / max: {r.late_first[0]:.2f} / "
        f"{r.late_first[1]:.2f} s during the first storm, {r.late_failover[0]:.2f} / "
        f"{r.late_failover[1]:.2f} s from the kill until all re-registered. Nodes marked "
        f"unreachable (no heartbeat for 3 intervals) in the logs: first leader "
        f"{r.unreachable[0]:,}, new leader {r.unreachable[1]:,}.",
        "- Standby led after: from the kill until `GET /admin/api/leader` on the standby "
        "said leader (the lease runs out one TTL after the dead leader's last renewal). "
        "All re-registered after: until the last agent's `Registered` from the new leader.",
    ]
    if r.errors:
        lines += ["", "Errors (first 3):", *(f"- {e}" for e in r.errors[:3])]
    return "\n".join(lines)


# --- one row ------------------------------------------------------------------------


@dataclass
class Row:
    agents: int
    interval: float
    window: float
    beats: float
    server_cpu: float  # seconds over the window
    rss: int
    idle_rss: int
    heartbeat_p50: float
    heartbeat_p99: float
    heartbeat_mean: float
    register_p50: float
    register_p99: float
    registration_seconds: float
    states: dict[str, int]
    agents_cpu: float  # seconds over the window
    core_busy: dict[int, float]  # seconds over the window, by core
    late_p99: float
    late_max: float
    errors: list[str]

    attempts: int = 1
    deferred: int = 0  # Registers told to come back later (a paced storm)
    retold: int = 0  # HeartbeatInterval messages the agents received
    # GET /healthz on the API port: p50 before the storm, p50 / p99 during it, failures.
    api_idle_p50: float = math.nan
    api_storm_p50: float = math.nan
    api_storm_p99: float = math.nan
    api_failed: int = 0
    # Keepalive pings: the server's interval ("default": its own; None: off), the agents' on/off.
    server_pings: float | str | None = "default"
    agent_pings: bool = True
    # The leadership lease, from the server's log: terms lost, renewals that failed
    # (and were retried), renewals slower than a fifteenth of the TTL.
    lease_lost: int = 0
    renewals_failed: int = 0
    renewals_slow: int = 0

    @property
    def ok(self) -> bool:
        return (
            not self.errors and self.states.get("ready", 0) == self.agents and self.lease_lost == 0
        )

    def other_load(self) -> tuple[float, float]:
        """% of core 0 and core 1 used by others than the server and the agents."""
        own = {SERVER_CORE: self.server_cpu, AGENT_CORE: self.agents_cpu}
        load = [
            max(0.0, 100 * (self.core_busy.get(core, 0.0) - own[core]) / self.window)
            for core in (SERVER_CORE, AGENT_CORE)
        ]
        return load[0], load[1]

    def disturbed(self, pinned: bool) -> bool:
        noisy = pinned and self.other_load()[0] > NOISE_LIMIT
        return noisy or self.late_p99 > LATE_LIMIT * self.interval


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def join_fleet(server: Server, agents: int) -> tuple[list[NodeCredentials], float]:
    """Make a join token on the server and join `agents` nodes with it, as `llmgw agent
    --token` does (a key and CSR each); their credentials and the seconds it took."""
    made = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable, "-m", "llmgw", "nodes", "token", "create", "--json",
            "--admin", f"http://{HOST}:{server.admin_port}",
            "--server", f"{HOST}:{server.agent_port}",
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        raise BenchError(f"llmgw nodes token create failed: {made.stderr.strip()}", server.tail())
    token = parse_join_token(json.loads(made.stdout)["token"])
    address = f"{HOST}:{server.agent_port}"
    gate = asyncio.Semaphore(JOIN_CONCURRENCY)

    async def one(index: int) -> NodeCredentials:
        async with gate:
            for attempt in range(JOIN_ATTEMPTS):
                try:
                    return await join(
                        address,
                        token,
                        node_id=node_name(index),
                        now=datetime.datetime.now(datetime.UTC),
                    )
                except EnrollError as exc:
                    if exc.final or attempt == JOIN_ATTEMPTS - 1:
                        raise BenchError(
                            f"agent {index} could not join: {exc}", server.tail()
                        ) from exc
                await asyncio.sleep(0.5)
            raise AssertionError("unreachable")

    started = time.perf_counter()
    credentials = await asyncio.gather(*(one(i) for i in range(agents)))
    return list(credentials), time.perf_counter() - started


def _pings(server: float | str | None, agent: bool) -> str:
    told = "default" if server == "default" else "off" if server is None else f"{server:g} s"
    return f"server {told}, agents {'5 s' if agent else 'off'}"


async def run_row(
    agents: int,
    window: float,
    args: argparse.Namespace,
    pin: bool,
    pings: tuple[float | str | None, bool] | None = None,
) -> Row:
    """One row; `pings` (the server's ping interval, the agents' pings on) overrides the flags."""
    server_pings, agent_pings = pings or (args.server_pings, args.agent_pings)
    say(f"{agents} agents: starting the server (pings: {_pings(server_pings, agent_pings)})")
    server = Server(
        interval=args.interval,
        pin=pin,
        scale_above=args.scale_above,
        mtls=args.mtls,
        pings=server_pings,
    )
    per_channel = 1 if args.mtls else args.streams_per_channel
    fleet = Fleet(agents=agents, port=server.agent_port, per_channel=per_channel, pings=agent_pings)
    failed = True  # until the row is built: then when it is not ok
    try:
        await server.wait_ready()
        idle_rss = server.rss()
        if args.mtls:
            fleet.credentials, joined = await join_fleet(server, agents)
            say(f"{agents} agents: joined with a token in {joined:.1f} s; one TLS channel each")
        await fleet.connect()
        with ApiProbe(server.api_port) as idle_probe:
            await asyncio.sleep(2.0)
        say(f"{agents} agents: registering over {len(fleet.channels)} channels")
        fleet.start()
        try:
            with ApiProbe(server.api_port) as storm_probe:
                async with asyncio.timeout(REGISTER_TIMEOUT):
                    await fleet.all_registered.wait()
        except TimeoutError:
            raise BenchError(
                f"only {fleet.registered} of {agents} agents registered within "
                f"{REGISTER_TIMEOUT:g} s; first errors: {fleet.errors[:3]}",
                server.tail(),
            ) from None
        api_idle = _pct(idle_probe.latencies, 0.5)
        api_storm = _pct(storm_probe.latencies, 0.5)
        say(
            f"{agents} agents: API port /healthz p50 {api_idle * 1e3:.2f} ms idle, "
            f"{api_storm * 1e3:.2f} ms during the storm ({len(storm_probe.latencies)} probes, "
            f"{storm_probe.errors} failed)"
        )
        say(
            f"{agents} agents: registered in {fleet.registration_seconds:.2f} s; "
            f"settling for one interval ({fleet.interval:g} s)"
        )
        await asyncio.sleep(fleet.interval)
        # A fresh server: everything observed so far is this run's registrations.
        before = await scrape(server.admin_port)
        fleet.late.clear()
        busy0 = core_busy_seconds()
        cpu0, agents_cpu0, t0 = server.cpu_seconds(), time.process_time(), time.perf_counter()
        say(f"{agents} agents: measuring for {window:g} s")
        await asyncio.sleep(window)
        cpu1, agents_cpu1, t1 = server.cpu_seconds(), time.process_time(), time.perf_counter()
        busy1 = core_busy_seconds()
        rss = server.rss()
        after = await scrape(server.admin_port)
        server.check_alive()
        status, body = await asyncio.to_thread(_get, server.admin_port, "/admin/api/nodes")
        if status != 200:
            raise BenchError(f"GET /admin/api/nodes answered {status}: {body[:300]!r}")
        states: dict[str, int] = {}
        for node in json.loads(body)["nodes"]:
            states[node["state"]] = states.get(node["state"], 0) + 1
        delta = after[HEARTBEAT].minus(before[HEARTBEAT])
        register = before["register"]
        if delta.count <= 0:
            fleet.errors.append("the server observed no heartbeat in the window")
        lease_lost, renewals_failed, renewals_slow = server.lease_events()
        row = Row(
            agents=agents,
            interval=fleet.interval,
            window=t1 - t0,
            beats=delta.count,
            server_cpu=cpu1 - cpu0,
            rss=rss,
            idle_rss=idle_rss,
            heartbeat_p50=quantile(0.5, delta.buckets),
            heartbeat_p99=quantile(0.99, delta.buckets),
            heartbeat_mean=delta.total / delta.count if delta.count else math.nan,
            register_p50=quantile(0.5, register.buckets),
            register_p99=quantile(0.99, register.buckets),
            registration_seconds=fleet.registration_seconds,
            states=states,
            agents_cpu=agents_cpu1 - agents_cpu0,
            core_busy={core: busy1[core] - busy0.get(core, 0.0) for core in busy1},
            late_p99=_pct(fleet.late, 0.99),
            late_max=max(fleet.late, default=math.nan),
            errors=list(fleet.errors),
            deferred=fleet.deferred,
            retold=fleet.retold,
            api_idle_p50=api_idle,
            api_storm_p50=api_storm,
            api_storm_p99=_pct(storm_probe.latencies, 0.99),
            api_failed=idle_probe.errors + storm_probe.errors,
            server_pings=server_pings,
            agent_pings=agent_pings,
            lease_lost=lease_lost,
            renewals_failed=renewals_failed,
            renewals_slow=renewals_slow,
        )
        failed = not row.ok
        return row
    finally:
        await fleet.close()
        server.stop()
        server.finish(keep_log=failed)


# --- the report ---------------------------------------------------------------------


def say(message: str) -> None:
    print(f"[agents_heartbeat] {message}", file=sys.stderr, flush=True)


def _tree_state() -> str:
    def git(*argv: str) -> str:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            return subprocess.run(
                ["git", *argv],
                capture_output=True,
                text=True,
                check=True,
                cwd=Path(__file__).parent,
            ).stdout.strip()
        return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--", "../src")
    return f"`{commit}`" + (" + uncommitted changes in src/" if dirty else "")


def machine() -> str:
    cpu_model = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return (
        f"`nproc` = {os.cpu_count()}, {cpu_model}, Python {platform.python_version()}, "
        f"grpcio {grpc.__version__}, Linux {platform.release()}"
    )


def _us(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1e6:,.0f}"


def _ready(row: Row) -> str:
    ready = row.states.get("ready", 0)
    others = ", ".join(f"{n} {s}" for s, n in sorted(row.states.items()) if s != "ready")
    text = f"{ready:,} / {row.agents:,}" + (f" ({others})" if others else "")
    return text if row.ok else f"**{text}**"


def _other_load(row: Row, pinned: bool) -> str:
    if not pinned:
        return "n/a (not pinned)"
    return " / ".join(f"{o:.0f}" for o in row.other_load())


def render(rows: list[Row], args: argparse.Namespace, pinned: bool, command: str) -> str:
    transport = (
        "over mTLS: each agent joined with one join token first (a key and CSR of its own, "
        "as `llmgw agent --token` does) and dials with its node certificate, one TLS "
        "connection per agent"
        if args.mtls
        else f"plaintext, {args.streams_per_channel} streams per channel, each channel its "
        "own TCP connection"
    )
    placement = (
        f"the server pinned to core {SERVER_CORE}, the simulated agents (this process) to "
        f"core {AGENT_CORE}"
        if pinned
        else "nothing pinned (fewer than 2 cores)"
    )
    lines = [
        f"## {rows[-1].agents:,} agents heartbeating against one server",
        "",
        f"`{command}` · {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC · "
        f"{machine()} · tree {_tree_state()}",
        "",
        f"One `llmgw server` (router-only, `--auth-mode open`) on 127.0.0.1, {placement}. "
        f"Each agent is a real grpc.aio `AgentService.Connect` stream ({transport}), "
        f"registers with {GPUS_PER_NODE} declared GPUs, then sends a heartbeat with the "
        f"usage of its {GPUS_PER_NODE} GPUs "
        "every interval, phases spread evenly over the interval. All agents register at "
        "once; the window starts one interval after the last registration.",
        "",
        "| agents | keepalive pings | interval | heartbeats/s | server CPU % | RSS MiB "
        "| handling p50 / p99 µs | registration | told to come back | told a new interval "
        "| nodes ready |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mark = " †" if r.disturbed(pinned) else ""
        lines.append(
            f"| {r.agents:,}{mark} | {_pings(r.server_pings, r.agent_pings)} "
            f"| {r.interval:g} s | {r.beats / r.window:,.1f} "
            f"| {100 * r.server_cpu / r.window:.1f} | {r.rss / MIB:.0f} "
            f"| {_us(r.heartbeat_p50)} / {_us(r.heartbeat_p99)} "
            f"| {r.registration_seconds:.2f} s | {r.deferred:,} | {r.retold:,} | {_ready(r)} |"
        )
    lines += [
        "",
        "| agents | server CPU µs / heartbeat | handling mean µs | register handling "
        "p50 / p99 µs | RSS idle → loaded MiB (KiB / node) | agents' process CPU % "
        "| heartbeat send lateness p99 / max ms | other load on core 0 / core 1 % |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        per_node = (r.rss - r.idle_rss) / 1024 / r.agents
        lines.append(
            f"| {r.agents:,} | {_us(r.server_cpu / r.beats) if r.beats else 'n/a'} "
            f"| {_us(r.heartbeat_mean)} | {_us(r.register_p50)} / {_us(r.register_p99)} "
            f"| {r.idle_rss / MIB:.0f} → {r.rss / MIB:.0f} ({per_node:,.0f}) "
            f"| {100 * r.agents_cpu / r.window:.1f} "
            f"| {r.late_p99 * 1e3:.1f} / {r.late_max * 1e3:.1f} | {_other_load(r, pinned)} |"
        )
    windows = " and ".join(
        f"{r.window:.0f} s ({r.agents:,} agents"
        + (f", best of {r.attempts} attempts" if r.attempts > 1 else "")
        + ")"
        for r in rows
    )
    lines += [
        "",
        f"- Windows: {windows}. Heartbeats/s: heartbeats the server handled in the window "
        "(the histogram's count), per second.",
        "- Server CPU %: utime + stime of the server process (all threads) over the window, "
        "in % of one core; it includes gRPC, protobuf decoding, the event loop and the "
        "server's own loops (health prober, sweeper), so CPU µs / heartbeat is an upper "
        "bound on a heartbeat's full cost. RSS at the end of the window; idle is before "
        "the first agent connected.",
        '- Handling: `llmgw_agent_message_seconds{kind="heartbeat"}` (the time from a decoded '
        "message to the inventory updated), the difference of two /metrics scrapes around "
        "the window, quantiles interpolated inside buckets (edges 10, 15, 20, 30, 50, 75, "
        "100, 150, 200, 300, 500 µs, …) as `histogram_quantile` does; register handling is "
        "every registration of the run.",
        "- Registration: from the first `Register` sent to the last `Registered` received, all "
        "agents at once over already-connected channels; an agent the server told to come "
        "back later (RESOURCE_EXHAUSTED, `llmgw-retry-after-ms`) waits as told and registers "
        "again, as `llmgw agent` does (told to come back: how many times). "
        "Nodes ready: `GET /admin/api/nodes` "
        "after the window (unreachable after three intervals, as told, without a heartbeat).",
        "- Send lateness: how late this process sent heartbeats against their schedule; low "
        "values mean the agents' side did not limit the rate. Other load: each core's busy "
        "time (/proc/stat) less the process pinned there, in % of the window: other "
        "processes and kernel work such as loopback softirqs. † marks a row still disturbed "
        f"(other load above {NOISE_LIMIT:g} % on the server's core, or send lateness p99 "
        f"above {LATE_LIMIT:g} of the interval) after `--retries`: read it with care.",
    ]
    if len(rows) >= 2 and not args.ping_matrix:
        a, b = rows[0], rows[-1]
        rate = b.beats / b.window - a.beats / a.window
        if rate > 0:
            cpu = b.server_cpu / b.window - a.server_cpu / a.window
            lines.append(
                f"- Marginal server CPU per heartbeat between the {a.agents:,} and "
                f"{b.agents:,} agent rows (their CPU difference over their rate "
                f"difference, which cancels the server's idle work): {_us(cpu / rate)} µs."
            )
    lines += [
        "",
        "| agents | API port /healthz p50 idle ms | p50 / p99 during the storm ms "
        "| added p50 ms | probes failed |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.agents:,} | {r.api_idle_p50 * 1e3:.2f} | {r.api_storm_p50 * 1e3:.2f} / "
            f"{r.api_storm_p99 * 1e3:.2f} | {(r.api_storm_p50 - r.api_idle_p50) * 1e3:.2f} "
            f"| {r.api_failed} |"
        )
    lines.append(
        "- API port: `GET /healthz` on the API listener about 50 times a second over one "
        "keep-alive connection, for 2 s before the storm and from the first Register to the "
        "last Registered."
    )
    lines += [
        "",
        "| agents | leadership lease | renewals failed (retried) | renewals slower than TTL/15 |",
        "|---:|---|---:|---:|",
    ]
    for r in rows:
        held = "held" if r.lease_lost == 0 else f"**lost {r.lease_lost} time(s)**"
        lines.append(f"| {r.agents:,} | {held} | {r.renewals_failed} | {r.renewals_slow} |")
    lines.append(
        "- Leadership lease: from the server's log, over the whole row (storm and window); "
        "the only server must hold its lease throughout, or agents are refused as by a "
        "standby."
    )
    failed = [e for r in rows for e in r.errors[:3]]
    if failed:
        lines += ["", "Errors (first 3 per row):", *(f"- {e}" for e in failed)]
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--agents", type=int, default=1000, help="agents of the main row")
    parser.add_argument(
        "--baseline", type=int, default=100, help="agents of the baseline row; 0 skips it"
    )
    parser.add_argument("--interval", type=float, default=5.0, help="heartbeat interval, s")
    parser.add_argument("--window", type=float, default=60.0, help="main row's window, s")
    parser.add_argument(
        "--baseline-window", type=float, default=30.0, help="baseline row's window, s"
    )
    parser.add_argument("--streams-per-channel", type=int, default=50)
    parser.add_argument(
        "--mtls",
        action="store_true",
        help="agents join with a token and dial mTLS with their node certificates, one "
        "TLS connection each (the default path of llmgw agent); --streams-per-channel is ignored",
    )
    parser.add_argument(
        "--scale-above",
        type=int,
        default=None,
        help="control.heartbeat_scale_above for the server (default: the server's own)",
    )
    parser.add_argument(
        "--agent-pings",
        choices=("on", "off"),
        default="on",
        help="the agents' keepalive pings (on: every 5 s, as llmgw agent's defaults)",
    )
    parser.add_argument(
        "--server-pings",
        default="default",
        metavar="SECONDS|off",
        help="control.agent_ping_interval for the server (default: the server's own)",
    )
    parser.add_argument(
        "--ping-matrix",
        action="store_true",
        help="measure the main row with server pings on (--server-pings, else the server's "
        "default) and off, agent pings on and off: four rows, alternating",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=1,
        help="measure a row disturbed by other load again, up to this many times, time allowing",
    )
    parser.add_argument(
        "--time-limit", type=float, default=240.0, help="stop (status 3) after this many s"
    )
    parser.add_argument(
        "--failover",
        action="store_true",
        help="instead of the rows: two servers on a fresh PostgreSQL database (--pg), "
        "--agents mTLS agents registered with the leader, then SIGKILL to the leader; "
        "measures the storm onto the standby (target: all re-registered within "
        f"{FAILOVER_TARGET:g} s)",
    )
    parser.add_argument(
        "--failover-dial",
        choices=("kept", "reuse", "fresh"),
        default="kept",
        help="with --failover: each agent keeps its TLS channel to each server between "
        "dials unless its connection failed, as llmgw agent does (kept); one channel per "
        "agent and server for the whole run, even after its connection failed (reuse: "
        "the servers see what they see with kept, but a dial to the dead leader costs "
        "this one process nothing, as it costs an agent with a host of its own nothing); "
        "or a new channel per dial, as llmgw agent did before (fresh: at thousands of "
        "agents this one process runs out of open files)",
    )
    parser.add_argument(
        "--pg",
        default=os.environ.get("LLMGW_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"),
        help="with --failover: a PostgreSQL URL whose user may create databases; each run "
        "creates a fresh one next to it and drops it after (default: $LLMGW_TEST_PG_URL or "
        "postgresql://postgres@127.0.0.1:5432/test)",
    )
    args = parser.parse_args(argv)
    args.agent_pings = args.agent_pings == "on"
    if args.server_pings == "off":
        args.server_pings = None
    elif args.server_pings != "default":
        try:
            args.server_pings = float(args.server_pings)
        except ValueError:
            parser.error(
                f"--server-pings must be a number of seconds or 'off', not {args.server_pings!r}"
            )
        if args.server_pings <= 0:
            parser.error("--server-pings must be above 0 seconds (or 'off')")
    if args.agents < 1 or args.baseline < 0 or args.streams_per_channel < 1:
        parser.error("--agents and --streams-per-channel must be ≥ 1, --baseline ≥ 0")
    return args


async def run(args: argparse.Namespace, pinned: bool, rows: list[Row]) -> None:
    """Measure the rows into `rows` (so a stopped run keeps the rows it finished)."""
    Pings = tuple[float | str | None, bool] | None
    plan: list[tuple[int, float, Pings]] = (
        [(args.baseline, args.baseline_window, None)] if args.baseline else []
    )
    if args.ping_matrix:
        on = args.server_pings if args.server_pings is not None else "default"
        plan += [
            (args.agents, args.window, pings)
            for pings in ((on, True), (None, True), (on, False), (None, False))
        ]
    else:
        plan.append((args.agents, args.window, None))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.time_limit
    async with asyncio.timeout(args.time_limit):
        for i, (agents, window, pings) in enumerate(plan):
            row = await run_row(agents, window, args, pinned, pings)
            # Measure a disturbed row again if the rows still to come, each with
            # its own retries, still fit: the last row (the main one) comes first.
            later = sum((w + ROW_OVERHEAD) * (1 + args.retries) for _, w, _ in plan[i + 1 :])
            for attempt in range(2, args.retries + 2):
                if not row.disturbed(pinned):
                    break
                if loop.time() + window + ROW_OVERHEAD + later > deadline:
                    say(f"{agents} agents: disturbed, and no time left to measure it again")
                    break
                say(f"{agents} agents: disturbed by other load; measuring again")
                again = await run_row(agents, window, args, pinned, pings)
                again.attempts = attempt
                if again.disturbed(pinned) and again.other_load()[0] > row.other_load()[0]:
                    row.attempts = attempt
                else:
                    row = again
            rows.append(row)


async def main_async(args: argparse.Namespace, pinned: bool, rows: list[Row]) -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    await run(args, pinned, rows)


async def failover_async(args: argparse.Namespace, pinned: bool) -> FailoverResult:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    async with asyncio.timeout(args.time_limit):
        return await run_failover(args, pinned)


T = TypeVar("T")


def run_saying_why(main: Coroutine[Any, Any, T], time_limit: float) -> T | int:
    """`main`'s result, or the exit status when it did not end (2: it could not run,
    3: stopped by --time-limit or a signal), having said why."""
    try:
        return asyncio.run(main)
    except BenchError as exc:
        say(f"cannot run: {exc}")
        if exc.detail:
            print(exc.detail, file=sys.stderr)
        return 2
    except TimeoutError:
        say(f"stopped: the run took longer than --time-limit {time_limit:g} s")
        return 3
    except (KeyboardInterrupt, asyncio.CancelledError):
        say("stopped")
        return 3


def main_failover(args: argparse.Namespace, pinned: bool, command: str) -> int:
    result = run_saying_why(failover_async(args, pinned), args.time_limit)
    if isinstance(result, int):
        return result
    print(render_failover(result, pinned, f".venv/bin/python {command}"))
    return 0 if result.ok else 1


def raise_open_files(wanted: int) -> None:
    """Raise this process's open-file limit towards `wanted` (the hard limit too where
    allowed, as for root): thousands of agents hold a TLS connection each, and with
    --failover 5,000 agents were seen to reach 20,000 open sockets (a join's channel,
    closed, left its connection open until the server went away)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for limit in ((wanted, max(hard, wanted)), (min(wanted, hard), hard)):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, limit)
            return


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_open_files(max(65536, 8 * args.agents))
    command = shlex.join(["bench/agents_heartbeat.py", *(sys.argv[1:] if argv is None else argv)])
    started = time.monotonic()
    # Pin before gRPC starts its threads: they inherit this thread's affinity.
    pinned = (os.cpu_count() or 1) >= 2 and hasattr(os, "sched_setaffinity")
    if pinned:
        os.sched_setaffinity(0, {AGENT_CORE})
    if args.failover:
        status = main_failover(args, pinned, command)
        say(f"wall time {time.monotonic() - started:.0f} s")
        return status
    rows: list[Row] = []
    # Stopped (3), the rows done so far are still reported.
    stopped = run_saying_why(main_async(args, pinned, rows), args.time_limit)
    status = stopped if isinstance(stopped, int) else 0
    if status == 2:
        return 2
    if not rows:
        return status or 1
    print(render(rows, args, pinned, f".venv/bin/python {command}"))
    say(f"wall time {time.monotonic() - started:.0f} s")
    return status or (0 if all(r.ok for r in rows) else 1)


if __name__ == "__main__":
    sys.exit(main())
