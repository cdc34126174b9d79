"""The management network: on each node, the interface and address multi-node ranks talk over.

`control.mgmt_interface` names it for the whole fleet, as an interface name
("eth1", "ib0") or a CIDR ("10.77.1.0/24"); a node label `llmgw.mgmt-interface`
overrides it for one node (hosts whose NICs are named differently). Unset, a
node's management address is the one it advertises for its engines, on the
interface that holds it. The choice is made from the interfaces the agent
reported at Register, so it is a pure function of the inventory.

A rank gets the choice as environment, unless its profile sets the variable
itself: `NCCL_SOCKET_IFNAME=={name}` (the exact-name form; a bare "eth1" is a
prefix and would also match "eth10"), `GLOO_SOCKET_IFNAME={name}`, and the
engine's own host-IP variable (`VLLM_HOST_IP`, `SGLANG_HOST_IP`) set to the
address. Rank 0's address is the replica's rendezvous address.

Not guaranteed: that the address is reachable from the other nodes (nothing
here probes the link), or anything for nodes of older agents that report no
interfaces: with no setting they use their advertised address and get no
interface variables; with a setting they cannot take a rank.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.control.inventory.model import NetInterface, Node
from llmgw.engines import HOST_IP_ENV

MGMT_LABEL = "llmgw.mgmt-interface"
"""The node label that overrides `control.mgmt_interface` for one node."""


@dataclass(frozen=True, slots=True)
class MgmtAddress:
    """Where a node's rank listens and talks: the interface ("" if unknown) and address."""

    interface: str
    address: str


def mgmt_address(node: Node, setting: str) -> MgmtAddress | str:
    """The node's management address, or the reason it has none (for placement)."""
    chosen = node.labels.get(MGMT_LABEL) or setting
    where = f"label {MGMT_LABEL}" if node.labels.get(MGMT_LABEL) else "control.mgmt_interface"
    if not chosen:
        address = node.advertise_host or node.seen_from
        if not address:
            return "reports no address for its engines (an agent too old for multi-node)"
        holder = _holding(node.interfaces, address)
        return MgmtAddress(holder.name if holder is not None else "", address)
    if not node.interfaces:
        return f"reports no network interfaces, so {where} {chosen!r} cannot be matched"
    if "/" in chosen:
        try:
            network = ipaddress.ip_network(chosen, strict=False)
        except ValueError:
            return f"{where} {chosen!r} is neither an interface name nor a CIDR"
        for interface in node.interfaces:
            for cidr in interface.addresses:
                ip = ipaddress.ip_interface(cidr).ip
                if ip in network:
                    return MgmtAddress(interface.name, str(ip))
        return f"has no address in {chosen} ({where}); it has {_listing(node.interfaces)}"
    for interface in node.interfaces:
        if interface.name == chosen:
            addresses = [ipaddress.ip_interface(c).ip for c in interface.addresses]
            if not addresses:
                return f"interface {chosen} ({where}) has no address"
            # IPv4 first: NCCL and Gloo bind it by default on a dual-stack NIC.
            addresses.sort(key=lambda a: a.version)
            return MgmtAddress(chosen, str(addresses[0]))
    return f"has no interface {chosen} ({where}); it has {_listing(node.interfaces)}"


def rank_env(engine: str, mgmt: MgmtAddress, profile_env: Mapping[str, str]) -> dict[str, str]:
    """The profile's env plus the management network's variables it does not set itself."""
    extra: dict[str, str] = {}
    if mgmt.interface:
        extra["NCCL_SOCKET_IFNAME"] = f"={mgmt.interface}"
        extra["GLOO_SOCKET_IFNAME"] = mgmt.interface
    host_ip = HOST_IP_ENV.get(engine)
    if host_ip is not None:
        extra[host_ip] = mgmt.address
    return {**extra, **profile_env}


def _holding(interfaces: tuple[NetInterface, ...], address: str) -> NetInterface | None:
    for interface in interfaces:
        if any(c.split("/", 1)[0] == address for c in interface.addresses):
            return interface
    return None


def _listing(interfaces: tuple[NetInterface, ...]) -> str:
    return ", ".join(f"{i.name} {' '.join(i.addresses) or '(no address)'}" for i in interfaces)
