"""Certificates for the agent listener's mutual TLS: a small CA, and reading PEM files.

`init_ca`, `issue_server` and `issue_node` back `llmgw certs`; the PEM readers
are what the server and the agent use to check their files at start-up, so a
wrong path or a key that does not match fails with a message naming the file.
"""

from llmgw.pki.errors import PkiError, PkiExistsError, PkiFileError, PkiInputError
from llmgw.pki.issue import (
    CA_CERT,
    CA_KEY,
    DEFAULT_CA_DAYS,
    DEFAULT_CA_NAME,
    DEFAULT_LEAF_DAYS,
    Issued,
    KeyType,
    init_ca,
    issue_node,
    issue_server,
)
from llmgw.pki.pem import (
    TlsMaterial,
    certificate_names,
    check_key_pair,
    common_name,
    load_tls_material,
    read_bytes,
    read_certificate,
    read_private_key,
)

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "DEFAULT_CA_DAYS",
    "DEFAULT_CA_NAME",
    "DEFAULT_LEAF_DAYS",
    "Issued",
    "KeyType",
    "PkiError",
    "PkiExistsError",
    "PkiFileError",
    "PkiInputError",
    "TlsMaterial",
    "certificate_names",
    "check_key_pair",
    "common_name",
    "init_ca",
    "issue_node",
    "issue_server",
    "load_tls_material",
    "read_bytes",
    "read_certificate",
    "read_private_key",
]
