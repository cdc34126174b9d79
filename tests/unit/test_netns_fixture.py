"""The network-namespace fixture itself: it says why it cannot run, and leaves nothing behind."""

from __future__ import annotations

import subprocess

import netns
import pytest


def _namespaces() -> str:
    return subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def test_without_root_or_ip_it_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(netns.NetnsError, match=r"must run as root .* this is uid 1000"):
        netns.require_netns()
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda _: None)
    with pytest.raises(netns.NetnsError, match=r"`ip` tool is missing \(install iproute2"):
        netns.require_netns()


def test_a_network_is_removed_with_its_processes() -> None:
    with netns.build_network(2) as network:
        assert [h.address for h in network.hosts] == [
            network.prefix + "2",
            network.prefix + "3",
        ]
        sleeper = network.hosts[1].spawn(["sleep", "600"])
        assert network.hosts[0].run(["ip", "-o", "-4", "addr"]).stdout.count("inet ") == 2
        names = [h.namespace for h in network.hosts]
    assert sleeper.popen.poll() is not None
    listed = _namespaces()
    assert not [name for name in names if name in listed]
    assert network.bridge not in _links()


def test_a_half_built_network_is_removed_too(monkeypatch: pytest.MonkeyPatch) -> None:
    real = netns._ip
    made: list[str] = []
    bridges: list[str] = []

    def failing(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if args[:2] == ("link", "add") and args[3:5] == ("type", "bridge"):
            bridges.append(args[2])
        if args[:2] == ("netns", "add"):
            made.append(args[2])
            if len(made) == 2:
                raise netns.NetnsError("`ip netns add` failed: simulated")
        return real(*args, check=check)

    monkeypatch.setattr(netns, "_ip", failing)
    with pytest.raises(netns.NetnsError, match="simulated"), netns.build_network(3):
        pass
    assert made and made[0] not in _namespaces()
    assert bridges and bridges[0] not in _links()


def test_an_extra_network_links_the_hosts_apart_from_the_servers() -> None:
    with netns.build_network(2, extra_networks=1) as network:
        (bridge, gateway, prefix) = network.extra[0]
        one, two = network.hosts
        assert one.extra_addresses == [prefix + "2"] and two.extra_addresses == [prefix + "3"]
        assert prefix != network.prefix and gateway == prefix + "1"
        shown = one.run(["ip", "-o", "-4", "addr", "show", "dev", "eth1"]).stdout
        assert f"{prefix}2/24" in shown
        probe = (
            "import socket,sys\n"
            "s=socket.socket();s.settimeout(5)\n"
            "print(s.connect_ex((sys.argv[1],int(sys.argv[2]))))"
        )
        listener = two.spawn(
            [
                "python3",
                "-c",
                "import socket,time\n"
                "s=socket.socket();s.bind(('0.0.0.0',7777));s.listen();time.sleep(600)",
            ]
        )
        for _ in range(100):
            if one.run(["python3", "-c", probe, prefix + "3", "7777"]).stdout.strip() == "0":
                break
        else:
            raise AssertionError(f"no connection over the extra network: {listener.output()}")
        one.link_down(1)
        assert one.run(["python3", "-c", probe, prefix + "3", "7777"]).stdout.strip() != "0"
    assert bridge not in _links() and network.bridge not in _links()
