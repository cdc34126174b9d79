"""`llmgw.pki` and `llmgw certs`: what goes into each certificate, and how files are written.

Certificates are parsed back with cryptography and checked field by field; the
time is injected, so validity periods are exact.
"""

from __future__ import annotations

import ipaddress
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from typer.testing import CliRunner

from llmgw import pki
from llmgw.cli.certs import certs_app

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


T = TypeVar("T", bound=x509.ExtensionType)


def ext(cert: x509.Certificate, kind: type[T]) -> x509.Extension[T]:
    return cert.extensions.get_extension_for_class(kind)


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "ca"
    pki.init_ca(directory, now=NOW, days=100)
    return directory


def test_the_ca_is_a_self_signed_ca_that_signs_only_leaves(tmp_path: Path) -> None:
    directory = tmp_path / "new" / "ca"
    issued = pki.init_ca(directory, now=NOW, name="Lab CA", days=30)

    assert (issued.cert, issued.key) == (directory / "ca.crt", directory / "ca.key")
    cert = load(issued.cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "Lab CA"
    assert cert.issuer == cert.subject
    cert.verify_directly_issued_by(cert)
    constraints = ext(cert, x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = ext(cert, x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    assert cert.not_valid_after_utc == NOW.replace(microsecond=0) + timedelta(days=30)
    assert cert.not_valid_before_utc < NOW  # backdated for clock skew
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert mode(issued.key) == 0o600
    assert mode(issued.cert) == 0o644
    assert mode(directory) == 0o700
    assert not [p for p in directory.iterdir() if p.name.startswith(".")]  # no temp files left


def test_a_server_certificate_names_every_host_and_serves_only(ca_dir: Path) -> None:
    issued = pki.issue_server(
        ca_dir, ["ctl-1.example", "10.0.0.1", "[::1]", "localhost", "10.0.0.1"], now=NOW, days=10
    )

    assert issued.cert == ca_dir / "server-ctl-1.example.crt"
    assert issued.names == ("ctl-1.example", "10.0.0.1", "::1", "localhost")
    cert = load(issued.cert)
    cert.verify_directly_issued_by(load(ca_dir / "ca.crt"))
    san = ext(cert, x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["ctl-1.example", "localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert list(ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not ext(cert, x509.BasicConstraints).value.ca
    assert cert.not_valid_after_utc == NOW.replace(microsecond=0) + timedelta(days=10)
    assert mode(issued.key) == 0o600


def test_a_node_certificate_carries_the_node_id_and_is_a_client(
    ca_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "for-node-a"
    issued = pki.issue_node(ca_dir, "node-a", now=NOW, days=7, out_dir=out)

    assert (issued.cert, issued.key) == (out / "node-node-a.crt", out / "node-node-a.key")
    cert = load(issued.cert)
    cert.verify_directly_issued_by(load(ca_dir / "ca.crt"))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "node-a"
    assert ext(cert, x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName) == [
        "node-a"
    ]
    assert list(ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert pki.certificate_names(cert) == ["node-a"]
    assert mode(issued.key) == 0o600


def test_a_leaf_never_outlives_its_ca(ca_dir: Path) -> None:
    issued = pki.issue_node(ca_dir, "node-a", now=NOW, days=10_000)
    assert load(issued.cert).not_valid_after_utc == load(ca_dir / "ca.crt").not_valid_after_utc


def test_rsa_keys_on_request(tmp_path: Path) -> None:
    pki.init_ca(tmp_path, now=NOW, key_type="rsa")
    issued = pki.issue_node(tmp_path, "n1", now=NOW, key_type="rsa")
    key = pki.read_private_key(issued.key)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 2048
    assert ext(load(issued.cert), x509.KeyUsage).value.key_encipherment


def test_nothing_is_overwritten_without_force(ca_dir: Path) -> None:
    before = (ca_dir / "ca.key").read_bytes()
    with pytest.raises(pki.PkiExistsError) as refused:
        pki.init_ca(ca_dir, now=NOW)
    assert set(refused.value.paths) == {ca_dir / "ca.crt", ca_dir / "ca.key"}
    assert "--force" in str(refused.value)
    assert (ca_dir / "ca.key").read_bytes() == before

    pki.issue_node(ca_dir, "node-a", now=NOW)
    node_key = (ca_dir / "node-node-a.key").read_bytes()
    with pytest.raises(pki.PkiExistsError):
        pki.issue_node(ca_dir, "node-a", now=NOW)
    assert (ca_dir / "node-node-a.key").read_bytes() == node_key

    (ca_dir / "node-node-a.key").chmod(0o644)
    pki.issue_node(ca_dir, "node-a", now=NOW, force=True)
    assert (ca_dir / "node-node-a.key").read_bytes() != node_key
    assert mode(ca_dir / "node-node-a.key") == 0o600


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda d: pki.issue_node(d, "bad name", now=NOW), "cannot be a node name"),
        (lambda d: pki.issue_node(d, "", now=NOW), "cannot be a node name"),
        (lambda d: pki.issue_server(d, ["ctl-1:9443"], now=NOW), "without a port"),
        (lambda d: pki.issue_server(d, ["bad host!"], now=NOW), "not a DNS name or an IP"),
        (lambda d: pki.issue_server(d, [], now=NOW), "at least one --server"),
        (lambda d: pki.issue_node(d, "n1", now=NOW, days=0), "at least 1 day"),
    ],
)
def test_bad_input_is_refused_with_what_to_give(ca_dir: Path, call: object, message: str) -> None:
    assert callable(call)
    with pytest.raises(pki.PkiInputError, match=message):
        call(ca_dir)


def test_issuing_without_a_ca_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(pki.PkiFileError) as missing:
        pki.issue_node(tmp_path / "nowhere", "n1", now=NOW)
    assert "llmgw certs init --dir" in str(missing.value)


def test_tls_material_is_checked_file_by_file(ca_dir: Path, tmp_path: Path) -> None:
    a = pki.issue_node(ca_dir, "node-a", now=NOW)
    b = pki.issue_node(ca_dir, "node-b", now=NOW)
    material = pki.load_tls_material(cert=a.cert, key=a.key, ca=ca_dir / "ca.crt")
    assert material.names == ("node-a",)
    assert material.key == a.key.read_bytes()

    with pytest.raises(pki.PkiFileError) as mismatch:
        pki.load_tls_material(cert=a.cert, key=b.key, ca=ca_dir / "ca.crt")
    assert mismatch.value.path == b.key
    assert "does not belong to the certificate" in str(mismatch.value)

    garbage = tmp_path / "garbage.pem"
    garbage.write_text("hello\n")
    with pytest.raises(pki.PkiFileError) as not_pem:
        pki.load_tls_material(cert=a.cert, key=a.key, ca=garbage)
    assert not_pem.value.path == garbage and "not a PEM certificate" in str(not_pem.value)
    with pytest.raises(pki.PkiFileError) as not_key:
        pki.load_tls_material(cert=a.cert, key=garbage, ca=ca_dir / "ca.crt")
    assert "not a PEM private key" in str(not_key.value)
    with pytest.raises(pki.PkiFileError) as absent:
        pki.load_tls_material(cert=tmp_path / "nope.crt", key=a.key, ca=ca_dir / "ca.crt")
    assert "No such file" in str(absent.value)


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(certs_app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_the_cli_prints_the_files_and_how_to_use_them(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    code, out, _ = run("init", "--dir", str(ca), "--name", "Test CA", "--days", "30")
    assert code == 0, out
    assert f"wrote {ca / 'ca.crt'}" in out and f"wrote {ca / 'ca.key'}" in out

    code, out, _ = run("issue", "--dir", str(ca), "--server", "127.0.0.1", "--server", "localhost")
    assert code == 0, out
    assert "agent_tls:" in out
    assert f"cert: {ca / 'server-127.0.0.1.crt'}" in out
    assert f"ca: {ca / 'ca.crt'}" in out

    code, out, _ = run(
        "issue", "--dir", str(ca), "--node", "gpu-7", "--out-dir", str(tmp_path / "n")
    )
    assert code == 0, out
    assert f"--tls-cert {tmp_path / 'n' / 'node-gpu-7.crt'}" in out
    assert f"--tls-key {tmp_path / 'n' / 'node-gpu-7.key'}" in out

    code, _, err = run("init", "--dir", str(ca))
    assert code == 2 and "refusing to overwrite" in err
    code, _, err = run("issue", "--dir", str(ca))
    assert code == 2 and "either --server HOST" in err
    code, _, err = run("issue", "--dir", str(ca), "--node", "a", "--server", "h")
    assert code == 2 and "not both" in err
