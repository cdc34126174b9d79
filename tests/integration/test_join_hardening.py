"""A joined agent's secrets, revoked tokens and silent servers, with real servers and agents.

Builds on the `cluster` fixture of test_agent_join.py (one `llmgw server` with
its default agent listener: mTLS with the cluster CA). Each test does what an
attacker (or an unlucky operator) would: hold on to a revoked token, read an
engine's environment, put a server that never answers first in the list.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
import test_agent_join
from procs import Proc, descendants, free_port_block, llmgw, wait_for
from test_agent_join import Cluster

from llmgw.agent.enroll import fetch_server_chain, verify_server
from llmgw.pki.cluster import cert_pem, parse_join_token, token_client_certificate
from llmgw.proto import agent_pb2, agent_pb2_grpc

cluster = test_agent_join.cluster  # the fixture


def token_channel(address: str, token_text: str) -> grpc.Channel:
    """A channel that presents the token's certificate, as a joining agent does."""
    token = parse_join_token(token_text)
    ca = verify_server(fetch_server_chain(address, timeout=30), token, address)
    presented = token_client_certificate(token, now=datetime.now(UTC))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=cert_pem(ca),
        private_key=presented.key_pem,
        certificate_chain=presented.cert_pem,
    )
    # A connection of its own: never one another channel opened before.
    return grpc.secure_channel(
        address, credentials, options=[("grpc.use_local_subchannel_pool", 1)]
    )


def join_with(channel: grpc.Channel, token_text: str) -> grpc.RpcError:
    """Call Join with a CSR that cannot be signed: a refusal that uses up nothing."""
    stub = agent_pb2_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]
    with pytest.raises(grpc.RpcError) as info:
        stub.Join(
            agent_pb2.JoinRequest(token=token_text, node_id="x1", csr_pem=b"not a csr"), timeout=30
        )
    return info.value


def test_a_revoked_token_fails_the_tls_handshake_at_once(cluster: Cluster) -> None:
    made = cluster.token()
    text = str(made["token"])
    with token_channel(cluster.address, text) as before:
        # Trusted in the handshake: the call reaches Join, which reads the CSR.
        assert join_with(before, text).code() == grpc.StatusCode.INVALID_ARGUMENT
        done = cluster.cli("nodes", "token", "revoke", str(made["id"]))
        assert done.returncode == 0, done.stderr
        # No wait: the revocation is in the listener's trust when the CLI returns.
        with token_channel(cluster.address, text) as after:
            refused = join_with(after, text)
        assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
        # A connection made before the revocation is refused at Join, saying why.
        again = join_with(before, text)
        assert again.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "was revoked" in (again.details() or "")
    assert cluster.server is not None
    assert "joined with token" not in cluster.server.proc.output()


@pytest.mark.timeout(300)
def test_an_engine_does_not_inherit_the_agents_secrets(cluster: Cluster) -> None:
    token = str(cluster.token()["token"])
    low = free_port_block(4)
    agent = Proc(
        llmgw(
            "agent", "--server", cluster.address, "--gpus", "1x24GiB", "--node-id", "env-a",
            "--state-dir", str(cluster.tmp / "state" / "env-a"),
            "--weights-dir", str(cluster.tmp / "weights" / "env-a"),
            "--port-range", f"{low}-{low + 3}",
        ),
        # The token the way `llmgw up` hands it over, and another secret of the agent's.
        env={"LLMGW_JOIN_TOKEN": token, "LLMGW_ADMIN_KEY": "sk-llmgw-not-for-engines"},
    )  # fmt: skip
    cluster.agents.append(agent)
    wait_for(lambda: cluster.ready("env-a"), "env-a to join with the token from its environment")
    answer = cluster.chat()
    assert answer.status_code == 200, answer.text

    def engine_pid() -> int | None:
        for pid in descendants(agent.popen.pid):
            try:
                if b"sim" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                    return pid
            except OSError:
                continue
        return None

    pid = wait_for(engine_pid, "the sim engine the agent started")
    names = {
        entry.split(b"=", 1)[0].decode()
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if entry
    }
    assert "LLMGW_JOIN_TOKEN" not in names
    assert "LLMGW_ADMIN_KEY" not in names
    assert not [name for name in names if name.startswith("LLMGW_")], names
    # What an engine does need is still there.
    assert "PATH" in names and "CUDA_VISIBLE_DEVICES" in names


class SilentListener:
    """Accepts TCP connections and never sends a byte: a frozen server."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.mark.timeout(300)
def test_a_silent_first_server_costs_one_dial_timeout_not_two(cluster: Cluster) -> None:
    silent = SilentListener()
    try:
        token = str(cluster.token()["token"])
        low = free_port_block(4)
        agent = Proc(
            llmgw(
                "agent", "--server", silent.address, "--servers", cluster.address,
                "--token", token, "--node-id", "quiet-a", "--dial-timeout", "1",
                "--gpus", "1x24GiB", "--state-dir", str(cluster.tmp / "state" / "quiet-a"),
                "--weights-dir", str(cluster.tmp / "weights" / "quiet-a"),
                "--port-range", f"{low}-{low + 3}",
            )
        )  # fmt: skip
        cluster.agents.append(agent)
        wait_for(lambda: cluster.ready("quiet-a"), "quiet-a to join past the silent server")
        # Joining waited on the silent server once; connecting went to the one
        # that answered first, instead of waiting on the silent one again.
        assert len(silent.accepted) == 1, agent.output()
        assert "accepted the connection but did not answer" in agent.output()
    finally:
        silent.close()
