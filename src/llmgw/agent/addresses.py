"""Where this node's engines listen and the address the routers are told to dial.

By default the agent advertises the local address of its connection to the
control plane: the address the server sees it from, and so the one servers on
that network can reach. `EngineAddresses.learn` is called with that address
on every (re)connect, before Register, and the supervisor reads `advertise` and
`bind` at each launch. An explicit `--advertise-host` always wins; an explicit
`--engine-host` (a dual-homed node) decides where engines bind.

Engines bind to 0.0.0.0 unless the advertised address is loopback (then
127.0.0.1: nothing off this machine could reach them anyway).

Not guaranteed: that the advertised address is reachable from *every* server
(a second server on another network may see the node from elsewhere; each
server checks reachability for itself before it routes to an engine); that an
engine started before the address changed is re-announced at the new one (its
URL is fixed at launch).
"""

from __future__ import annotations

import ipaddress
import socket

from llmgw.agent.flags import is_loopback

# Until a connection has told us better (no stream registered yet).
FALLBACK_HOST = "127.0.0.1"


def _bare(host: str) -> str:
    return host.strip("[]")


def local_address_towards(server: str) -> str:
    """The local address this machine uses to reach `server` (HOST:PORT; blocking: DNS).

    A UDP socket's connect() only picks the route and the source address; no
    packet is sent. Raises OSError when the host does not resolve or no route
    leads there.
    """
    host, _, port_text = server.rpartition(":")
    host = _bare(host)
    port = int(port_text) if port_text.isdigit() else 0
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    if not infos:
        raise OSError(f"{host!r} resolves to no address")
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.connect(sockaddr)
        local = str(sock.getsockname()[0])
    # An IPv4-mapped IPv6 source is the IPv4 address routers can dial.
    parsed = ipaddress.ip_address(local.split("%", 1)[0])
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)
    return local


class EngineAddresses:
    """The advertised host and the engines' bind host, learned or given."""

    def __init__(self, *, advertise_host: str | None = None, engine_host: str | None = None):
        self._explicit = advertise_host
        self._engine_host = engine_host
        self._learned: str | None = None

    @property
    def explicit(self) -> bool:
        """Whether --advertise-host was given (then nothing is learned)."""
        return self._explicit is not None

    @property
    def advertise(self) -> str:
        """The host put into engine URLs now."""
        if self._explicit is not None:
            return self._explicit
        return self._learned if self._learned is not None else FALLBACK_HOST

    @property
    def bind(self) -> str:
        """Where engines listen now: --engine-host, else everywhere unless advertised loopback."""
        if self._engine_host is not None:
            return self._engine_host
        ipv6 = ":" in _bare(self.advertise)
        if is_loopback(self.advertise):
            return "::1" if ipv6 else "127.0.0.1"
        return "::" if ipv6 else "0.0.0.0"

    def learn(self, local_host: str) -> bool:
        """Record the local address of the connection that served; True when it changed."""
        changed = local_host != self._learned
        self._learned = local_host
        return changed and self._explicit is None


def probe_host(bind: str) -> str:
    """The address the agent's own readiness probe dials for an engine bound to `bind`."""
    bare = _bare(bind)
    if bare in ("0.0.0.0", ""):
        return "127.0.0.1"
    if bare == "::":
        return "::1"
    return bare
