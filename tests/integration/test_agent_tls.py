"""mTLS between `llmgw server` and `llmgw agent`, as real processes on loopback.

Certificates are made with `llmgw certs` (as a process) in a temp folder; the
server gets them through `agent_tls` in its config file. One server serves all
the cases: an agent with its node certificate registers under the
certificate's name; one claiming another node id, one without TLS and one with
a certificate from another CA are refused, each with a log line on the agent
that says why (and, for the id, a warning on the server). Waits poll with
deadlines; nothing asserts on durations.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import procs
import pytest
from procs import Proc, Server, free_port, free_port_block, llmgw


def wait_for(check: Callable[[], object], what: str, within: float = 20.0) -> Any:
    """`procs.wait_for` with this module's deadline."""
    return procs.wait_for(check, what, within)


def certs(*args: str) -> str:
    done = subprocess.run(
        llmgw("certs", *args), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@dataclass
class Fleet:
    tmp: Path
    server: Server
    agent_port: int
    ca: Path
    other: Path
    agents: list[Proc]

    def agent(self, *args: str, name: str) -> Proc:
        low = free_port_block(6)
        proc = Proc(
            llmgw(
                "agent", "--server", f"127.0.0.1:{self.agent_port}", "--gpus", "1x24GiB",
                "--weights-dir", str(self.tmp / "weights" / name),
                "--port-range", f"{low}-{low + 5}", *args,
            )
        )  # fmt: skip
        self.agents.append(proc)
        return proc

    def tls(self, ca: Path, node: str) -> list[str]:
        return [
            "--tls-ca", str(self.ca / "ca.crt"),
            "--tls-cert", str(ca / f"node-{node}.crt"),
            "--tls-key", str(ca / f"node-{node}.key"),
        ]  # fmt: skip

    def nodes(self) -> dict[str, dict[str, object]]:
        listed = httpx.get(self.server.admin + "/admin/api/nodes", timeout=5).json()["nodes"]
        return {n["id"]: n for n in listed}


def config(tmp: Path, ca: Path, *, key: Path | None = None) -> Path:
    path = tmp / f"llmgw-{free_port()}.yaml"
    path.write_text(
        "control: {heartbeat_interval: 0.3, unreachable_after: 1.5, lost_after: 3}\n"
        "agent_tls:\n"
        f"  cert: {ca / 'server-127.0.0.1.crt'}\n"
        f"  key: {key or ca / 'server-127.0.0.1.key'}\n"
        f"  ca: {ca / 'ca.crt'}\n"
    )
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("tls")
    ca, other = tmp / "ca", tmp / "other"
    certs("init", "--dir", str(ca))
    out = certs("issue", "--dir", str(ca), "--server", "127.0.0.1", "--server", "localhost")
    assert "agent_tls:" in out
    certs("issue", "--dir", str(ca), "--node", "node-a")
    certs("init", "--dir", str(other))
    certs("issue", "--dir", str(other), "--node", "node-x")
    agent_port = free_port()
    server = Server(
        "--endpoint", "x=http://127.0.0.1:1=unused", "--agent-listen", f"127.0.0.1:{agent_port}",
        "--config", str(config(tmp, ca)), data_dir=tmp / "data", wait_ready=False,
        insecure_agents=False,
    )  # fmt: skip
    made = Fleet(tmp=tmp, server=server, agent_port=agent_port, ca=ca, other=other, agents=[])
    try:
        yield made
    finally:
        for proc in made.agents:
            proc.stop()
        server.proc.stop()


def test_the_server_says_the_agent_listener_uses_mtls(fleet: Fleet) -> None:
    output = fleet.server.proc.output()
    assert f"agent listener on 127.0.0.1:{fleet.agent_port} uses mTLS" in output
    assert "PLAINTEXT" not in output


def test_an_agent_with_its_node_certificate_registers_under_its_name(fleet: Fleet) -> None:
    # No --node-id: it defaults to the certificate's name.
    agent = fleet.agent(*fleet.tls(fleet.ca, "node-a"), name="a")
    wait_for(lambda: "node-a" in fleet.nodes(), "node-a to register")
    assert fleet.nodes()["node-a"]["state"] == "ready"
    assert "with mTLS as node-a" in agent.output()


def test_an_agent_registering_as_another_node_is_refused(fleet: Fleet) -> None:
    agent = fleet.agent(*fleet.tls(fleet.ca, "node-a"), "--node-id", "node-b", name="b")
    wait_for(lambda: "refused this agent" in agent.output(), "the agent to be refused")
    assert "certificate is for node 'node-a' but the agent registered as 'node-b'" in agent.output()
    wait_for(lambda: "registered as 'node-b'" in fleet.server.proc.output(), "the server's warning")
    warning = next(
        line for line in fleet.server.proc.output().splitlines() if "registered as 'node-b'" in line
    )
    assert "WARNING" in warning and "refused an agent from ipv4:127.0.0.1:" in warning
    assert "certificate is for node 'node-a'" in warning
    assert "node-b" not in fleet.nodes()
    assert agent.popen.poll() is None  # it keeps trying, with backoff


def test_a_plaintext_agent_is_told_the_server_requires_tls(fleet: Fleet) -> None:
    agent = fleet.agent("--node-id", "node-p", name="p")
    wait_for(lambda: "it probably requires TLS" in agent.output(), "the agent's diagnosis")
    assert "start the agent with --tls-ca/--tls-cert/--tls-key" in agent.output()
    assert "join this node with --token TOKEN" in agent.output()
    assert "node-p" not in fleet.nodes()


def test_an_agent_with_a_certificate_from_another_ca_is_refused(fleet: Fleet) -> None:
    agent = fleet.agent(*fleet.tls(fleet.other, "node-x"), name="x")
    wait_for(
        lambda: "closed the connection during the TLS handshake" in agent.output(),
        "the agent's diagnosis",
    )
    assert "node-x" not in fleet.nodes()


def test_a_tls_file_that_cannot_be_read_stops_the_server_naming_the_field(fleet: Fleet) -> None:
    missing = fleet.tmp / "missing.key"
    proc = Proc(
        llmgw(
            "server", "--listen", f"127.0.0.1:{free_port()}",
            "--admin-listen", f"127.0.0.1:{free_port()}", "--auth-mode", "open",
            "--data-dir", str(fleet.tmp / "data-bad"),
            "--agent-listen", f"127.0.0.1:{free_port()}",
            "--endpoint", "x=http://127.0.0.1:1=unused",
            "--config", str(config(fleet.tmp, fleet.ca, key=missing)),
        )
    )  # fmt: skip
    try:
        proc.popen.wait(60)
        assert proc.popen.returncode != 0
        assert f"agent_tls.key: {missing}: cannot read the private key" in proc.output()
    finally:
        proc.stop()
