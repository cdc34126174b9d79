"""Joining the cluster with a token, keeping the node certificate, and renewing it.

`join` first opens a bare TLS connection to the server to read the certificate
chain it presents (nothing of the agent's is sent: no token, no request), finds
the CA whose SubjectPublicKeyInfo hashes to the token's CA hash, and checks that
the server's certificate was issued by that CA and carries the dialled host.
Only then does it call `Join` over gRPC, trusting that CA alone, with a client
certificate it signs with the token's key and a CSR for a key generated here
(the node key never leaves the node). This is kubeadm's
`--discovery-token-ca-cert-hash` idea: no trust on first use.

`TlsStore` keeps the result under `<state-dir>/tls/` (`node.key`, `node.crt`,
`ca.crt`, `labels.json`; each written whole, mode 0600). `CertificateKeeper`
holds the current certificate for the `Connection` (which reads it at every
dial) and renews it over `Renew` with the same key once two thirds of its
lifetime have passed, trying each server address in turn (those that just
timed out last, `silence.py`), with an injected clock and sleep.

Not guaranteed: that a renewal succeeds before expiry when no server answers
for a third of the lifetime; the agent then needs a new token.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import grpc
import grpc.aio
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from llmgw.agent.silence import SilentServers
from llmgw.pki import TlsMaterial, certificate_names, common_name
from llmgw.pki.cluster import (
    JoinToken,
    cert_pem,
    issued_by,
    key_pem,
    load_pem_certificates,
    make_csr,
    new_key,
    renewal_time,
    spki_sha256,
    token_client_certificate,
)
from llmgw.pki.pem import KEY_MODE, PemFile, PrivateKey, write_files
from llmgw.proto import agent_pb2, agent_pb2_grpc

log = logging.getLogger("llmgw.agent.enroll")

RENEW_AT = 2 / 3
CALL_TIMEOUT_SECONDS = 15.0
# The connection loop's default connect timeout (ConnectionSettings): a server
# that has not finished a TLS handshake by then is not answering.
DIAL_TIMEOUT_SECONDS = 5.0
RENEW_RETRY_SECONDS = 30.0
# A refusal a person must act on: retrying cannot help.
FINAL_CODES = frozenset(
    {
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)


class EnrollError(Exception):
    """Joining or renewing failed; `final` when retrying cannot help (a person must act).

    `token_refused`: the server presented the cluster's CA, then closed the
    connection when the agent presented the token's certificate. That is what
    a revoked token looks like (its trust is withdrawn from the handshake at
    once), but also a token made on another server of the store moments ago,
    which this one trusts after its next poll; the caller retries a few times
    before it gives up. `timed_out`: the server answered nothing in time (see
    `silence.py`).
    """

    def __init__(
        self, message: str, *, final: bool, token_refused: bool = False, timed_out: bool = False
    ) -> None:
        super().__init__(message)
        self.final = final
        self.token_refused = token_refused
        self.timed_out = timed_out


@dataclass(frozen=True, slots=True)
class NodeCredentials:
    """A node's key, its certificate from the cluster CA, and the CAs it trusts."""

    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def node_id(self) -> str:
        return common_name(self.cert) or ""

    @property
    def not_after(self) -> datetime:
        return self.cert.not_valid_after_utc

    def renew_at(self) -> datetime:
        return renewal_time(self.cert, RENEW_AT)

    def material(self) -> TlsMaterial:
        return TlsMaterial(
            cert=self.cert_pem,
            key=self.key_pem,
            ca=self.ca_pem,
            names=tuple(certificate_names(self.cert)),
        )


class TlsStore:
    """The node's credentials under `<state-dir>/tls/`."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "tls"

    def load(self) -> NodeCredentials | None:
        """The stored credentials, or None when the node has not joined (no certificate)."""
        paths = [self.directory / n for n in ("node.key", "node.crt", "ca.crt")]
        if not all(p.exists() for p in paths):
            return None
        key, cert, ca = (p.read_bytes() for p in paths)
        labels_file = self.directory / "labels.json"
        labels = json.loads(labels_file.read_text()) if labels_file.exists() else {}
        return NodeCredentials(key_pem=key, cert_pem=cert, ca_pem=ca, labels=labels)

    def load_key(self) -> PrivateKey | None:
        """The node's key alone (kept when a certificate expired), or None."""
        path = self.directory / "node.key"
        if not path.exists():
            return None
        key = serialization.load_pem_private_key(path.read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
        return key

    def save(self, creds: NodeCredentials) -> None:
        labels = json.dumps(dict(creds.labels), sort_keys=True).encode()
        write_files(
            [
                PemFile(self.directory / "node.key", creds.key_pem, KEY_MODE),
                PemFile(self.directory / "node.crt", creds.cert_pem, KEY_MODE),
                PemFile(self.directory / "ca.crt", creds.ca_pem, KEY_MODE),
                PemFile(self.directory / "labels.json", labels, KEY_MODE),
            ],
            force=True,
        )


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def fetch_server_chain(address: str, *, timeout: float) -> list[x509.Certificate]:
    """The certificates the server presents, unverified (blocking; run it in a thread).

    Only the TLS handshake happens: no application data is sent.
    """
    host, port = split_address(address)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            # Python 3.13 has a public get_unverified_chain(); 3.11/3.12 keep it here.
            chain = tls._sslobj.get_unverified_chain()  # type: ignore[attr-defined]
            pems = [c.public_bytes() for c in chain or []]
    except ssl.SSLError as exc:
        raise EnrollError(
            f"the server at {address} does not speak TLS on its agent listener ({exc.reason}): it "
            "probably runs with --insecure-agents; start the agent without --token",
            final=True,
        ) from exc
    except TimeoutError as exc:
        raise EnrollError(
            f"the server at {address} did not complete a TLS handshake within {timeout:g}s",
            final=False,
            timed_out=True,
        ) from exc
    except OSError as exc:
        raise EnrollError(
            f"cannot reach the server at {address}: {exc.strerror or exc}", final=False
        ) from exc
    return [x509.load_pem_x509_certificate(p.encode()) for p in pems]


def _valid_for(cert: x509.Certificate, host: str) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host.lower().rstrip(".") in [
            n.lower() for n in san.get_values_for_type(x509.DNSName)
        ]
    return ip in san.get_values_for_type(x509.IPAddress)


def verify_server(
    chain: Sequence[x509.Certificate], token: JoinToken, address: str
) -> x509.Certificate:
    """The cluster CA in `chain` that the token names; `EnrollError` (final) if it is not."""
    if not chain:
        raise EnrollError(f"the server at {address} presented no certificate", final=True)
    ca = next((c for c in chain if spki_sha256(c) == token.ca_hash), None)
    if ca is None:
        seen = ", ".join(spki_sha256(c)[:16] for c in chain[1:]) or "none"
        raise EnrollError(
            f"the server at {address} is not the cluster this token was made for: the token "
            f"expects a CA whose key hashes to {token.ca_hash[:16]}..., the server presents "
            f"{seen}; check --server, or make a token on that cluster (`llmgw nodes token "
            "create`). Nothing was sent to it",
            final=True,
        )
    leaf = chain[0]
    if not issued_by(leaf, ca):
        raise EnrollError(
            f"the certificate of the server at {address} was not issued by the cluster CA the "
            "token names; nothing was sent to it",
            final=True,
        )
    host, _ = split_address(address)
    if not _valid_for(leaf, host):
        names = ", ".join(certificate_names(leaf))
        raise EnrollError(
            f"the certificate of the server at {address} is not valid for {host!r} (it names "
            f"{names}): dial one of those, or add {host} to the server's "
            "control.agent_server_names",
            final=True,
        )
    return ca


def describe_rpc(exc: grpc.aio.AioRpcError) -> str:
    return f"{exc.code().name}: {exc.details() or ''}".rstrip(": ")


def _rpc_error(address: str, what: str, exc: grpc.aio.AioRpcError) -> EnrollError:
    code = exc.code()
    details = exc.details() or code.name
    if code in FINAL_CODES:
        return EnrollError(f"the server at {address} refused to {what}: {details}", final=True)
    return EnrollError(
        f"{what} at {address} failed: {code.name}: {details}",
        final=False,
        timed_out=code == grpc.StatusCode.DEADLINE_EXCEEDED,
    )


async def join(
    address: str,
    token: JoinToken,
    *,
    node_id: str,
    now: datetime,
    key: PrivateKey | None = None,
    call_seconds: float = CALL_TIMEOUT_SECONDS,
    dial_seconds: float = DIAL_TIMEOUT_SECONDS,
) -> NodeCredentials:
    """Verify the server against the token, then Join; see the module docstring.

    `dial_seconds` bounds the connection and bare handshake (a silent server costs
    no more), `call_seconds` the Join itself (the server writes to its store)."""
    chain = await asyncio.to_thread(fetch_server_chain, address, timeout=dial_seconds)
    ca = verify_server(chain, token, address)
    log.info(
        "the server at %s presents the cluster CA the token names (key hash %s...); joining as %s",
        address,
        token.ca_hash[:16],
        node_id,
    )
    node_key = key if key is not None else new_key()
    presented = token_client_certificate(token, now=now)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=cert_pem(ca),
        private_key=presented.key_pem,
        certificate_chain=presented.cert_pem,
    )
    async with grpc.aio.secure_channel(address, credentials) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            answer = await stub.Join(
                agent_pb2.JoinRequest(
                    token=str(token), node_id=node_id, csr_pem=make_csr(node_key, node_id)
                ),
                timeout=call_seconds,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                # The bare handshake above worked: what failed is the one with the
                # token's certificate.
                raise EnrollError(
                    f"the server at {address} closed the connection when this agent presented "
                    "the join token's certificate: the token was revoked, or expired more than "
                    "a week ago, or was made on another server moments ago and is not known "
                    "here yet; make a new one with `llmgw nodes token create` "
                    f"({describe_rpc(exc)})",
                    final=False,
                    token_refused=True,
                ) from exc
            raise _rpc_error(address, f"join this node as {node_id!r}", exc) from exc
    return NodeCredentials(
        key_pem=key_pem(node_key),
        cert_pem=answer.certificate_pem,
        ca_pem=answer.ca_pem,
        labels=dict(answer.labels),
    )


async def renew(
    address: str, creds: NodeCredentials, *, call_seconds: float = CALL_TIMEOUT_SECONDS
) -> NodeCredentials:
    """A new certificate for the same key, over mTLS with the current one."""
    key = serialization.load_pem_private_key(creds.key_pem, None)
    assert isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=creds.ca_pem, private_key=creds.key_pem, certificate_chain=creds.cert_pem
    )
    async with grpc.aio.secure_channel(address, credentials) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            answer = await stub.Renew(
                agent_pb2.RenewRequest(csr_pem=make_csr(key, creds.node_id)), timeout=call_seconds
            )
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(address, "renew this node's certificate", exc) from exc
    load_pem_certificates(answer.ca_pem)
    return NodeCredentials(
        key_pem=creds.key_pem,
        cert_pem=answer.certificate_pem,
        ca_pem=answer.ca_pem,
        labels=creds.labels,
    )


class CertificateKeeper:
    """The node's current certificate, renewed in time; `material()` is read at every dial."""

    def __init__(
        self,
        *,
        creds: NodeCredentials,
        store: TlsStore,
        addresses: Sequence[str],
        clock: Callable[[], datetime],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        renew_call: Callable[[str, NodeCredentials], Awaitable[NodeCredentials]] = renew,
        retry_seconds: float = RENEW_RETRY_SECONDS,
        silent: SilentServers | None = None,
    ) -> None:
        self._silent = silent if silent is not None else SilentServers()
        self._creds = creds
        self._store = store
        self._addresses = tuple(addresses)
        self._clock = clock
        self._sleep = sleep
        self._renew = renew_call
        self._retry = retry_seconds

    @property
    def creds(self) -> NodeCredentials:
        return self._creds

    def material(self) -> TlsMaterial:
        return self._creds.material()

    async def run(self) -> None:
        """Renew at two thirds of each certificate's lifetime, forever."""
        while True:
            wait = (self._creds.renew_at() - self._clock()).total_seconds()
            if wait > 0:
                await self._sleep(wait)
                continue
            renewed = await self.renew_once()
            if not renewed or self._creds.renew_at() <= self._clock():
                left = (self._creds.not_after - self._clock()).total_seconds()
                # Retry often enough to make it before expiry, never in a tight loop.
                await self._sleep(max(1.0, min(self._retry, left / 10)))

    async def renew_once(self) -> bool:
        """Try each address once; True when a new certificate is stored and in use."""
        for address in self._silent.order(self._addresses):
            try:
                renewed = await self._renew(address, self._creds)
            except EnrollError as exc:
                if exc.timed_out:
                    self._silent.timed_out(address)
                log.warning("%s", exc)
                continue
            self._silent.answered(address)
            await asyncio.to_thread(self._store.save, renewed)
            self._creds = renewed
            log.info(
                "renewed this node's certificate with %s; valid until %s",
                address,
                f"{renewed.not_after:%Y-%m-%d %H:%M:%S} UTC",
            )
            return True
        return False


def describe_expiry(creds: NodeCredentials) -> str:
    return f"{creds.not_after:%Y-%m-%d %H:%M:%S} UTC"
