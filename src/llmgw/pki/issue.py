"""A small certificate authority for the agent listener: one CA, server and node certificates.

`init_ca` creates `ca.crt` and `ca.key` in a folder. `issue_server` signs a
certificate for the control-plane servers (serverAuth, a subject alternative
name for every host agents dial: DNS names and IP addresses); `issue_node`
signs one for a node agent (clientAuth, CN and DNS name = the node id, which
is the identity the agent listener enforces). Keys are EC P-256 (small, fast
handshakes) or RSA 2048 for older tooling. Each key is written 0600; nothing
is overwritten without `force`. Times are injected (`now`).

Not guaranteed: revocation (there is no CRL; rotate the CA to revoke
everything, or keep node certificates short-lived), or protection of the CA
key beyond its file mode. This is the "no PKI yet" path; certificates from an
existing CA work as well.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.pki.errors import PkiFileError, PkiInputError
from llmgw.pki.pem import (
    CERT_MODE,
    KEY_MODE,
    PemFile,
    PrivateKey,
    check_key_pair,
    read_certificate,
    read_private_key,
    write_files,
)

KeyType = Literal["ec", "rsa"]

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
DEFAULT_CA_NAME = "llmgw agent CA"
DEFAULT_CA_DAYS = 3650
DEFAULT_LEAF_DAYS = 825
# Certificates start a little in the past: a node whose clock lags the CA's
# host by a few minutes would otherwise refuse a certificate issued just now.
BACKDATE = timedelta(minutes=5)

# Matched whole (`fullmatch`): with `match` and `$`, "gpu-a\n" would pass.
_NODE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_DNS = re.compile(
    r"^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


@dataclass(frozen=True, slots=True)
class Issued:
    """The files one command wrote, and the names the certificate carries."""

    cert: Path
    key: Path
    names: tuple[str, ...]
    not_after: datetime


def init_ca(
    directory: Path,
    *,
    now: datetime,
    name: str = DEFAULT_CA_NAME,
    days: int = DEFAULT_CA_DAYS,
    key_type: KeyType = "ec",
    force: bool = False,
) -> Issued:
    """Create a self-signed CA (`ca.crt`, `ca.key`) in `directory`."""
    if not name.strip():
        raise PkiInputError("the CA name is empty; give --name with some text")
    _check_days(days)
    key = _new_key(key_type)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name.strip())])
    not_after = now + timedelta(days=days)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        # pathlen 0: this CA signs leaf certificates only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    cert = builder.sign(key, hashes.SHA256())
    files = (directory / CA_CERT, directory / CA_KEY)
    write_files(
        [
            PemFile(files[1], _key_pem(key), KEY_MODE),
            PemFile(files[0], cert.public_bytes(serialization.Encoding.PEM), CERT_MODE),
        ],
        force=force,
        hint=" (a new CA voids every certificate the old one issued)",
    )
    return Issued(cert=files[0], key=files[1], names=(name.strip(),), not_after=not_after)


def issue_server(
    directory: Path,
    hosts: Sequence[str],
    *,
    now: datetime,
    days: int = DEFAULT_LEAF_DAYS,
    out_dir: Path | None = None,
    key_type: KeyType = "ec",
    force: bool = False,
) -> Issued:
    """Sign a server certificate valid for every host (DNS name or IP) agents dial."""
    if not hosts:
        raise PkiInputError("give at least one --server HOST (the name or IP agents dial)")
    names = [_server_host(h) for h in hosts]
    names = list(dict.fromkeys(names))
    alt: list[x509.GeneralName] = []
    for host in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    return _issue(
        directory,
        stem=f"server-{_file_safe(names[0])}",
        common_name=names[0],
        alt_names=alt,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        names=tuple(names),
        now=now,
        days=days,
        out_dir=out_dir,
        key_type=key_type,
        force=force,
    )


def issue_node(
    directory: Path,
    node: str,
    *,
    now: datetime,
    days: int = DEFAULT_LEAF_DAYS,
    out_dir: Path | None = None,
    key_type: KeyType = "ec",
    force: bool = False,
) -> Issued:
    """Sign a client certificate for the node agent `node` (CN and DNS SAN = the node id)."""
    if not _NODE.fullmatch(node):
        raise PkiInputError(
            f"{node!r} cannot be a node name in a certificate: use letters, digits and . _ - "
            "(not at the ends), the same id the agent registers with (--node-id)"
        )
    return _issue(
        directory,
        stem=f"node-{node}",
        common_name=node,
        alt_names=[x509.DNSName(node)],
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        names=(node,),
        now=now,
        days=days,
        out_dir=out_dir,
        key_type=key_type,
        force=force,
    )


def _issue(
    directory: Path,
    *,
    stem: str,
    common_name: str,
    alt_names: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    names: tuple[str, ...],
    now: datetime,
    days: int,
    out_dir: Path | None,
    key_type: KeyType,
    force: bool,
) -> Issued:
    _check_days(days)
    if not (directory / CA_CERT).exists():
        raise PkiFileError(
            directory / CA_CERT,
            f"no CA in {directory}: create one with `llmgw certs init --dir {directory}`",
        )
    ca_cert = read_certificate(directory / CA_CERT)
    ca_key = read_private_key(directory / CA_KEY)
    check_key_pair(ca_cert, ca_key, key_path=directory / CA_KEY)
    # A leaf outliving its CA would be refused anyway once the CA expires.
    not_after = min(now + timedelta(days=days), ca_cert.not_valid_after_utc)
    key = _new_key(key_type)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                # RSA key exchange needs it; with EC keys (ECDHE) it is meaningless.
                key_encipherment=key_type == "rsa",
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        # One purpose per certificate: a node's certificate cannot serve as the
        # server's (agents trust the same CA for both), nor the server's as a node's.
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    cert = builder.sign(ca_key, hashes.SHA256())
    target = directory if out_dir is None else out_dir
    cert_path, key_path = target / f"{stem}.crt", target / f"{stem}.key"
    write_files(
        [
            PemFile(key_path, _key_pem(key), KEY_MODE),
            PemFile(cert_path, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE),
        ],
        force=force,
    )
    return Issued(cert=cert_path, key=key_path, names=names, not_after=not_after)


def _new_key(key_type: KeyType) -> PrivateKey:
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _check_days(days: int) -> None:
    if days < 1:
        raise PkiInputError(f"--days {days}: a certificate must be valid for at least 1 day")


def _server_host(text: str) -> str:
    host = text.strip()
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(bare))
    if ":" in host:
        raise PkiInputError(
            f"--server {text!r}: give the host only, without a port (e.g. ctl-1.example or "
            "10.0.0.1)"
        )
    if not _DNS.fullmatch(host):
        raise PkiInputError(
            f"--server {text!r} is not a DNS name or an IP address (e.g. ctl-1.example, "
            "10.0.0.1, ::1)"
        )
    return host.rstrip(".").lower()


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).replace("*", "_")
