"""The cluster CA at run time: this server's certificate, the listener's trust, tokens, issuing.

`ClusterPki.open` loads the CA from the store, or creates it when the store has
none (the first server; a race with another server ends with both using the
winner's). The CA's private key is sealed in the store with the cluster key
file; a server whose file does not open it stops with `ClusterPkiError`
naming the file. It then issues this server's certificate (every name agents
may dial as a SAN) and keeps it renewed: `run` re-issues it once two thirds of
its lifetime have passed, and re-reads the usable join tokens every
`poll_interval`. A server listening on every address re-reads this host's
addresses at each poll too, and re-issues its certificate as soon as they
change, so an interface or VPN that comes up later is dialable by agents
without a restart.

The agent listener takes `server_credentials()`: gRPC's dynamic SSL
credentials, whose fetcher gRPC calls at each handshake (on its own thread).
The fetcher hands over a new configuration only when something changed (a
renewed server certificate, a token created, spent or revoked), so the
listener never restarts and established streams are untouched. Client
certificates are required and must chain to the cluster CA, or to the root of
a join token (see `llmgw.pki.cluster`; roots of tokens that expired less than
`TOKEN_TRUST_GRACE` ago, or were used up, stay trusted so that the agent's Join
is refused with the reason rather than failing the handshake). A revoked
token's root is dropped from the trust by the refresh that `revoke_token` runs,
so the next handshake with it fails, and a Join on a connection that was
already open is refused: revocation leaves nothing to the token's holder.
`classify` tells the two apart, so only node certificates may open a stream or
renew, and only token certificates may join.

Standbys issue too: the CA is in the store, and joining or renewing needs no
leader, so nodes join and renew while the leader is away.

Not guaranteed: that a token created or revoked on another server is trusted
or distrusted by this server's listener before its next poll (`poll_interval`,
2 s; a revoked token never yields a certificate there either: Join reads the
store). No CRL: a removed node is
refused by the store's deny-list at Register and Renew, not at the handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hmac
import ipaddress
import itertools
import logging
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal, Protocol

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from llmgw.control.agentsvc.identity import reserved_name_refusal
from llmgw.pki import PkiError, common_name
from llmgw.pki.cluster import (
    CertifiedKey,
    ClusterKey,
    ClusterKeyMismatch,
    cert_pem,
    check_node_id,
    issue_server_certificate,
    issued_by,
    join_token_id,
    load_csr,
    new_ca,
    new_join_token,
    parse_join_token,
    renewal_time,
    sign_node_csr,
    spki_sha256,
    token_root,
    token_secret_hash,
)
from llmgw.pki.keyhash import public_key_hash
from llmgw.store import (
    BoundLabels,
    Claim,
    IssuedCertificate,
    NodeBinding,
    NotFound,
    PkiRepository,
    StoredCa,
    StoredJoinToken,
    TokenUnusable,
)

log = logging.getLogger("llmgw.control.agentsvc")

RENEW_AT = 2 / 3  # of a certificate's lifetime
# A token's root stays trusted for TLS this long after the token expires (and
# while it is revoked or used up), so that an agent presenting it completes the
# handshake and its Join is refused with the reason, not a bare TLS failure.
TOKEN_TRUST_GRACE = timedelta(days=7)


class ClusterPkiError(Exception):
    """The cluster CA cannot be used; the message names the file or store and what to do."""


class NodeIdentities(Protocol):
    """Node id bindings; the store's `NodeIdentityRepository` satisfies it."""

    async def binding(self, node_id: str) -> NodeBinding | None: ...

    async def is_revoked(self, key_hash: str) -> bool: ...

    async def claim(
        self, node_id: str, key_hash: str, *, now: datetime, bind: BoundLabels | None = None
    ) -> Claim: ...


@dataclass(frozen=True, slots=True)
class PkiSettings:
    """Lifetimes of what the cluster CA issues, and how often tokens are re-read."""

    ca_lifetime: timedelta
    server_cert_lifetime: timedelta
    node_cert_lifetime: timedelta
    poll_interval: float


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is on the other end of a call, as its verified client certificate says."""

    kind: Literal["node", "join", "unknown"]
    cert: x509.Certificate | None
    token_id: str | None = None


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate issued to a node, with the CA bundle it should trust."""

    certificate_pem: bytes
    ca_pem: bytes
    node_id: str
    labels: Mapping[str, str]


class Refusal(Exception):
    """A Join or Renew the server refuses: the gRPC status and a message for the operator."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ClusterPki:
    """The store's CA as this server uses it; built in the composition root."""

    def __init__(
        self,
        *,
        repo: PkiRepository,
        key: ClusterKey,
        server_id: str,
        server_names: Sequence[str],
        settings: PkiSettings,
        wall_clock: Callable[[], datetime],
        nodeids: NodeIdentities | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        host_addresses: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        """`host_addresses` (blocking, cheap: no DNS) lists this host's addresses
        when the listener is on every address; they are re-read at every poll
        and join `server_names` in the certificate."""
        self._repo = repo
        self._key = key
        self._server_id = server_id
        self._static_names = list(dict.fromkeys(server_names))
        self._host_addresses = host_addresses
        self._names = self._static_names
        self._settings = settings
        self._now = wall_clock
        self._nodeids = nodeids
        self._sleep = sleep
        self._ca: CertifiedKey | None = None
        self._ca_id = ""
        self._trusted: list[x509.Certificate] = []  # CA certificates nodes may chain to
        self._server: CertifiedKey | None = None
        self._roots: dict[str, x509.Certificate] = {}  # recent tokens' roots by token id
        self._revoked: set[str] = set()  # ids of recent tokens that were revoked
        self._lock = threading.Lock()
        self._pending: grpc.ServerCertificateConfiguration | None = None

    # ---- start-up ----

    async def open(self) -> None:
        """Load or create the CA, issue this server's certificate, read the tokens."""
        stored = await self._repo.active_ca()
        if stored is None:
            log.info(
                "creating the cluster CA (no CA in the store yet); its key is sealed with %s",
                self._key.path,
            )
            stored = await self._repo.create_ca(
                sealed_ca(
                    self._key, role="active", now=self._now(), lifetime=self._settings.ca_lifetime
                )
            )
        self._ca = unseal_ca(self._key, stored)
        self._ca_id = stored.id
        await self._load_trusted()
        self._names = await self._current_names()
        await self._issue_server_certificate()
        await self.refresh()

    async def _current_names(self) -> list[str]:
        if self._host_addresses is None:
            return self._static_names
        addresses = await asyncio.to_thread(self._host_addresses)
        return list(dict.fromkeys([*self._static_names, *(a.lower() for a in addresses)]))

    async def _load_trusted(self) -> None:
        now = self._now()
        trusted = []
        for ca in await self._repo.cas():
            if ca.not_after > now:
                trusted.append(x509.load_pem_x509_certificate(ca.cert_pem.encode()))
        self._trusted = trusted

    async def _issue_server_certificate(self) -> None:
        ca = self._require_ca()
        now = self._now()
        issued = issue_server_certificate(
            ca, self._names, now=now, lifetime=self._settings.server_cert_lifetime
        )
        await self._record("server", self._server_id, issued.cert, token_id=None)
        self._server = issued
        log.info(
            "server certificate for agents issued by the cluster CA: names %s, valid until %s",
            ", ".join(self._names),
            f"{issued.cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC",
        )
        self._changed()

    # ---- what the listener and agents see ----

    @property
    def ca_hash(self) -> str:
        """SHA-256 of the active CA's SubjectPublicKeyInfo: what join tokens carry."""
        return self._ca_id

    @property
    def server_names(self) -> tuple[str, ...]:
        """The names on this server's certificate (lower case): no node may take one."""
        return tuple(self._names)

    @property
    def ca_bundle_pem(self) -> bytes:
        return b"".join(cert_pem(c) for c in self._trusted)

    @property
    def ca_certificate(self) -> x509.Certificate:
        """The CA that signs nodes' and this server's certificates now."""
        return self._require_ca().cert

    @property
    def server_certificate(self) -> x509.Certificate:
        if self._server is None:
            raise ClusterPkiError("the cluster PKI is not open yet")
        return self._server.cert

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials for the agent listener that follow every change (see the module doc)."""
        initial = self._configuration()
        with self._lock:
            self._pending = None
        # gRPC's stubs say the fetcher must return a configuration; its docs (and
        # code) take None as "keep the current one", which is what _fetch relies on.
        fetch: Callable[[], grpc.ServerCertificateConfiguration] = self._fetch  # type: ignore[assignment]
        return grpc.dynamic_ssl_server_credentials(
            initial, fetch, require_client_authentication=True
        )

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        if self._server is None:
            raise ClusterPkiError("the cluster PKI is not open yet")
        # The chain carries the CA: a joining agent checks the token's hash against it.
        chain = self._server.cert_pem + cert_pem(self._require_ca().cert)
        roots = self.ca_bundle_pem + b"".join(cert_pem(r) for r in self._roots.values())
        return grpc.ssl_server_certificate_configuration(
            [(self._server.key_pem, chain)], root_certificates=roots
        )

    def _changed(self) -> None:
        if self._server is None:
            return
        config = self._configuration()
        with self._lock:
            self._pending = config

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC on its own thread at each handshake: None keeps the current one.
        with self._lock:
            config, self._pending = self._pending, None
        return config

    def classify(self, pem_certs: Sequence[bytes]) -> Peer:
        """What a verified client certificate (auth context `x509_pem_cert`) is."""
        if not pem_certs:
            return Peer(kind="unknown", cert=None)
        try:
            cert = x509.load_pem_x509_certificate(pem_certs[0])
        except ValueError:
            return Peer(kind="unknown", cert=None)
        if any(issued_by(cert, ca) for ca in self._trusted):
            return Peer(kind="node", cert=cert)
        token_id = join_token_id(cert)
        root = None if token_id is None else self._roots.get(token_id)
        if root is not None and issued_by(cert, root):
            return Peer(kind="join", cert=cert, token_id=token_id)
        return Peer(kind="unknown", cert=cert, token_id=token_id)

    # ---- background ----

    async def run(self) -> None:
        """Re-read tokens every poll interval; renew this server's certificate in time,
        and at once when this host's addresses changed."""
        while True:
            await self._sleep(self._settings.poll_interval)
            await self.refresh()
            names = await self._current_names()
            if set(names) != set(self._names):
                log.info(
                    "this host's addresses changed (new: %s; gone: %s): re-issuing this "
                    "server's certificate for agents",
                    ", ".join(n for n in names if n not in self._names) or "none",
                    ", ".join(n for n in self._names if n not in names) or "none",
                )
                self._names = names
                await self._issue_server_certificate()
            elif self._server is not None and self._now() >= _renew_point(self._server.cert):
                log.info("renewing this server's certificate for agents (2/3 of its lifetime)")
                await self._issue_server_certificate()

    async def refresh(self) -> None:
        """Re-read the recent tokens (and CAs); hand gRPC a new trust list if it changed.

        When another server finished a CA rotation, this one takes the new CA up:
        it issues from it, and presents a server certificate from it.
        """
        active = await self._repo.active_ca()
        if active is not None and active.id != self._ca_id:
            self._ca = unseal_ca(self._key, active)
            self._ca_id = active.id
            log.warning("the cluster CA was rotated: issuing from the new CA %s", active.id)
            await self._load_trusted()
            await self._issue_server_certificate()
        now = self._now()
        recent = await self._repo.tokens_expiring_after(now - TOKEN_TRUST_GRACE)
        # A revoked token is distrusted at once: its root leaves the listener's trust
        # with this refresh (the agent's handshake fails), not a week after it expires.
        tokens = [t for t in recent if t.revoked_at is None]
        self._revoked = {t.id for t in recent if t.revoked_at is not None}
        roots = {t.id: self._roots.get(t.id) or _root(t) for t in tokens}
        before = [c.fingerprint(hashes.SHA256()) for c in self._trusted]
        await self._load_trusted()
        if set(roots) != set(self._roots) or before != [
            c.fingerprint(hashes.SHA256()) for c in self._trusted
        ]:
            self._roots = roots
            self._changed()

    # ---- tokens ----

    async def create_token(
        self,
        *,
        ttl: timedelta,
        max_uses: int | None,
        labels: Mapping[str, str],
        fabric: Mapping[str, str] | None = None,
    ) -> tuple[str, StoredJoinToken]:
        """A new join token: its full text (shown once) and what the store keeps.

        `labels` and `fabric` bind: every node that joins with it keeps them,
        whatever its agent declares (see `Join`)."""
        now = self._now()
        token = new_join_token(self.ca_hash)
        root = token_root(token, now=now, not_after=now + ttl + TOKEN_TRUST_GRACE)
        stored = await self._repo.create_token(
            StoredJoinToken(
                id=token.token_id,
                secret_hash=token.secret_hash,
                root_pem=cert_pem(root).decode(),
                labels=dict(labels),
                max_uses=max_uses,
                uses=0,
                created_at=now,
                expires_at=now + ttl,
                last_used_at=None,
                revoked_at=None,
                fabric=dict(fabric or {}),
            )
        )
        await self.refresh()
        return str(token), stored

    async def revoke_token(self, token_id: str) -> StoredJoinToken:
        revoked = await self._repo.revoke_token(token_id)
        await self.refresh()
        return revoked

    async def tokens(self) -> list[StoredJoinToken]:
        return await self._repo.tokens()

    # ---- issuing ----

    async def join(self, peer: Peer, *, token_text: str, node_id: str, csr_pem: bytes) -> Issued:
        """Issue a node certificate for a Join; `Refusal` saying why not."""
        if peer.kind != "join" and peer.token_id in self._revoked:
            # A connection whose handshake predates the revocation.
            raise Refusal(grpc.StatusCode.PERMISSION_DENIED, _token_hint("this token was revoked"))
        if peer.kind != "join":
            raise Refusal(
                grpc.StatusCode.UNAUTHENTICATED,
                "Join needs the certificate the agent derives from a join token: start the "
                "agent with --token TOKEN (from `llmgw nodes token create`)",
            )
        try:
            token = parse_join_token(token_text)
            check_node_id(node_id)
            csr = load_csr(csr_pem)
        except PkiError as exc:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        if (reserved := reserved_name_refusal(node_id, self._names)) is not None:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, reserved)
        stored = await self._repo.token(token.token_id)
        if (
            token.token_id != peer.token_id
            or stored is None
            or not hmac.compare_digest(stored.secret_hash, token_secret_hash(token.secret))
        ):
            raise Refusal(
                grpc.StatusCode.PERMISSION_DENIED,
                "this join token is not valid here; make a new one with `llmgw nodes token create`",
            )
        if (reason := stored.unusable_because(self._now())) is not None:
            raise Refusal(grpc.StatusCode.PERMISSION_DENIED, _token_hint(reason))
        key_hash = public_key_hash(csr.public_key())
        await self._check_node_id_free(node_id, key_hash)
        try:
            used = await self._repo.use_token(token.token_id)
        except (TokenUnusable, NotFound) as exc:
            raise Refusal(grpc.StatusCode.PERMISSION_DENIED, _token_hint(str(exc))) from exc
        if self._nodeids is not None:
            claim = await self._nodeids.claim(
                node_id,
                key_hash,
                now=self._now(),
                bind=BoundLabels(labels=used.labels, fabric=used.fabric),
            )
            if claim.outcome in ("taken", "revoked"):
                raise Refusal(*_claim_refusal(node_id, claim.outcome))
        cert = await self._sign(csr, node_id, token_id=token.token_id)
        log.info(
            "node %s joined with token %s (use %d%s); certificate valid until %s",
            node_id,
            token.token_id,
            used.uses,
            f" of {used.max_uses}" if used.max_uses is not None else "",
            f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC",
        )
        await self.refresh()
        return Issued(cert_pem(cert), self.ca_bundle_pem, node_id, dict(used.labels))

    async def renew(self, peer: Peer, *, csr_pem: bytes) -> Issued:
        """Issue a new certificate for the same node and key; `Refusal` saying why not."""
        if peer.kind != "node" or peer.cert is None:
            raise Refusal(
                grpc.StatusCode.UNAUTHENTICATED,
                "Renew needs this node's certificate from the cluster CA; join first with "
                "--token TOKEN",
            )
        try:
            csr = load_csr(csr_pem)
        except PkiError as exc:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        key_hash = public_key_hash(csr.public_key())
        if key_hash != public_key_hash(peer.cert.public_key()):
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                "a renewal must keep the node's key pair: sign the CSR with the key of the "
                "current certificate",
            )
        node_id = _common_name(peer.cert)
        if self._nodeids is not None and await self._nodeids.is_revoked(key_hash):
            raise Refusal(
                grpc.StatusCode.PERMISSION_DENIED,
                f"node {node_id}'s key was revoked (`llmgw nodes remove`): remove the agent's "
                "<state-dir>/tls and join again with a new token",
            )
        cert = await self._sign(csr, node_id, token_id=None)
        log.info(
            "renewed node %s's certificate, valid until %s",
            node_id,
            f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC",
        )
        return Issued(cert_pem(cert), self.ca_bundle_pem, node_id, {})

    async def _check_node_id_free(self, node_id: str, key_hash: str) -> None:
        if self._nodeids is None:
            return
        if await self._nodeids.is_revoked(key_hash):
            raise Refusal(*_claim_refusal(node_id, "revoked"))
        binding = await self._nodeids.binding(node_id)
        if binding is not None and binding.key_hash != key_hash:
            raise Refusal(*_claim_refusal(node_id, "taken"))

    async def _sign(
        self, csr: x509.CertificateSigningRequest, node_id: str, *, token_id: str | None
    ) -> x509.Certificate:
        cert = sign_node_csr(
            self._require_ca(),
            csr,
            node_id,
            now=self._now(),
            lifetime=self._settings.node_cert_lifetime,
        )
        await self._record("node", node_id, cert, token_id=token_id)
        return cert

    async def _record(
        self, kind: str, subject: str, cert: x509.Certificate, *, token_id: str | None
    ) -> None:
        await self._repo.record_certificate(
            IssuedCertificate(
                serial=f"{cert.serial_number:x}",
                kind=kind,
                subject=subject,
                ca_id=self._ca_id,
                spki_sha256=public_key_hash(cert.public_key()),
                token_id=token_id,
                issued_at=self._now(),
                not_after=cert.not_valid_after_utc,
            )
        )

    def _require_ca(self) -> CertifiedKey:
        if self._ca is None:
            raise ClusterPkiError("the cluster PKI is not open yet")
        return self._ca


def sealed_ca(key: ClusterKey, *, role: str, now: datetime, lifetime: timedelta) -> StoredCa:
    """A new CA, its private key sealed with the cluster key, as the store keeps it."""
    ca = new_ca(now=now, lifetime=lifetime)
    return StoredCa(
        id=spki_sha256(ca.cert),
        role=role,
        cert_pem=ca.cert_pem.decode(),
        key_sealed=key.seal(ca.key_pem),
        sealing_key_id=key.key_id,
        created_at=now,
        not_after=ca.cert.not_valid_after_utc,
        retired_at=None,
    )


def _copy_key_hint(key: ClusterKey) -> str:
    return (
        "every server on this store needs the cluster key of the server that created the CA: "
        "copy that server's key file (by default <data-dir>/cluster.key, mode 0600) to "
        f"{key.path}, or point --cluster-key-file / control.cluster_key_file at it"
    )


def unseal_ca(key: ClusterKey, stored: StoredCa) -> CertifiedKey:
    """The stored CA with its private key; `ClusterPkiError` naming the key file if not."""
    if stored.sealing_key_id != key.key_id:
        raise ClusterPkiError(
            f"the cluster CA in the store is sealed with another cluster key than {key.path}; "
            f"{_copy_key_hint(key)}"
        )
    try:
        private = serialization.load_pem_private_key(key.unseal(stored.key_sealed), None)
    except ClusterKeyMismatch as exc:
        raise ClusterPkiError(f"{exc}; {_copy_key_hint(key)}") from exc
    if not isinstance(private, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ClusterPkiError("the cluster CA's key in the store is neither EC nor RSA")
    cert = x509.load_pem_x509_certificate(stored.cert_pem.encode())
    return CertifiedKey(cert=cert, key=private)


def _renew_point(cert: x509.Certificate) -> datetime:
    return renewal_time(cert, RENEW_AT)


def _root(token: StoredJoinToken) -> x509.Certificate:
    return x509.load_pem_x509_certificate(token.root_pem.encode())


def _common_name(cert: x509.Certificate) -> str:
    return common_name(cert) or ""


def _token_hint(reason: str) -> str:
    return f"{reason}; make a new one with `llmgw nodes token create`"


def _claim_refusal(node_id: str, outcome: str) -> tuple[grpc.StatusCode, str]:
    if outcome == "revoked":
        return (
            grpc.StatusCode.PERMISSION_DENIED,
            "this node's key was revoked (`llmgw nodes remove`): remove the agent's "
            "<state-dir>/tls (its old key and certificate) and join again with a new token",
        )
    return (
        grpc.StatusCode.ALREADY_EXISTS,
        f"node id {node_id!r} belongs to another node's key: pick another --node-id, or "
        f"`llmgw nodes remove {node_id}` first",
    )


def listens_everywhere(listen_host: str) -> bool:
    return listen_host in ("0.0.0.0", "::", "")


def server_names(*, listen_host: str, advertise: str | None, extra: Sequence[str]) -> list[str]:
    """The names agents may dial this server by, besides the host's addresses (which
    `ClusterPki` reads itself when it listens on every address): loopback always."""
    names: list[str] = []
    if not listens_everywhere(listen_host):
        names.append(listen_host)
    if advertise:
        names.append(advertise.rpartition(":")[0].strip("[]") or advertise)
    names.extend(extra)
    names.append(socket.gethostname())
    with contextlib.suppress(OSError):
        names.append(socket.getfqdn())
    names.extend(["localhost", "127.0.0.1", "::1"])
    cleaned = []
    for raw in names:
        name = raw.strip().rstrip(".").lower()
        if name and name not in cleaned:
            cleaned.append(name)
    return cleaned


def local_addresses() -> list[str]:
    """This host's IPv4 addresses (every one, secondary ones included) and its global
    and unique-local IPv6 addresses (Linux; no DNS, cheap enough to call every poll)."""
    found = _fib_local_addresses()
    if not found:
        found = _interface_addresses()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            address = ipaddress.IPv6Address(bytes.fromhex(raw))
            if not address.is_link_local:
                found.append(str(address))
    return list(dict.fromkeys(found))


def _fib_local_addresses() -> list[str]:
    """Every local IPv4 address from the kernel's routing tables (/proc/net/fib_trie:
    an address line, then `/32 host LOCAL` under it); [] where there is none."""
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return []
    found: list[str] = []
    for previous, line in itertools.pairwise(lines):
        if line.strip() == "/32 host LOCAL" and "|--" in previous:
            found.append(previous.split("|--", 1)[1].strip())
    return found


def _interface_addresses() -> list[str]:
    """The first IPv4 address of each interface (SIOCGIFADDR), where fib_trie is missing."""
    found: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):
                answer = fcntl.ioctl(sock.fileno(), 0x8915, request)  # SIOCGIFADDR
                found.append(socket.inet_ntoa(answer[20:24]))
    return found
