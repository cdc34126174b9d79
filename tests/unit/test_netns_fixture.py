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
