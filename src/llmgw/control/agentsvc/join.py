"""The agent listener with the cluster CA: Join and Renew, and a node certificate before Connect.

`ClusterAgentService` is what the listener serves when the server uses the
store's CA (the default). It answers `Join` (the caller's client certificate
is a join token's, see `llmgw.pki.cluster`) and `Renew` (the caller's is a
node certificate) through `ClusterPki`, and lets `Connect` through to the
`AgentServicer` only for a node certificate: any other caller gets
UNAUTHENTICATED with the command that joins a node. A refused Join or Renew
ends with the status and message `ClusterPki` gives (expired, revoked or
used-up token; a node id another key owns; a revoked key), which the agent
prints.

`serve_cluster_agents` binds the listener with `ClusterPki.server_credentials()`:
TLS, client certificates required (gRPC's Python server cannot make them
optional), trust following the CA and the usable tokens without a restart.

Not guaranteed: a log line of ours for a client that fails the handshake (a
plaintext agent); gRPC's core logs "Handshake failed" itself, and the agent
says what to do.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from llmgw.control.agentsvc.cluster_pki import ClusterPki, Issued, Peer, Refusal
from llmgw.control.agentsvc.errors import AgentListenerError
from llmgw.control.agentsvc.server import SERVER_PING_INTERVAL_MS, AgentListener, server_options
from llmgw.control.agentsvc.servicer import AgentServicer
from llmgw.proto import agent_pb2, agent_pb2_grpc
from llmgw.store import StoreError

log = logging.getLogger("llmgw.control.agentsvc")

StreamContext = grpc.aio.ServicerContext[agent_pb2.AgentMessage, agent_pb2.ServerMessage]
JoinContext = grpc.aio.ServicerContext[agent_pb2.JoinRequest, agent_pb2.JoinResponse]
RenewContext = grpc.aio.ServicerContext[agent_pb2.RenewRequest, agent_pb2.RenewResponse]

JOIN_HINT = (
    "join this node first: `llmgw agent --server HOST:PORT --token TOKEN` (get a token with "
    "`llmgw nodes token create`)"
)


def _peer(pki: ClusterPki, context: grpc.aio.ServicerContext[object, object]) -> Peer:
    return pki.classify(list(context.auth_context().get("x509_pem_cert", ())))


class ClusterAgentService(agent_pb2_grpc.AgentServiceServicer):
    """Connect (node certificates only), Join and Renew over the cluster CA."""

    def __init__(self, *, streams: AgentServicer, pki: ClusterPki) -> None:
        self._streams = streams
        self._pki = pki

    async def Connect(
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: StreamContext
    ) -> None:
        peer = _peer(self._pki, context)  # type: ignore[arg-type]
        if peer.kind != "node":
            what = "a join token's certificate" if peer.kind == "join" else "no node certificate"
            log.info("refused an agent stream from %s: it has %s", context.peer(), what)
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"this agent has {what} from this cluster's CA; {JOIN_HINT}",
            )
        await self._streams.Connect(request_iterator, context)

    async def Join(
        self, request: agent_pb2.JoinRequest, context: JoinContext
    ) -> agent_pb2.JoinResponse:
        peer = _peer(self._pki, context)  # type: ignore[arg-type]
        try:
            issued = await self._pki.join(
                peer, token_text=request.token, node_id=request.node_id, csr_pem=request.csr_pem
            )
        except Refusal as exc:
            log.warning(
                "refused a Join from %s as node %r: %s", context.peer(), request.node_id, exc
            )
            await context.abort(exc.code, exc.message)
        except StoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the store is unavailable: {exc}")
        return _join_response(issued)

    async def Renew(
        self, request: agent_pb2.RenewRequest, context: RenewContext
    ) -> agent_pb2.RenewResponse:
        peer = _peer(self._pki, context)  # type: ignore[arg-type]
        try:
            issued = await self._pki.renew(peer, csr_pem=request.csr_pem)
        except Refusal as exc:
            log.warning("refused a Renew from %s: %s", context.peer(), exc)
            await context.abort(exc.code, exc.message)
        except StoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the store is unavailable: {exc}")
        return agent_pb2.RenewResponse(certificate_pem=issued.certificate_pem, ca_pem=issued.ca_pem)


def _join_response(issued: Issued) -> agent_pb2.JoinResponse:
    return agent_pb2.JoinResponse(
        certificate_pem=issued.certificate_pem,
        ca_pem=issued.ca_pem,
        node_id=issued.node_id,
        labels=dict(issued.labels),
    )


async def serve_cluster_agents(
    *,
    servicer: AgentServicer,
    pki: ClusterPki,
    host: str,
    port: int,
    ping_interval: float | None = SERVER_PING_INTERVAL_MS / 1000,
) -> AgentListener:
    """Start the agent listener with the cluster CA's credentials; `AgentListenerError` if not."""
    server = grpc.aio.server(options=server_options(ping_interval))
    service = ClusterAgentService(streams=servicer, pki=pki)
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_secure_port(address, pki.server_credentials())
    except RuntimeError as exc:
        bound, reason = 0, str(exc)
    else:
        reason = "the address is in use or not on this host"
    if bound == 0:
        await server.stop(None)
        raise AgentListenerError(
            f"cannot listen for agents on {address}: {reason}; pick another "
            "--agent-listen address, or 'off'"
        )
    await server.start()
    log.info(
        "agent listener on %s:%d uses mTLS with the cluster CA (sha256 of its key %s): nodes "
        "join with a token and register under their certificate's name",
        host,
        bound,
        pki.ca_hash,
    )
    return AgentListener(server=server, servicer=servicer, host=host, port=bound)
