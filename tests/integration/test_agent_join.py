"""Joining a node with a token, as real processes on loopback: the default, secure agent listener.

One `llmgw server` per test with its default agent listener (mTLS with the
cluster CA kept in the store). Agents join with tokens from `llmgw nodes token
create` or the line the server prints at start-up, keep their certificate in
their --state-dir, serve a sim model through the router, come back without a
token, survive a server restart and renew short-lived certificates. Bad
tokens are refused and the agent says why; a token made for another cluster
is refused by the agent before it sends anything. Waits poll with deadlines.
"""

from __future__ import annotations

import json
import re
import sqlite3
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for

CONTROL = (
    "control: {heartbeat_interval: 0.3, unreachable_after: 1.5, lost_after: 3, "
    "reconcile_interval: 0.5, retry_base: 1, retry_max: 4, activation_timeout: 60, "
    "stop_grace: 2%s}\n"
    "router: {health: {interval: 0.5}}\n"
    "models:\n"
    "  - name: sim-join\n    weights: none\n"
    "    profiles: [{name: sim, engine: sim, gpus: 1}]\n"
)


@dataclass
class Cluster:
    tmp: Path
    agent_port: int
    control: str
    server: Server | None = None
    agents: list[Proc] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    def start_server(self) -> Server:
        config = self.tmp / "llmgw.yaml"
        config.write_text(CONTROL % self.control)
        self.server = Server(
            "--agent-listen", self.address, "--config", str(config),
            data_dir=self.tmp / "data", insecure_agents=False,
        )  # fmt: skip
        return self.server

    @property
    def admin(self) -> str:
        assert self.server is not None
        return self.server.admin

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            llmgw(*args, "--admin", self.admin), capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip

    def token(self, *args: str) -> dict[str, object]:
        done = self.cli("nodes", "token", "create", "--json", *args)
        assert done.returncode == 0, done.stderr
        made: dict[str, object] = json.loads(done.stdout)
        return made

    def agent(self, name: str, *args: str, state: Path | None = None) -> Proc:
        low = free_port_block(4)
        proc = Proc(
            llmgw(
                "agent", "--server", self.address, "--gpus", "1x24GiB",
                "--state-dir", str(state or self.tmp / "state" / name),
                "--weights-dir", str(self.tmp / "weights" / name),
                "--port-range", f"{low}-{low + 3}", *args,
            )
        )  # fmt: skip
        self.agents.append(proc)
        return proc

    def nodes(self) -> dict[str, dict[str, object]]:
        listed = httpx.get(self.admin + "/admin/api/nodes", timeout=10).json()["nodes"]
        return {n["id"]: n for n in listed}

    def ready(self, node: str) -> bool:
        return self.nodes().get(node, {}).get("state") == "ready"

    def chat(self) -> httpx.Response:
        assert self.server is not None
        return httpx.post(
            f"{self.server.url}/v1/chat/completions",
            json={"model": "sim-join", "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 4},
            timeout=90,
        )  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    # Extra `control:` settings come as an indirect parameter (short lifetimes).
    made = Cluster(tmp=tmp_path, agent_port=free_port(), control=getattr(request, "param", ""))
    made.start_server()
    try:
        yield made
    except BaseException:
        if made.server is not None:
            print(made.server.proc.output())
        raise
    finally:
        for proc in made.agents:
            proc.stop()
        if made.server is not None:
            made.server.proc.stop()


def exited(proc: Proc, within: float = 60.0) -> int:
    wait_for(lambda: proc.popen.poll() is not None, "the agent to exit", within)
    return proc.popen.returncode


@pytest.mark.timeout(300)
def test_a_node_joins_with_the_printed_token_serves_and_comes_back_without_it(
    cluster: Cluster,
) -> None:
    server = cluster.server
    assert server is not None
    # Printed once the listeners are up, which is when the server answers /readyz: wait.
    printed = wait_for(
        lambda: re.search(
            rf"llmgw agent --server {cluster.address} --token (\S+)", server.proc.output()
        ),
        "the server to print the join command",
    )
    token = printed.group(1)

    agent = cluster.agent("gpu-a", "--token", token, "--node-id", "gpu-a")
    wait_for(lambda: cluster.ready("gpu-a"), "gpu-a to join and register")
    assert "joined the cluster through" in agent.output()
    response = cluster.chat()
    assert response.status_code == 200, response.text

    tls = cluster.tmp / "state" / "gpu-a" / "tls"
    for name in ("node.key", "node.crt", "ca.crt"):
        assert stat.S_IMODE((tls / name).stat().st_mode) == 0o600, name
    secret = token.rsplit(".", 1)[1]
    with sqlite3.connect(cluster.tmp / "data" / "llmgw.db") as db:
        rows = db.execute("SELECT * FROM join_tokens").fetchall()
    assert rows and not any(secret in str(value) for row in rows for value in row)

    # A restart needs no token; one given again is ignored.
    agent.stop()
    wait_for(lambda: not cluster.ready("gpu-a"), "gpu-a to go away")
    again = cluster.agent("gpu-a", "--token", token)
    wait_for(lambda: "registered as gpu-a" in again.output(), "gpu-a to come back")
    assert "ignoring --token" in again.output()
    again.stop()
    plain = cluster.agent("gpu-a")
    wait_for(lambda: "registered as gpu-a" in plain.output(), "gpu-a to come back, no token")

    # A restarted server keeps its CA (in the store), so the node reconnects.
    assert cluster.server is not None
    cluster.server.proc.stop()
    cluster.start_server()
    wait_for(
        lambda: plain.output().count("registered as gpu-a") == 2,
        "gpu-a to reconnect to the restarted server",
    )
    wait_for(lambda: cluster.ready("gpu-a"), "gpu-a to be ready on the restarted server")
    assert cluster.chat().status_code == 200


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "cluster", [", node_cert_lifetime: 12, server_cert_lifetime: 15"], indirect=True
)
def test_short_lived_certificates_are_renewed_and_the_stream_keeps_working(
    cluster: Cluster,
) -> None:
    made = cluster.token("--labels", "rack=r7")
    agent = cluster.agent("gpu-r", "--token", str(made["token"]), "--node-id", "gpu-r")
    wait_for(lambda: cluster.ready("gpu-r"), "gpu-r to join")
    assert cluster.nodes()["gpu-r"]["labels"] == {"rack": "r7"}
    wait_for(
        lambda: agent.output().count("renewed this node's certificate") >= 2,
        "two renewals of the node's certificate",
        within=90,
    )
    assert cluster.server is not None
    wait_for(
        lambda: "renewing this server's certificate" in cluster.server.proc.output(),  # type: ignore[union-attr]
        "the server to renew its own certificate",
        within=60,
    )
    # Renewals do not disturb the stream: one registration, the node still ready.
    assert agent.output().count("registered as gpu-r") == 1, agent.output()
    assert cluster.ready("gpu-r")
    # The renewed certificate is used from the next dial: restart the stream.
    agent.stop()
    back = cluster.agent("gpu-r")
    wait_for(lambda: "registered as gpu-r" in back.output(), "gpu-r to reconnect, renewed")
    wait_for(lambda: cluster.ready("gpu-r"), "gpu-r to be ready again")
    response = cluster.chat()
    assert response.status_code == 200, response.text
    assert "refused" not in back.output()
    with sqlite3.connect(cluster.tmp / "data" / "llmgw.db") as db:
        issued = db.execute(
            "SELECT COUNT(*) FROM issued_certificates WHERE kind = 'node' AND subject = 'gpu-r'"
        ).fetchone()[0]
    assert issued >= 3


@pytest.mark.timeout(300)
def test_spent_tokens_are_refused_and_the_agent_says_why(cluster: Cluster) -> None:
    once = cluster.token("--uses", "1")
    first = cluster.agent("n1", "--token", str(once["token"]), "--node-id", "n1")
    wait_for(lambda: cluster.ready("n1"), "n1 to join")
    second = cluster.agent("n2", "--token", str(once["token"]), "--node-id", "n2")
    assert exited(second) == 2
    assert "used up" in second.output()
    assert "llmgw nodes token create" in second.output()

    revoked = cluster.token()
    done = cluster.cli("nodes", "token", "revoke", str(revoked["id"]))
    assert done.returncode == 0, done.stderr
    refused = cluster.agent("n3", "--token", str(revoked["token"]), "--node-id", "n3")
    assert exited(refused) == 2
    assert "was revoked" in refused.output()

    short = cluster.token("--ttl", "1s")
    time.sleep(1.5)  # the token's lifetime itself, not a wait for a process
    late = cluster.agent("n4", "--token", str(short["token"]), "--node-id", "n4")
    assert exited(late) == 2
    assert "expired" in late.output()

    bad_ttl = cluster.cli("nodes", "token", "create", "--ttl", "soon")
    assert bad_ttl.returncode == 2 and "error: --ttl 'soon'" in bad_ttl.stderr
    unknown = cluster.cli("nodes", "token", "revoke", "nosuch")
    assert unknown.returncode == 2 and "no join token 'nosuch'" in unknown.stderr

    listed = cluster.cli("nodes", "token", "list")
    assert listed.returncode == 0
    assert "used up" in listed.stdout and "revoked" in listed.stdout and "expired" in listed.stdout
    assert set(cluster.nodes()) == {"n1"}
    first.stop()


def test_a_token_for_another_cluster_is_refused_before_anything_is_sent(
    cluster: Cluster,
) -> None:
    made = cluster.token()
    text = str(made["token"])
    prefix, _, rest = text.split(":")
    wrong = f"{prefix}:{'0' * 64}:{rest}"
    agent = cluster.agent("x1", "--token", wrong, "--node-id", "x1")
    assert exited(agent) == 2
    assert "is not the cluster this token was made for" in agent.output()
    assert "Nothing was sent to it" in agent.output()
    listed = json.loads(cluster.cli("nodes", "token", "list", "--json").stdout)
    assert next(t for t in listed if t["id"] == made["id"])["uses"] == 0
    assert cluster.server is not None
    server_log = cluster.server.proc.output()
    assert "Join" not in server_log and "joined with token" not in server_log
    assert "x1" not in cluster.nodes()


def test_a_plaintext_agent_is_told_to_join_with_a_token(cluster: Cluster) -> None:
    agent = cluster.agent("p1", "--node-id", "p1")
    wait_for(lambda: "join this node with --token TOKEN" in agent.output(), "the agent's advice")
    assert "p1" not in cluster.nodes()


def test_insecure_agents_are_announced_loudly_and_on_the_overview(cluster: Cluster) -> None:
    secure = httpx.get(cluster.admin + "/admin/", timeout=10)
    assert secure.status_code == 200
    assert "mTLS with the cluster CA" in secure.text
    assert "Insecure agents." not in secure.text

    insecure = Server("--endpoint", "x=http://127.0.0.1:1=unused", wait_ready=False)
    try:
        page = httpx.get(insecure.admin + "/admin/", timeout=10)
        assert page.status_code == 200
        assert "Insecure agents." in page.text
        assert "--insecure-agents" in page.text
        output = insecure.proc.output()
        assert "WARNING llmgw.server: INSECURE AGENTS (--insecure-agents)" in output
        assert "llmgw agent --server" not in output  # no join line: nothing to join
        tokens = httpx.get(insecure.admin + "/admin/api/join-tokens", timeout=10)
        assert tokens.status_code == 409
        assert "--insecure-agents" in tokens.json()["error"]["message"]
        # An agent given a token for a plaintext listener is told so, and stops.
        address = re.search(r"agent listener on (127\.0\.0\.1:\d+) is PLAINTEXT", output)
        assert address is not None, output
        low = free_port_block(2)
        joining = Proc(
            llmgw(
                "agent", "--server", address.group(1), "--token", str(cluster.token()["token"]),
                "--state-dir", str(cluster.tmp / "state" / "plain"), "--gpus", "1x24GiB",
                "--weights-dir", str(cluster.tmp / "w-plain"), "--port-range", f"{low}-{low + 1}",
            )
        )  # fmt: skip
        cluster.agents.append(joining)
        assert exited(joining) == 2
        assert "does not speak TLS" in joining.output()
        assert "start the agent without --token" in joining.output()
    finally:
        insecure.proc.stop()


@pytest.mark.timeout(300)
# Long enough that the node cannot renew between step 1 and the early --finish.
@pytest.mark.parametrize("cluster", [", node_cert_lifetime: 60"], indirect=True)
def test_the_ca_is_rotated_in_two_steps_while_a_node_keeps_working(cluster: Cluster) -> None:
    made = cluster.token()
    agent = cluster.agent("gpu-c", "--token", str(made["token"]), "--node-id", "gpu-c")
    wait_for(lambda: cluster.ready("gpu-c"), "gpu-c to join")
    data = str(cluster.tmp / "data")

    def certs(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            llmgw("certs", "rotate-ca", "--data-dir", data, *args),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    started = certs()
    assert started.returncode == 0, started.stderr
    assert "step 1 done" in started.stdout
    again = certs()
    assert again.returncode == 2 and "already under way" in again.stderr
    early = certs("--finish")
    assert early.returncode == 2, early.stdout
    assert "have not renewed since the rotation began" in early.stderr and "gpu-c" in early.stderr

    renewals = agent.output().count("renewed this node's certificate")
    wait_for(
        lambda: agent.output().count("renewed this node's certificate") > renewals,
        "gpu-c to renew (and learn the new CA)",
        within=150,
    )
    finished = certs("--finish")
    assert finished.returncode == 0, finished.stderr
    assert cluster.server is not None
    wait_for(
        lambda: "the cluster CA was rotated" in cluster.server.proc.output(),  # type: ignore[union-attr]
        "the server to take the new CA up",
    )
    # The node reconnects to a server presenting a certificate from the new CA.
    agent.stop()
    back = cluster.agent("gpu-c")
    wait_for(lambda: "registered as gpu-c" in back.output(), "gpu-c to reconnect after the swap")
    # A token from before the swap names the old CA; a new one works.
    stale = cluster.agent("gpu-d", "--token", str(made["token"]), "--node-id", "gpu-d")
    assert exited(stale) == 2
    assert "is not the cluster this token was made for" in stale.output()
    fresh = cluster.agent("gpu-e", "--token", str(cluster.token()["token"]), "--node-id", "gpu-e")
    wait_for(lambda: cluster.ready("gpu-e"), "a node to join with a token of the new CA")
    assert cluster.chat().status_code == 200
    fresh.stop()
