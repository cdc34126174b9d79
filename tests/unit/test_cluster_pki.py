"""The cluster CA at run time, on a real store: creation, the key file, certificates, joins, renewals.

`ClusterPki` runs on a real SQLite (and PostgreSQL) store with a settable
clock; the agent's side (`verify_server`, `CertificateKeeper`) runs against
what it issues. No network: the TLS listener is exercised by the integration
tests (test_agent_join.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from store_fixtures import START, FakeClock, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.agent.enroll import (
    CertificateKeeper,
    EnrollError,
    NodeCredentials,
    TlsStore,
    verify_server,
)
from llmgw.control.agentsvc.cluster_pki import (
    ClusterPki,
    ClusterPkiError,
    Peer,
    PkiSettings,
    Refusal,
)
from llmgw.pki.cluster import (
    cert_pem,
    create_cluster_key,
    key_pem,
    make_csr,
    new_ca,
    new_key,
    parse_join_token,
    read_cluster_key,
    spki_sha256,
    token_client_certificate,
)
from llmgw.store import Store

SETTINGS = PkiSettings(
    ca_lifetime=timedelta(days=3650),
    server_cert_lifetime=timedelta(hours=3),
    node_cert_lifetime=timedelta(hours=3),
    poll_interval=1.0,
)


def make_pki(store: Store, key_file: Path, clock: Callable[[], datetime]) -> ClusterPki:
    key = read_cluster_key(key_file) if key_file.exists() else create_cluster_key(key_file)
    return ClusterPki(
        repo=store.pki,
        key=key,
        server_id="ctl-1:1",
        server_names=["127.0.0.1", "ctl-1.example"],
        settings=SETTINGS,
        wall_clock=clock,
        nodeids=store.nodeids,
    )


def node_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = load_pem_private_key(pem, None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


async def joined(pki: ClusterPki, node_id: str, clock: FakeClock) -> tuple[Peer, NodeCredentials]:
    text, _ = await pki.create_token(ttl=timedelta(hours=1), max_uses=None, labels={"r": "1"})
    token = parse_join_token(text)
    presented = token_client_certificate(token, now=clock())
    peer = pki.classify([presented.cert_pem])
    assert peer.kind == "join" and peer.token_id == token.token_id
    key = new_key()
    issued = await pki.join(peer, token_text=text, node_id=node_id, csr_pem=make_csr(key, node_id))
    creds = NodeCredentials(
        key_pem=key_pem(key), cert_pem=issued.certificate_pem, ca_pem=issued.ca_pem,
        labels=issued.labels,
    )  # fmt: skip
    return pki.classify([creds.cert_pem]), creds


async def test_the_first_server_creates_the_ca_and_others_with_the_key_file_share_it(
    store: Store, store_clock: FakeClock, tmp_path: Path
) -> None:
    first = make_pki(store, tmp_path / "cluster.key", store_clock)
    await first.open()
    second = make_pki(store, tmp_path / "cluster.key", store_clock)
    await second.open()
    assert first.ca_hash == second.ca_hash
    assert (tmp_path / "cluster.key").stat().st_mode & 0o777 == 0o600
    names = first.server_certificate.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value
    assert "ctl-1.example" in names.get_values_for_type(x509.DNSName)

    stranger = make_pki(store, tmp_path / "other.key", store_clock)
    with pytest.raises(ClusterPkiError, match="sealed with another cluster key") as refused:
        await stranger.open()
    assert str(tmp_path / "other.key") in str(refused.value)
    assert "copy that server's key file" in str(refused.value)


async def test_the_server_certificate_is_renewed_and_handed_to_grpc_once(
    store: Store, store_clock: FakeClock, tmp_path: Path
) -> None:
    pki = make_pki(store, tmp_path / "cluster.key", store_clock)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        store_clock.advance(hours=1, minutes=1)
        if len(sleeps) > 2:
            raise TimeoutError

    pki._sleep = sleep
    await pki.open()
    pki.server_credentials()
    assert pki._fetch() is None  # nothing changed since the credentials were made
    before = pki.server_certificate.serial_number
    with pytest.raises(TimeoutError):
        await pki.run()
    assert pki.server_certificate.serial_number != before
    assert isinstance(pki._fetch(), grpc.ServerCertificateConfiguration)
    assert pki._fetch() is None
    servers = await store.pki.certificates(kind="server")
    assert len(servers) == 2


async def test_a_join_issues_a_node_certificate_the_agent_can_verify_and_renew(
    store: Store, store_clock: FakeClock, tmp_path: Path
) -> None:
    pki = make_pki(store, tmp_path / "cluster.key", store_clock)
    await pki.open()
    peer, creds = await joined(pki, "gpu-1", store_clock)
    assert peer.kind == "node"
    assert creds.node_id == "gpu-1" and dict(creds.labels) == {"r": "1"}

    # The agent's check of the server: the chain it is shown, against the token's hash.
    ca = x509.load_pem_x509_certificate(creds.ca_pem)
    token = parse_join_token((await pki.create_token(
        ttl=timedelta(hours=1), max_uses=1, labels={}))[0])  # fmt: skip
    assert verify_server([pki.server_certificate, ca], token, "127.0.0.1:9443") == ca
    with pytest.raises(EnrollError, match=r"not valid for 'elsewhere\.example'"):
        verify_server([pki.server_certificate, ca], token, "elsewhere.example:9443")
    foreign = new_ca(now=START, lifetime=timedelta(days=1))
    with pytest.raises(EnrollError, match="not the cluster this token was made for"):
        verify_server([pki.server_certificate, foreign.cert], token, "127.0.0.1:9443")


async def test_renewal_keeps_the_key_and_a_foreign_key_is_refused(
    store: Store, store_clock: FakeClock, tmp_path: Path
) -> None:
    pki = make_pki(store, tmp_path / "cluster.key", store_clock)
    await pki.open()
    peer, creds = await joined(pki, "gpu-1", store_clock)
    with pytest.raises(Refusal, match="must keep the node's key pair") as refused:
        await pki.renew(peer, csr_pem=make_csr(new_key(), "gpu-1"))
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT

    key = node_key(creds.key_pem)
    issued = await pki.renew(peer, csr_pem=make_csr(key, "gpu-1"))
    cert = x509.load_pem_x509_certificate(issued.certificate_pem)
    assert spki_sha256(cert) == spki_sha256(creds.cert)
    assert issued.node_id == "gpu-1"

    with pytest.raises(Refusal, match="join first") as unauthenticated:
        await pki.renew(Peer(kind="join", cert=None, token_id="x"), csr_pem=b"")
    assert unauthenticated.value.code == grpc.StatusCode.UNAUTHENTICATED


async def test_refused_joins_say_why_and_use_nothing(
    store: Store, store_clock: FakeClock, tmp_path: Path
) -> None:
    pki = make_pki(store, tmp_path / "cluster.key", store_clock)
    await pki.open()
    await joined(pki, "gpu-1", store_clock)

    text, stored = await pki.create_token(ttl=timedelta(hours=1), max_uses=1, labels={})
    token = parse_join_token(text)
    peer = pki.classify([token_client_certificate(token, now=store_clock()).cert_pem])

    # Another key asking for a node id that is bound: refused, the token not used.
    with pytest.raises(Refusal, match="belongs to another node's key") as taken:
        await pki.join(peer, token_text=text, node_id="gpu-1", csr_pem=make_csr(new_key(), "x"))
    assert taken.value.code == grpc.StatusCode.ALREADY_EXISTS
    again = await store.pki.token(stored.id)
    assert again is not None and again.uses == 0

    forged = text[:-4] + ("0000" if not text.endswith("0000") else "1111")
    with pytest.raises(Refusal, match="not valid here") as wrong:
        await pki.join(peer, token_text=forged, node_id="gpu-2", csr_pem=make_csr(new_key(), "y"))
    assert wrong.value.code == grpc.StatusCode.PERMISSION_DENIED

    store_clock.advance(hours=2)
    await pki.refresh()  # an expired token's root stays trusted: the refusal has a reason
    assert pki.classify([token_client_certificate(token, now=store_clock()).cert_pem]).kind == (
        "join"
    )
    with pytest.raises(Refusal, match="expired"):
        await pki.join(peer, token_text=text, node_id="gpu-2", csr_pem=make_csr(new_key(), "y"))


async def test_the_keeper_renews_at_two_thirds_and_stores_the_new_certificate(
    store: Store, store_clock: FakeClock, tmp_path: Path
) -> None:
    pki = make_pki(store, tmp_path / "cluster.key", store_clock)
    await pki.open()
    _, creds = await joined(pki, "gpu-1", store_clock)
    tls = TlsStore(tmp_path / "state")
    tls.save(creds)
    sleeps: list[float] = []

    async def renew_call(address: str, current: NodeCredentials) -> NodeCredentials:
        peer = pki.classify([current.cert_pem])
        key = node_key(current.key_pem)
        issued = await pki.renew(peer, csr_pem=make_csr(key, current.node_id))
        return NodeCredentials(current.key_pem, issued.certificate_pem, issued.ca_pem, {})

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) > 1:
            raise TimeoutError
        store_clock.advance(seconds=seconds)

    keeper = CertificateKeeper(
        creds=creds, store=tls, addresses=["127.0.0.1:9443"], clock=store_clock,
        sleep=sleep, renew_call=renew_call,
    )  # fmt: skip
    first = keeper.material().cert
    with pytest.raises(TimeoutError):
        await keeper.run()
    assert sleeps[0] == pytest.approx(2 * 3600, abs=1)  # two thirds of 3 h
    assert keeper.material().cert != first
    stored = tls.load()
    assert stored is not None and stored.cert_pem == keeper.material().cert
    assert stored.key_pem == creds.key_pem
    assert sleeps[1] == pytest.approx(2 * 3600, abs=1)  # the next renewal, two hours on
    assert cert_pem(stored.cert)


@pytest.mark.parametrize(
    ("node_id", "says"),
    [
        ("gpu-2\n", "matched whole"),
        ("gpu/2", "no '/'"),
        ("gpu 2", "whitespace"),
        ("gpu-2\x00", "control characters"),
        ("CTL-1.example", "one of this server's own certificate names"),
        ("127.0.0.1", "one of this server's own certificate names"),
    ],
)
async def test_a_join_under_a_bad_or_the_server_s_own_name_is_refused_naming_the_rule(
    store: Store, store_clock: FakeClock, tmp_path: Path, node_id: str, says: str
) -> None:
    pki = make_pki(store, tmp_path / "cluster.key", store_clock)
    await pki.open()
    text, stored = await pki.create_token(ttl=timedelta(hours=1), max_uses=1, labels={})
    peer = pki.classify(
        [token_client_certificate(parse_join_token(text), now=store_clock()).cert_pem]
    )
    with pytest.raises(Refusal, match=says) as refused:
        await pki.join(peer, token_text=text, node_id=node_id, csr_pem=make_csr(new_key(), "x"))
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "--node-id" in refused.value.message or "letters, digits" in refused.value.message
    unused = await store.pki.token(stored.id)
    assert unused is not None and unused.uses == 0
    assert await store.nodeids.bindings() == []
