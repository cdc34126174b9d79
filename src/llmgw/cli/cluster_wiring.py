"""How the server secures its agent listener: the cluster CA, certificates of your own, or none.

`agent_security(cfg)` says which: "cluster" (the default: TLS with the CA kept
in the store, nodes join with a token), "own" (`agent_tls` files from
`llmgw certs`), "insecure" (`--insecure-agents`: plaintext) or "off" (no agent
listener). `open_cluster_pki` finds or creates the cluster key file, then
opens `ClusterPki` (which creates the CA on an empty store); a problem is a
`ClusterSetupError` that names the file and what to do. `announce_join`
prints the command that joins a new node, with a fresh token.

Not guaranteed: that the printed address is reachable from the new node; it
is the server's agent address as configured (`control.advertise_agent_address`),
this host's name when it resolves to a non-loopback address, or else the
address of its default route; the operator may need another (NAT, several
networks).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from llmgw.config import ServerConfig
from llmgw.control.agentsvc.cluster_pki import (
    ClusterPki,
    ClusterPkiError,
    PkiSettings,
    listens_everywhere,
    local_addresses,
    server_names,
)
from llmgw.pki import PkiError, PkiExistsError, certificate_names, read_certificate
from llmgw.pki.cluster import ClusterKey, create_cluster_key, read_cluster_key
from llmgw.store import Store, StoreError

log = logging.getLogger("llmgw.server")

AgentSecurity = Literal["cluster", "own", "insecure", "off"]
CLUSTER_KEY_FILE = "cluster.key"
# Tokens created, spent or revoked on other servers reach this one's listener this fast.
PKI_POLL_INTERVAL = 2.0
ANNOUNCED_TOKEN_TTL = timedelta(hours=24)


class ClusterSetupError(Exception):
    """The cluster CA cannot be used; the message says why and what to do."""


def agent_security(cfg: ServerConfig) -> AgentSecurity:
    if cfg.agent_listen is None:
        return "off"
    if cfg.agent_tls is not None:
        return "own"
    return "insecure" if cfg.insecure_agents else "cluster"


def tokens_unavailable(security: AgentSecurity) -> str:
    """Why this server makes no join tokens, for the admin API's 409."""
    return {
        "own": "this server's agent listener uses certificates of your own (agent_tls): issue "
        "node certificates with `llmgw certs issue --node NAME`; join tokens need the cluster "
        "CA (remove agent_tls)",
        "insecure": "this server's agent listener is plaintext (--insecure-agents): agents "
        "connect without joining; restart the server without --insecure-agents to use join "
        "tokens",
        "off": "this server has no agent listener (--agent-listen off); make tokens on a "
        "server that has one",
    }.get(security, "join tokens are not available on this server")


def cluster_key_path(cfg: ServerConfig, data_dir: str) -> Path:
    """`control.cluster_key_file`, or `cluster.key` in the data dir."""
    if cfg.control.cluster_key_file:
        return Path(cfg.control.cluster_key_file).expanduser()
    return Path(data_dir).expanduser() / CLUSTER_KEY_FILE


async def _cluster_key(path: Path, store: Store) -> ClusterKey:
    if await asyncio.to_thread(path.exists):
        return read_cluster_key(path)
    if await store.pki.active_ca() is not None:
        raise ClusterSetupError(
            f"the store {store.url} has a cluster CA but there is no cluster key at {path}: copy "
            "the key file of the server that created the CA (its <data-dir>/cluster.key, mode "
            f"0600) to {path}, or point --cluster-key-file / control.cluster_key_file at it"
        )
    try:
        key = create_cluster_key(path)
    except PkiExistsError:
        # Another server with the same file started at the same moment: use its key.
        return read_cluster_key(path)
    log.warning(
        "created the cluster key %s (mode 0600); it seals the cluster CA's private key in the "
        "store: back it up, and give every other server on this store the same file",
        path,
    )
    return key


async def open_cluster_pki(
    cfg: ServerConfig,
    store: Store,
    *,
    data_dir: str,
    server_id: str,
    wall_clock: Callable[[], datetime],
) -> ClusterPki:
    """The opened cluster PKI (CA created on an empty store); `ClusterSetupError` if not."""
    assert cfg.agent_listen is not None
    control = cfg.control
    try:
        path = await asyncio.to_thread(cluster_key_path, cfg, data_dir)
        key = await _cluster_key(path, store)
        pki = ClusterPki(
            repo=store.pki,
            key=key,
            server_id=server_id,
            server_names=server_names(
                listen_host=cfg.agent_listen.host,
                advertise=control.advertise_agent_address,
                extra=control.agent_server_names,
            ),
            host_addresses=(local_addresses if listens_everywhere(cfg.agent_listen.host) else None),
            settings=PkiSettings(
                ca_lifetime=timedelta(seconds=control.ca_lifetime),
                server_cert_lifetime=timedelta(seconds=control.server_cert_lifetime),
                node_cert_lifetime=timedelta(seconds=control.node_cert_lifetime),
                poll_interval=PKI_POLL_INTERVAL,
            ),
            wall_clock=wall_clock,
            nodeids=store.nodeids,
        )
        await pki.open()
    except (ClusterPkiError, PkiError) as exc:
        raise ClusterSetupError(str(exc)) from exc
    except StoreError as exc:
        raise ClusterSetupError(f"cannot read or store the cluster CA: {exc}") from exc
    return pki


async def reserved_node_names(
    cfg: ServerConfig, pki: ClusterPki | None
) -> Callable[[], tuple[str, ...]]:
    """The names no node may register under: those on the certificate this server
    presents to agents (the cluster CA's, followed as it is renewed, or `agent_tls`'s);
    none on a plaintext listener."""
    if pki is not None:
        return lambda: pki.server_names
    if cfg.agent_tls is None:
        return tuple
    try:
        cert = await asyncio.to_thread(read_certificate, Path(cfg.agent_tls.cert))
    except PkiError:
        # The listener refuses the same file at start, naming it; nothing to reserve.
        return tuple
    names = tuple(dict.fromkeys(n.rstrip(".").lower() for n in certificate_names(cert)))
    return lambda: names


def dialable(host: str, port: int) -> str:
    """HOST:PORT another machine can dial for a listener bound to `host`.

    A wildcard bind is turned into this host's name when that name resolves to
    an address other hosts can reach, else into the source address of the
    default route (many hosts map their own name to 127.0.0.1 or 127.0.1.1, and
    `socket.getfqdn()` then says "localhost", which no other node can dial).
    """
    if host in ("0.0.0.0", "::", ""):
        host = _reachable_name() or _default_route_address() or socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "localhost")


def _reachable_name() -> str | None:
    """This host's name, if it resolves only to addresses that are not loopback."""
    for name in (socket.getfqdn(), socket.gethostname()):
        if not name or _is_loopback(name):
            continue
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError:
            continue
        addresses = {str(info[4][0]) for info in infos}
        if addresses and not any(_is_loopback(a) for a in addresses):
            return name
    return None


def _default_route_address() -> str | None:
    """The local address of the route to other networks (a UDP connect sends nothing)."""
    for family, probe in ((socket.AF_INET, "198.51.100.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((probe, 9))
                address = str(sock.getsockname()[0])
        except OSError:
            continue
        if not _is_loopback(address):
            return address
    return None


async def announce_join(pki: ClusterPki, address: str) -> None:
    """Print the agent command that joins a new node, with a fresh token (24 h, any uses)."""
    try:
        text, token = await pki.create_token(ttl=ANNOUNCED_TOKEN_TTL, max_uses=None, labels={})
    except StoreError as exc:
        log.warning(
            "cannot make a join token to print (%s); `llmgw nodes token create` makes one", exc
        )
        return
    host = address.rpartition(":")[0].strip("[]")
    note = (
        "  (the agent listener is on loopback: only agents on this machine can dial it; "
        "listen on an address other hosts reach, e.g. --agent-listen 0.0.0.0:9443)\n"
        if _is_loopback(host)
        else ""
    )
    print(
        f"\nTo join a GPU node to this cluster, run on it (token {token.id}, valid 24 h; "
        "`llmgw nodes token create` makes more):\n"
        f"  llmgw agent --server {address} --token {text}\n{note}",
        flush=True,
    )


async def local_join_token(
    cfg: ServerConfig, store: Store, *, data_dir: str, state_dir: Path
) -> str | None:
    """A one-use token for the local agent of `llmgw up`, or None when it has joined already.

    Opens the cluster PKI first, so the CA exists (created on an empty store)
    before the agent dials; the gateway opens it again when it starts.
    """
    from llmgw.agent.enroll import TlsStore

    stored = await asyncio.to_thread(TlsStore(state_dir).load)
    if stored is not None and stored.not_after > datetime.now(UTC):
        return None
    pki = await open_cluster_pki(
        cfg, store, data_dir=data_dir, server_id="llmgw-up", wall_clock=lambda: datetime.now(UTC)
    )
    text, _ = await pki.create_token(ttl=timedelta(hours=1), max_uses=1, labels={})
    return text


def agent_listener_view(security: AgentSecurity) -> dict[str, str]:
    """What the dashboard's overview says about the agent listener."""
    text = {
        "cluster": "mTLS with the cluster CA: nodes join with a token (`llmgw nodes token "
        "create`) and are their certificates",
        "own": "mTLS with certificates of your own (agent_tls)",
        "insecure": "plaintext, without certificates (--insecure-agents): any host that reaches "
        "the agent listener can register as any node and receive users' prompts; restart the "
        "server without --insecure-agents to have nodes join with a token",
        "off": "off (--agent-listen off)",
    }[security]
    return {"mode": security, "text": text}
