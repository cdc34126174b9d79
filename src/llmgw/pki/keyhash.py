"""The identity of a key: SHA-256 of its SubjectPublicKeyInfo, as 64 hex digits.

A node is its key: the control plane binds a node id to the hash of the public
key in the certificate that first registered under it (and revokes keys, not
certificates). Hashing the DER SubjectPublicKeyInfo, not the certificate, means
a certificate renewed for the same key keeps the node's identity, and the same
value comes out whether the key is read from a certificate or from a CSR.

Not guaranteed: anything about the certificate itself (validity, issuer, names);
the TLS handshake checks those before the hash is taken.
"""

from __future__ import annotations

import hashlib

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from llmgw.pki.errors import PkiInputError


def public_key_hash(key: PublicKeyTypes) -> str:
    """SHA-256 (hex) of the DER SubjectPublicKeyInfo of `key`."""
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def certificate_key_hash(pem: bytes) -> str:
    """The key hash of the (first) certificate in `pem`; `PkiInputError` when it is not one."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise PkiInputError(f"not a PEM certificate ({exc})") from exc
    return public_key_hash(cert.public_key())
