"""The cluster CA's cryptography: sealing key, CA, server and node certificates, join tokens.

Pure functions and small value objects; nothing here touches the store or the
network. `llmgw.control.agentsvc.cluster_pki` keeps the CA in the store and
issues with these; the agent (`llmgw.agent.enroll`) uses the token helpers.

- **Cluster key**: 32 random bytes in a file (hex, mode 0600). It seals the CA's
  private key with AES-256-GCM before the key goes into the store; its id (a
  hash of a value derived from it) is stored next to the sealed key, so a server
  holding another key file is told so by name.
- **Join token**: `llmgw1:<ca-spki-sha256>:<id>.<secret>`. The first part is the
  SHA-256 of the cluster CA certificate's SubjectPublicKeyInfo (what the agent
  checks the server against, before it sends anything). The secret also derives
  an EC P-256 key pair; the server keeps a self-signed certificate of that key
  (the token's *root*) and trusts it for client certificates while the token
  can be used. A joining agent presents a certificate it signs with the derived
  key, so it proves it holds the secret inside the TLS handshake, on the same
  listener that requires client certificates of every other caller (gRPC's
  Python server cannot make client certificates optional).

Not guaranteed: protection of the cluster key beyond its file mode; anyone who
reads it and the store can issue certificates. Revocation of node certificates
is a store deny-list (`llmgw.store.nodeids`), not a CRL.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.pki.errors import PkiError, PkiFileError, PkiInputError
from llmgw.pki.pem import KEY_MODE, PemFile, PrivateKey, write_files

TOKEN_PREFIX = "llmgw1"
CLUSTER_CA_NAME = "llmgw cluster CA"
# Certificates start a little in the past: a node whose clock lags the CA's
# host by a few minutes would otherwise refuse a certificate issued just now.
BACKDATE = timedelta(minutes=5)
# The certificate a joining agent signs with its token key: long enough for one Join.
JOIN_CERT_LIFETIME = timedelta(hours=1)
_JOIN_ROOT_PREFIX = "llmgw join token "
_SEAL_AAD = b"llmgw cluster CA key v1"
_TOKEN = re.compile(r"^llmgw1:([0-9a-f]{64}):([0-9a-z]{4,32})\.([0-9a-f]{32,128})$")
# Matched whole (`fullmatch`): with `match` and `$`, "gpu-a\n" would pass.
_NODE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")


class ClusterKeyMismatch(PkiError):
    """The cluster key file does not open the CA kept in the store."""


def spki_sha256(cert: x509.Certificate) -> str:
    """SHA-256 (hex) of the certificate's SubjectPublicKeyInfo (DER)."""
    der = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def renewal_time(cert: x509.Certificate, fraction: float) -> datetime:
    """When `fraction` of the certificate's lifetime has passed, counted from its issue.

    Certificates issued here start `BACKDATE` before they were issued; that part
    is not counted, or a short-lived certificate would be due at once.
    """
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if end - start > BACKDATE:
        start += BACKDATE
    return start + (end - start) * fraction


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_pem_certificates(data: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle; `PkiInputError` when there is none or one is bad."""
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise PkiInputError(f"not PEM certificates: {exc}") from exc
    return certs


# ---- the cluster key ----


@dataclass(frozen=True, slots=True)
class ClusterKey:
    """The key that seals the CA's private key in the store; `path` is its file."""

    secret: bytes
    path: Path

    @property
    def key_id(self) -> str:
        """A public fingerprint of the key: SHA-256 of a value derived from it."""
        return hashlib.sha256(b"llmgw cluster key id\0" + self.secret).hexdigest()

    def seal(self, plaintext: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + AESGCM(self.secret).encrypt(nonce, plaintext, _SEAL_AAD)

    def unseal(self, blob: bytes) -> bytes:
        try:
            return AESGCM(self.secret).decrypt(blob[:12], blob[12:], _SEAL_AAD)
        except InvalidTag as exc:
            raise ClusterKeyMismatch(
                f"{self.path} does not open the cluster CA key in the store (the sealed key is "
                "damaged, or sealed with another key file)"
            ) from exc


def read_cluster_key(path: Path) -> ClusterKey:
    """Read the key file; `PkiFileError` naming it if unreadable, malformed or open to others."""
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise PkiFileError(path, f"cannot read the cluster key: {exc.strerror or exc}") from exc
    if mode & 0o077:
        raise PkiFileError(
            path,
            f"the cluster key is readable by other users (mode {mode & 0o777:o}); "
            f"run `chmod 600 {path}`",
        )
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) != 32:
        raise PkiFileError(path, "not a cluster key (expected 64 hex digits)")
    return ClusterKey(secret=secret, path=path)


def create_cluster_key(path: Path) -> ClusterKey:
    """Write a new random key to `path` (0600, refusing to overwrite) and return it."""
    secret = secrets.token_bytes(32)
    write_files([PemFile(path, (secret.hex() + "\n").encode(), KEY_MODE)], force=False)
    return ClusterKey(secret=secret, path=path)


# ---- certificates ----


@dataclass(frozen=True, slots=True)
class CertifiedKey:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: PrivateKey

    @property
    def cert_pem(self) -> bytes:
        return cert_pem(self.cert)

    @property
    def key_pem(self) -> bytes:
        return key_pem(self.key)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def new_ca(*, now: datetime, lifetime: timedelta, name: str = CLUSTER_CA_NAME) -> CertifiedKey:
    """A self-signed CA that signs leaf certificates only (pathlen 0)."""
    key = new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertifiedKey(cert=cert, key=key)


def issue_server_certificate(
    ca: CertifiedKey, names: Sequence[str], *, now: datetime, lifetime: timedelta
) -> CertifiedKey:
    """A serverAuth certificate with every name as a SAN (IP addresses and DNS names)."""
    if not names:
        raise PkiInputError("a server certificate needs at least one name")
    alt: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    key = new_key()
    cert = _leaf(
        ca,
        public_key=key.public_key(),
        common_name=names[0],
        alt_names=alt,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        now=now,
        lifetime=lifetime,
    )
    return CertifiedKey(cert=cert, key=key)


NODE_ID_RULE = (
    "1 to 253 letters, digits and . _ - (not at the ends), matched whole: no '/', "
    "whitespace or control characters"
)


def check_node_id(node_id: str) -> str:
    """`node_id` if it may name a node in a certificate; `PkiInputError` naming the rule."""
    if not _NODE.fullmatch(node_id):
        raise PkiInputError(f"{node_id!r} cannot be a node id in a certificate: {NODE_ID_RULE}")
    return node_id


def load_csr(csr_pem: bytes) -> x509.CertificateSigningRequest:
    """A PKCS#10 request with a valid self-signature and an EC or RSA key."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise PkiInputError(f"the CSR is not a PEM certificate request: {exc}") from exc
    if not csr.is_signature_valid:
        raise PkiInputError("the CSR's signature does not verify")
    if not isinstance(csr.public_key(), ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise PkiInputError("the CSR's key is neither EC nor RSA")
    return csr


def sign_node_csr(
    ca: CertifiedKey,
    csr: x509.CertificateSigningRequest,
    node_id: str,
    *,
    now: datetime,
    lifetime: timedelta,
) -> x509.Certificate:
    """A clientAuth certificate for `node_id` (CN and DNS SAN), for the CSR's key.

    Only the key is taken from the CSR; names and extensions are the server's.
    """
    check_node_id(node_id)
    public = csr.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey | rsa.RSAPublicKey)
    return _leaf(
        ca,
        public_key=public,
        common_name=node_id,
        alt_names=[x509.DNSName(node_id)],
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        now=now,
        lifetime=lifetime,
    )


def make_csr(key: PrivateKey, node_id: str) -> bytes:
    """The agent's request for `node_id`, signed by its own key."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether `issuer`'s key signed `cert` (names matching too)."""
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _leaf(
    ca: CertifiedKey,
    *,
    public_key: ec.EllipticCurvePublicKey | rsa.RSAPublicKey,
    common_name: str,
    alt_names: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    now: datetime,
    lifetime: timedelta,
) -> x509.Certificate:
    # A leaf outliving its CA would be refused anyway once the CA expires.
    not_after = min(now + lifetime, ca.cert.not_valid_after_utc)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


# ---- join tokens ----


@dataclass(frozen=True, slots=True)
class JoinToken:
    """A parsed join token; `str()` gives it back as people paste it."""

    ca_hash: str
    token_id: str
    secret: str

    def __str__(self) -> str:
        return f"{TOKEN_PREFIX}:{self.ca_hash}:{self.token_id}.{self.secret}"

    @property
    def secret_hash(self) -> str:
        return token_secret_hash(self.secret)


def new_join_token(ca_hash: str) -> JoinToken:
    return JoinToken(ca_hash=ca_hash, token_id=secrets.token_hex(6), secret=secrets.token_hex(16))


def token_secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_join_token(text: str) -> JoinToken:
    """Parse `llmgw1:<64 hex>:<id>.<secret>`; `PkiInputError` saying what is wrong."""
    match = _TOKEN.match(text.strip())
    if match is None:
        raise PkiInputError(
            "not a join token (expected llmgw1:<CA hash>:<id>.<secret>, as printed by "
            "`llmgw nodes token create` or at the server's start)"
        )
    return JoinToken(ca_hash=match.group(1), token_id=match.group(2), secret=match.group(3))


def token_key(secret: str) -> ec.EllipticCurvePrivateKey:
    """The EC P-256 key a token's secret stands for (the same on the server and the agent)."""
    digest = hashlib.sha256(b"llmgw join token key\0" + secret.encode()).digest()
    # The P-256 group order; reducing a 256-bit hash into [1, n-1] is uniform enough.
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
    return ec.derive_private_key(int.from_bytes(digest) % (order - 1) + 1, ec.SECP256R1())


def _token_name(token_id: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _JOIN_ROOT_PREFIX + token_id)])


def token_root(token: JoinToken, *, now: datetime, not_after: datetime) -> x509.Certificate:
    """The self-signed certificate of the token's key, that servers trust while it lasts."""
    key = token_key(token.secret)
    name = _token_name(token.token_id)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .sign(key, hashes.SHA256())
    )


def token_client_certificate(token: JoinToken, *, now: datetime) -> CertifiedKey:
    """What a joining agent presents: a throwaway key, certified by the token's key."""
    issuer = token_key(token.secret)
    key = new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "join")]))
        .issuer_name(_token_name(token.token_id))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + JOIN_CERT_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(issuer, hashes.SHA256())
    )
    return CertifiedKey(cert=cert, key=key)


def join_token_id(cert: x509.Certificate) -> str | None:
    """The token id a joining agent's certificate claims by its issuer name, if any."""
    names = cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        return None
    value = names[0].value
    text = value if isinstance(value, str) else value.decode()
    return text[len(_JOIN_ROOT_PREFIX) :] if text.startswith(_JOIN_ROOT_PREFIX) else None
