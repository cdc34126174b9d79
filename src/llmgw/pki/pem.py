"""Reading and writing the PEM files of the agent listener's certificates.

`read_certificate`/`read_private_key` load a file and say what is wrong with it
(missing, unreadable, not PEM, encrypted); `check_key_pair` says whether a key
belongs to a certificate; `certificate_names` gives the names a certificate
carries (what a node's identity is compared with). `write_files` writes a set
of files all-or-nothing with respect to overwriting: when any target exists and
`force` is off, nothing is written.

Not guaranteed: that a certificate is currently valid or chains to a CA; TLS
checks that during the handshake. Files are not fsynced.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from llmgw.pki.errors import PkiExistsError, PkiFileError

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

KEY_MODE = 0o600
CERT_MODE = 0o644


@dataclass(frozen=True, slots=True)
class PemFile:
    """One file to write: its path, its bytes and its mode (0600 for keys)."""

    path: Path
    data: bytes
    mode: int


def read_bytes(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PkiFileError(path, f"cannot read the {what}: {exc.strerror or exc}") from exc


def read_certificate(path: Path) -> x509.Certificate:
    """The first certificate of a PEM file."""
    data = read_bytes(path, "certificate")
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise PkiFileError(
            path, "not a PEM certificate (expected '-----BEGIN CERTIFICATE-----')"
        ) from exc


def read_private_key(path: Path) -> PrivateKey:
    """An unencrypted EC or RSA private key from a PEM file."""
    data = read_bytes(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:
        raise PkiFileError(
            path, "the private key is encrypted; gRPC needs it unencrypted (keep it 0600)"
        ) from exc
    except ValueError as exc:
        raise PkiFileError(
            path, "not a PEM private key (expected '-----BEGIN PRIVATE KEY-----')"
        ) from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise PkiFileError(path, f"a {type(key).__name__} key; use an EC or RSA key")
    return key


def check_key_pair(cert: x509.Certificate, key: PrivateKey, *, key_path: Path) -> None:
    """Raise `PkiFileError` (naming the key file) when the key is not the certificate's."""
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if cert.public_key().public_bytes(der, public) != key.public_key().public_bytes(der, public):
        raise PkiFileError(key_path, "this private key does not belong to the certificate given")


def common_name(cert: x509.Certificate) -> str | None:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        return None
    value = names[0].value
    return value if isinstance(value, str) else value.decode()


def certificate_names(cert: x509.Certificate) -> list[str]:
    """The certificate's common name, then its DNS and IP subject alternative names."""
    found: list[str] = []
    if (cn := common_name(cert)) is not None:
        found.append(cn)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    if san is not None:
        found.extend(san.get_values_for_type(x509.DNSName))
        found.extend(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
    return list(dict.fromkeys(found))


def write_files(files: Sequence[PemFile], *, force: bool, hint: str = "") -> None:
    """Write every file (creating folders 0700); refuse before writing if any exists.

    Each file appears whole or not at all: it is written to a temporary file in
    the same folder, given its mode, then linked (no force: fails if the name
    was taken meanwhile) or renamed over the old one (force).
    """
    if not force:
        existing = [f.path for f in files if f.path.exists() or f.path.is_symlink()]
        if existing:
            raise PkiExistsError(existing, hint=hint)
    for file in files:
        _write(file, force=force)


def _write(file: PemFile, *, force: bool) -> None:
    path = file.path
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # mkstemp creates the file 0600: a key is never readable by others, not even briefly.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise PkiFileError(path, f"cannot write: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(file.data)
        os.chmod(tmp, file.mode)
        if force:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    except FileExistsError as exc:
        raise PkiExistsError([path]) from exc
    except OSError as exc:
        raise PkiFileError(path, f"cannot write: {exc.strerror or exc}") from exc
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """The PEM bytes gRPC's credentials take, checked: parseable, and the key matches."""

    cert: bytes
    key: bytes
    ca: bytes
    names: tuple[str, ...]  # of `cert`: its CN first, then its alternative names


def load_tls_material(*, cert: Path, key: Path, ca: Path) -> TlsMaterial:
    """Read and check a certificate, its key and a CA certificate.

    Raises `PkiFileError` naming the file, with `role` set to "cert", "key" or "ca".

    gRPC itself would accept bad PEM and fail only at the first handshake, with
    a message that names no file; this turns that into a start-up error.
    """
    role = "cert"
    try:
        certificate = read_certificate(cert)
        cert_pem = read_bytes(cert, "certificate")
        role = "key"
        private_key = read_private_key(key)
        check_key_pair(certificate, private_key, key_path=key)
        key_pem = read_bytes(key, "private key")
        role = "ca"
        read_certificate(ca)
        ca_pem = read_bytes(ca, "CA certificate")
    except PkiFileError as exc:
        raise PkiFileError(exc.path, exc.message, role=role) from exc
    return TlsMaterial(
        cert=cert_pem, key=key_pem, ca=ca_pem, names=tuple(certificate_names(certificate))
    )
