"""The join command `llmgw server` prints names an address other machines can dial."""

from __future__ import annotations

import socket

import pytest

from llmgw.cli import cluster_wiring
from llmgw.cli.cluster_wiring import dialable


def test_a_specific_bind_address_is_printed_as_it_is() -> None:
    assert dialable("10.77.0.1", 9443) == "10.77.0.1:9443"
    assert dialable("fd00::1", 9443) == "[fd00::1]:9443"


def test_a_wildcard_bind_never_prints_a_loopback_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # The host maps its own name to loopback, as many do (getfqdn() then says "localhost").
    monkeypatch.setattr(socket, "getfqdn", lambda *a: "localhost")
    monkeypatch.setattr(socket, "gethostname", lambda: "vm")
    real = socket.getaddrinfo

    def resolve(host: str, *args: object, **kwargs: object) -> object:
        if host == "vm":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.1.1", 0))]
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr(cluster_wiring, "_default_route_address", lambda: "192.0.2.7")
    assert dialable("0.0.0.0", 9443) == "192.0.2.7:9443"


def test_a_wildcard_bind_prints_the_host_name_when_it_resolves_off_loopback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(socket, "getfqdn", lambda *a: "gpu-control.example")
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, *a, **k: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", 0))],
    )
    assert dialable("0.0.0.0", 9443) == "gpu-control.example:9443"
