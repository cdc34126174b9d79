"""This node's network interfaces and their addresses, as the agent reports them at Register.

The control plane picks, on each node of a multi-node replica, the address its
ranks use to reach each other (`control.mgmt_interface`: an interface name or
a CIDR). It can only do that if it knows every interface and address, not
just the one the agent dials out from: hosts with a control NIC and separate
InfiniBand or data NICs are exactly where NCCL and Gloo pick the wrong one.

Read through rtnetlink (an RTM_GETADDR dump), which lists every address of
every interface, IPv4 and IPv6, with its prefix length, in this process's
network namespace. Interfaces are reported by their kernel names (not
`eth0:1`-style labels), addresses as CIDR strings ("10.77.1.2/24"), both in
the kernel's order.

Not guaranteed: anything off Linux (the list is empty there), that an address
is still configured when a rank binds it, or link-local IPv6 addresses (left
out: they are not usable without a scope id).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

_NLMSG_HEADER = struct.Struct("=IHHII")
_IFADDRMSG = struct.Struct("=BBBBI")
_RTATTR = struct.Struct("=HH")
_RTM_NEWADDR = 20
_RTM_GETADDR = 22
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_NLM_F_REQUEST = 0x1
_NLM_F_DUMP = 0x300
_IFA_ADDRESS = 1
_IFA_LOCAL = 2


@dataclass(frozen=True, slots=True)
class Interface:
    """One network interface and its addresses, as CIDR strings ("10.77.1.2/24")."""

    name: str
    addresses: tuple[str, ...]


def discover() -> tuple[Interface, ...]:
    """Every interface of this network namespace that has an address, loopback included.

    Empty where rtnetlink is not available (not Linux); raises nothing for that.
    """
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    except (AttributeError, OSError):
        return ()
    with sock:
        sock.settimeout(5.0)
        request = _NLMSG_HEADER.pack(
            _NLMSG_HEADER.size + _IFADDRMSG.size,
            _RTM_GETADDR,
            _NLM_F_REQUEST | _NLM_F_DUMP,
            1,
            0,
        ) + _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        try:
            sock.sendto(request, (0, 0))
            found = _read_dump(sock)
        except OSError:
            return ()
    by_index: dict[int, list[str]] = {}
    for index, address in found:
        by_index.setdefault(index, []).append(address)
    interfaces = []
    for index, addresses in by_index.items():
        try:
            name = socket.if_indextoname(index)
        except OSError:
            continue
        interfaces.append(Interface(name, tuple(dict.fromkeys(addresses))))
    return tuple(interfaces)


def _read_dump(sock: socket.socket) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    while True:
        data = sock.recv(65536)
        offset = 0
        while offset + _NLMSG_HEADER.size <= len(data):
            length, kind, _, _, _ = _NLMSG_HEADER.unpack_from(data, offset)
            if length < _NLMSG_HEADER.size:
                return found
            body = data[offset + _NLMSG_HEADER.size : offset + length]
            if kind == _NLMSG_DONE:
                return found
            if kind == _NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", body)
                if code:
                    raise OSError(-code, os.strerror(-code))
            elif kind == _RTM_NEWADDR:
                parsed = _address(body)
                if parsed is not None:
                    found.append(parsed)
            offset += (length + 3) & ~3


def _address(body: bytes) -> tuple[int, str] | None:
    """(interface index, "addr/prefix") of one RTM_NEWADDR message, or None."""
    family, prefix, _, _, index = _IFADDRMSG.unpack_from(body)
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    attrs: dict[int, bytes] = {}
    offset = _IFADDRMSG.size
    while offset + _RTATTR.size <= len(body):
        length, kind = _RTATTR.unpack_from(body, offset)
        if length < _RTATTR.size:
            break
        attrs[kind] = body[offset + _RTATTR.size : offset + length]
        offset += (length + 3) & ~3
    # IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer's on a
    # point-to-point link); IPv6 has only IFA_ADDRESS.
    raw = attrs.get(_IFA_LOCAL) or attrs.get(_IFA_ADDRESS)
    if raw is None:
        return None
    address = ipaddress.ip_address(socket.inet_ntop(family, raw))
    if address.version == 6 and address.is_link_local:
        return None
    return index, f"{address}/{prefix}"
