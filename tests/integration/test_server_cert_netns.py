"""A server on 0.0.0.0 whose host gains an address after start lets agents join on it.

The server runs in a network namespace of its own (tests/netns.py), listening
for agents on every address, with the default security (mTLS with the cluster
CA). After it started, its host gets a second address on the bridge (an
interface or VPN that came up later). An agent in another namespace dials that
new address with the token the server printed, checks the server's certificate
names it, joins and registers, without the server restarting.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from netns import Host, Network, _ip
from procs import free_port_block, llmgw, wait_for

NETNS_HOSTS = 2
CONFIG = """
control: {heartbeat_interval: 0.3, unreachable_after: 1.5, lost_after: 6}
models:
  - name: sim-late
    weights: none
    profiles: [{name: sim, engine: sim, gpus: 1}]
"""
AGENT_PORT = 19443
# On the bridge's /24, far above the hosts' own addresses (.2, .3).
LATE_HOST_NUMBER = 200


@pytest.mark.timeout(300)
def test_an_agent_joins_on_an_address_the_server_gained_after_start(
    netns: Network, tmp_path: Path
) -> None:
    server_host: Host = netns.hosts[0]
    agent_host: Host = netns.hosts[1]
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    server = server_host.spawn(
        llmgw(
            "server", "--listen", "127.0.0.1:18080", "--admin-listen", "127.0.0.1:19090",
            "--agent-listen", f"0.0.0.0:{AGENT_PORT}", "--data-dir", str(tmp_path / "data"),
            "--config", str(tmp_path / "llmgw.yaml"),
        )
    )  # fmt: skip
    printed = wait_for(
        lambda: re.search(r"llmgw agent --server \S+ --token (\S+)", server.output()),
        "the server to print its join command",
    )
    token = printed.group(1)
    late = f"{netns.prefix}{LATE_HOST_NUMBER}"
    assert late not in server.output()

    _ip("-n", server_host.namespace, "addr", "add", f"{late}/24", "dev", "eth0")
    wait_for(
        lambda: "re-issuing this server's certificate" in server.output(),
        "the server to notice its new address",
    )
    assert f"new: {late}" in server.output()

    low = free_port_block(4)
    agent = agent_host.spawn(
        llmgw(
            "agent", "--server", f"{late}:{AGENT_PORT}", "--token", token,
            "--node-id", "late-node", "--gpus", "1x24GiB",
            "--state-dir", str(tmp_path / "state"), "--weights-dir", str(tmp_path / "w"),
            "--port-range", f"{low}-{low + 3}",
        )
    )  # fmt: skip
    wait_for(
        lambda: (
            f"registered as late-node with {late}:{AGENT_PORT}" in agent.output()
            or agent.popen.poll() is not None
        ),
        "the agent to join on the new address",
        90,
    )
    assert f"joined the cluster through {late}:{AGENT_PORT}" in agent.output(), agent.output()
    assert f"registered as late-node with {late}:{AGENT_PORT}" in agent.output()
    assert server.popen.poll() is None
