"""The cluster CA's agent listener in-process: Join over TLS, Connect only with a node certificate,
and a renewed server certificate taken up by new connections while streams stay open.

A real `ClusterPki` on a real SQLite store, the real gRPC listener on loopback
(`serve_cluster_agents`), and the agent's own `join` and `fetch_server_chain`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from pki_fixtures import now, opened_pki
from placement_fixtures import placements_fixture  # noqa: F401
from test_agentsvc_stream import register_message

from llmgw.agent.enroll import NodeCredentials, fetch_server_chain, join
from llmgw.control.agentsvc import AgentListener, AgentServicer
from llmgw.control.agentsvc.cluster_pki import ClusterPki
from llmgw.control.agentsvc.join import serve_cluster_agents
from llmgw.control.inventory import Inventory
from llmgw.control.placements import PlacementBook
from llmgw.pki.cluster import (
    cert_pem,
    parse_join_token,
    token_client_certificate,
)
from llmgw.proto import agent_pb2, agent_pb2_grpc

Call = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ServerMessage]


@pytest.fixture
async def served(
    tmp_path: Path, placements: PlacementBook
) -> AsyncIterator[tuple[ClusterPki, AgentListener, Inventory]]:
    async with opened_pki(tmp_path) as (store, pki):
        loop = asyncio.get_running_loop()
        inventory = Inventory(
            clock=loop.time, wall_clock=now, unreachable_after=15.0, lost_after=60.0
        )
        servicer = AgentServicer(
            inventory=inventory, placements=placements, heartbeat_interval=5.0, leader_id="s:1",
            server_version="9.9.9", command_timeout=5.0, require_identity=True,
            identities=store.nodeids,
        )  # fmt: skip
        listener = await serve_cluster_agents(servicer=servicer, pki=pki, host="127.0.0.1", port=0)
        try:
            yield pki, listener, inventory
        finally:
            await listener.stop(0)


async def connect(port: int, creds: NodeCredentials) -> tuple[grpc.aio.Channel, Call]:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=creds.ca_pem, private_key=creds.key_pem, certificate_chain=creds.cert_pem
    )
    chan = grpc.aio.secure_channel(
        f"127.0.0.1:{port}", credentials, options=[("grpc.use_local_subchannel_pool", 1)]
    )
    call: Call = agent_pb2_grpc.AgentServiceStub(chan).Connect()
    await call.write(agent_pb2.AgentMessage(register=register_message(creds.node_id)))
    return chan, call


async def test_a_joined_node_registers_and_a_token_certificate_cannot_open_a_stream(
    served: tuple[ClusterPki, AgentListener, Inventory],
) -> None:
    pki, listener, inventory = served
    text, _ = await pki.create_token(ttl=timedelta(hours=1), max_uses=None, labels={})
    token = parse_join_token(text)
    address = f"127.0.0.1:{listener.port}"

    creds = await join(address, token, node_id="gpu-1", now=now())
    chan, call = await connect(listener.port, creds)
    reply = await asyncio.wait_for(call.read(), 10)
    assert isinstance(reply, agent_pb2.ServerMessage) and reply.HasField("registered")
    assert inventory.node("gpu-1").connected

    # The certificate a joining agent presents opens no stream, and says how to join.
    presented = token_client_certificate(token, now=now())
    as_joiner = NodeCredentials(
        key_pem=presented.key_pem, cert_pem=presented.cert_pem, ca_pem=creds.ca_pem
    )
    bad_chan = grpc.aio.secure_channel(
        address,
        grpc.ssl_channel_credentials(
            root_certificates=creds.ca_pem,
            private_key=as_joiner.key_pem,
            certificate_chain=as_joiner.cert_pem,
        ),
        options=[("grpc.use_local_subchannel_pool", 1)],
    )
    refused_call: Call = agent_pb2_grpc.AgentServiceStub(bad_chan).Connect()
    # Nothing is written: the listener refuses before it reads a message, and a
    # write racing that refusal may fail without the server's status.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await asyncio.wait_for(refused_call.read(), 10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "llmgw agent --server HOST:PORT --token TOKEN" in (refused.value.details() or "")
    await bad_chan.close()

    # A renewed server certificate is presented to new connections; the stream stays.
    before = (await asyncio.to_thread(fetch_server_chain, address, timeout=10))[0]
    await pki._issue_server_certificate()
    after = (await asyncio.to_thread(fetch_server_chain, address, timeout=10))[0]
    assert after.serial_number != before.serial_number
    assert cert_pem(after) == cert_pem(pki.server_certificate)
    await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sequence=1)))
    assert not call.done() and inventory.node("gpu-1").connected
    # A new connection verifies the renewed certificate against the same CA.
    second, second_call = await connect(listener.port, creds)
    again = await asyncio.wait_for(second_call.read(), 10)
    assert isinstance(again, agent_pb2.ServerMessage) and again.HasField("registered")
    for done in (second_call, call):
        done.cancel()
    await second.close()
    await chan.close()


async def test_a_node_keeps_its_join_token_s_labels_whatever_its_agent_declares(
    served: tuple[ClusterPki, AgentListener, Inventory],
) -> None:
    pki, listener, inventory = served
    text, _ = await pki.create_token(
        ttl=timedelta(hours=1), max_uses=1, labels={"zone": "a"}, fabric={"ib-domain": "pod1"}
    )
    creds = await join(
        f"127.0.0.1:{listener.port}", parse_join_token(text), node_id="gpu-1", now=now()
    )
    assert dict(creds.labels) == {"zone": "a"}
    credentials = grpc.ssl_channel_credentials(
        root_certificates=creds.ca_pem, private_key=creds.key_pem, certificate_chain=creds.cert_pem
    )
    chan = grpc.aio.secure_channel(
        f"127.0.0.1:{listener.port}", credentials, options=[("grpc.use_local_subchannel_pool", 1)]
    )
    call: Call = agent_pb2_grpc.AgentServiceStub(chan).Connect()
    # The node's own certificate, declaring another zone and fabric, and a label of its own.
    declared = register_message("gpu-1")
    declared.labels.clear()
    declared.labels.update({"zone": "b", "gpu": "l40s"})
    declared.fabric.clear()
    declared.fabric.update({"ib-domain": "pod9", "rack": "7"})
    await call.write(agent_pb2.AgentMessage(register=declared))
    reply = await asyncio.wait_for(call.read(), 10)
    assert reply.HasField("registered")
    node = inventory.node("gpu-1")
    assert dict(node.labels) == {"zone": "a", "gpu": "l40s"}
    assert dict(node.fabric) == {"ib-domain": "pod1", "rack": "7"}
    call.cancel()
    await chan.close()
