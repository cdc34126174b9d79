"""Starting the agent listener, and the loop that ages nodes between heartbeats.

`serve_agents` binds the gRPC server for `AgentServicer` and starts it;
`AgentListener.stop` ends every agent stream, then stops the server with a
grace. `run_sweeper` calls `sweep()` on an interval so nodes that stopped
heartbeating become unreachable, then lost.

With `tls`, the listener speaks TLS and requires a client certificate signed
by `tls.ca` (mTLS); the files are read and checked before binding, and a bad
one is an `AgentListenerError` naming the file and its `agent_tls.*` field.
Without it the listener is plaintext (`--insecure-agents`; the default, mTLS
with the cluster CA, is `join.serve_cluster_agents`) and a warning says so.
The server accepts the agents' keepalive pings (every few seconds, even with no data flowing
back) instead of answering GOAWAY "too_many_pings".

Not guaranteed: a log line of ours for a client that fails the TLS handshake
(a plaintext agent, a certificate from another CA). gRPC refuses it inside its
core and says so on stderr only at GRPC_VERBOSITY=INFO (`llmgw` keeps gRPC's
own logging to errors by default); the agent's own log says why it was refused
and what to do.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from llmgw import pki
from llmgw.config import AgentTLSConfig
from llmgw.control.agentsvc.errors import AgentListenerError
from llmgw.control.agentsvc.servicer import AgentServicer
from llmgw.proto import agent_pb2_grpc

log = logging.getLogger("llmgw.control.agentsvc")

# Agents ping every few seconds (see the agent's ConnectionSettings) to notice a
# server that stopped answering. gRPC's default server policy allows one ping
# per 5 minutes while it sends no data, and agents' streams carry almost none
# downwards: the third early ping would get GOAWAY "too_many_pings". Allow one
# per second, with or without calls; that is still a bound on a ping flood.
MIN_AGENT_PING_INTERVAL_MS = 1000
SERVER_PING_INTERVAL_MS = 10_000
SERVER_PING_TIMEOUT_MS = 10_000
# Streams gRPC core may hold before the server takes them: twice the largest fleet
# one server is built for (10,000 nodes), all reconnecting at once.
MAX_PENDING_STREAMS = 20_000


def server_options(
    ping_interval: float | None = SERVER_PING_INTERVAL_MS / 1000,
) -> list[tuple[str, int]]:
    """The agent listener's gRPC options; `ping_interval` (seconds, None: no pings) is
    how often the server pings each connection (`control.agent_ping_interval`)."""
    options = [
        # gRPC sets SO_REUSEPORT by default: a second server on the same port would
        # bind silently and share the agents. Refuse instead.
        ("grpc.so_reuseport", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_AGENT_PING_INTERVAL_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        # gRPC core queues a new stream until the application asks for the next call;
        # above `max_pending_requests` (default 1,000) queued streams it cancels new ones
        # at random, above the hard limit (default 3,000) all of them, and the agent sees
        # `INTERNAL: Internal error from Core` with nothing logged here. In a registration
        # storm (every node reconnecting after a failover) thousands of streams arrive
        # faster than the event loop takes them: ~1,800-2,300 streams in the measured
        # storms. llmgw paces registrations itself (RESOURCE_EXHAUSTED with a retry
        # delay, once the Register is read), so core may queue a whole fleet's streams.
        ("grpc.server.max_pending_requests", MAX_PENDING_STREAMS),
        ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_PENDING_STREAMS),
    ]
    if ping_interval is not None:
        # The server pings too: the stream of an agent whose host vanished (no FIN,
        # no RST) ends within keepalive time + timeout instead of never (the server
        # writes almost nothing to an agent, so TCP has nothing to time out), so the
        # node shows as disconnected and the connection is freed.
        options += [
            ("grpc.keepalive_time_ms", int(ping_interval * 1000)),
            ("grpc.keepalive_timeout_ms", SERVER_PING_TIMEOUT_MS),
            # gRPC core (1.85) times an unanswered ping out after this, not after the
            # keepalive timeout alone (default 60 s), as the agent's options do too.
            ("grpc.http2.ping_timeout_ms", SERVER_PING_TIMEOUT_MS),
        ]
    else:
        # gRPC's server default is a ping every 2 hours; off means off.
        options.append(("grpc.keepalive_time_ms", 2**31 - 1))
    return options


@dataclass(frozen=True, slots=True)
class AgentListener:
    """A started agent listener; `port` is the bound port (useful with port 0)."""

    server: grpc.aio.Server
    servicer: AgentServicer
    host: str
    port: int

    async def stop(self, grace: float) -> None:
        """End every agent stream (agents reconnect elsewhere), then stop within `grace` s."""
        await self.servicer.close_all("the server is shutting down")
        await self.server.stop(grace)


def server_credentials(tls: AgentTLSConfig) -> grpc.ServerCredentials:
    """mTLS credentials from the `agent_tls` files; raises `AgentListenerError` naming one."""
    try:
        material = pki.load_tls_material(
            cert=Path(tls.cert).expanduser(),
            key=Path(tls.key).expanduser(),
            ca=Path(tls.ca).expanduser(),
        )
    except pki.PkiFileError as exc:
        raise AgentListenerError(
            f"agent_tls.{exc.role or 'cert'}: {exc}; fix the path in the config file (files from "
            "`llmgw certs init` and `llmgw certs issue --server HOST`)"
        ) from exc
    return grpc.ssl_server_credentials(
        [(material.key, material.cert)],
        root_certificates=material.ca,
        require_client_auth=True,
    )


async def serve_agents(
    *,
    servicer: AgentServicer,
    host: str,
    port: int,
    tls: AgentTLSConfig | None = None,
    ping_interval: float | None = SERVER_PING_INTERVAL_MS / 1000,
) -> AgentListener:
    """Start the gRPC server for the agents on host:port; raises `AgentListenerError`.

    With `tls`: TLS, and agents must present a certificate signed by `tls.ca`.
    """
    # Before creating the server: a bad file then leaves nothing to clean up.
    credentials = None if tls is None else server_credentials(tls)
    server = grpc.aio.server(options=server_options(ping_interval))
    # Generated code carries no annotations (it is excluded from type checks).
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        bound = 0
        reason = str(exc)
    else:
        reason = "the address is in use or not on this host"
    if bound == 0:
        # Nothing was started, but the server object holds resources until stopped.
        await server.stop(None)
        raise AgentListenerError(
            f"cannot listen for agents on {address}: {reason}; pick another "
            "--agent-listen address, or 'off'"
        )
    await server.start()
    if tls is None:
        log.warning(
            "agent listener on %s:%d is PLAINTEXT (no TLS, no client certificates): any host "
            "that reaches it can register as any node; it belongs on a trusted network only "
            "(restart without --insecure-agents for mTLS with the cluster CA)",
            host,
            bound,
        )
    else:
        log.info(
            "agent listener on %s:%d uses mTLS: agents need a certificate from the CA in %s, "
            "and a node registers under its certificate's name",
            host,
            bound,
            tls.ca,
        )
    return AgentListener(server=server, servicer=servicer, host=host, port=bound)


class Sweepable(Protocol):
    def sweep(self) -> object: ...


async def run_sweeper(
    *, inventory: Sweepable, interval: float, sleep: Callable[[float], Awaitable[None]]
) -> None:
    """Sweep every `interval` s, forever; the inventory logs each node it moves.

    Meant to run under the process's task guard, which logs an unexpected end.
    """
    while True:
        await sleep(interval)
        inventory.sweep()
