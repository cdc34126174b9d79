"""Where engines listen and which address the agent advertises for them."""

from __future__ import annotations

import pytest

from llmgw.agent.addresses import EngineAddresses, local_address_towards, probe_host
from llmgw.control.agentsvc.convert import peer_host
from llmgw.control.inventory.model import is_loopback


def test_the_connections_local_address_is_advertised_by_default() -> None:
    addresses = EngineAddresses()
    # Before any connection: loopback, and engines bind there.
    assert (addresses.advertise, addresses.bind) == ("127.0.0.1", "127.0.0.1")
    assert addresses.learn("10.77.0.2") is True
    assert (addresses.advertise, addresses.bind) == ("10.77.0.2", "0.0.0.0")
    assert addresses.learn("10.77.0.2") is False  # the same: nothing to say
    assert addresses.learn("192.168.1.5") is True  # another route on a reconnect
    assert addresses.advertise == "192.168.1.5"
    # A control plane on this machine: engines stay on loopback.
    addresses.learn("127.0.0.1")
    assert (addresses.advertise, addresses.bind) == ("127.0.0.1", "127.0.0.1")


def test_explicit_flags_win() -> None:
    given = EngineAddresses(advertise_host="gpu-7.example")
    assert given.explicit
    assert given.learn("10.77.0.2") is False
    assert (given.advertise, given.bind) == ("gpu-7.example", "0.0.0.0")
    loop = EngineAddresses(advertise_host="127.0.0.1")
    assert loop.bind == "127.0.0.1"
    dual = EngineAddresses(engine_host="192.168.10.4")
    dual.learn("10.77.0.2")
    assert (dual.advertise, dual.bind) == ("10.77.0.2", "192.168.10.4")
    six = EngineAddresses(advertise_host="fd00::7")
    assert six.bind == "::"
    assert EngineAddresses(advertise_host="::1").bind == "::1"


def test_the_agents_own_probe_dials_where_the_engine_listens() -> None:
    assert probe_host("0.0.0.0") == "127.0.0.1"
    assert probe_host("::") == "::1"
    assert probe_host("192.168.10.4") == "192.168.10.4"
    assert probe_host("[fd00::7]") == "fd00::7"


def test_the_local_address_towards_a_server_is_the_routes_source() -> None:
    assert local_address_towards("127.0.0.1:9443") == "127.0.0.1"
    assert local_address_towards("localhost:9443") in ("127.0.0.1", "::1")
    with pytest.raises(OSError):
        local_address_towards("no-such-host.invalid:9443")


def test_the_servers_view_of_agents() -> None:
    assert peer_host("ipv4:10.77.0.2:51234") == "10.77.0.2"
    assert peer_host("ipv6:[fd00::2]:51234") == "fd00::2"
    assert peer_host("ipv6:%5B::1%5D:51234") == "::1"
    assert peer_host("ipv6:[::ffff:10.77.0.2]:51234") == "10.77.0.2"
    assert peer_host("unix:/tmp/sock") == "unix:/tmp/sock"
    assert is_loopback("127.0.0.1") and is_loopback("127.1.2.3") and is_loopback("::1")
    assert is_loopback("localhost") and is_loopback("[::1]")
    assert not is_loopback("10.77.0.2") and not is_loopback("gpu-7.example")
    assert not is_loopback("")
