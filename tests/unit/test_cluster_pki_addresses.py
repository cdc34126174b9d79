"""A server listening on every address re-issues its certificate for agents when the host's
addresses change, on a real store with a settable clock (the harness of test_cluster_pki.py)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from store_fixtures import FakeClock, clock_fixture, store_fixture, target_fixture  # noqa: F401
from test_cluster_pki import SETTINGS

from llmgw.agent.enroll import verify_server
from llmgw.control.agentsvc.cluster_pki import ClusterPki, local_addresses
from llmgw.pki.cluster import create_cluster_key, parse_join_token
from llmgw.store import Store


def addresses_of(pki: ClusterPki) -> set[str]:
    names = pki.server_certificate.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value
    return {str(a) for a in names.get_values_for_type(x509.IPAddress)}


async def test_an_address_that_comes_up_later_is_in_the_certificate_at_the_next_poll(
    store: Store, store_clock: FakeClock, tmp_path: Path
) -> None:
    host = ["10.0.0.5"]
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            host.append("100.64.7.9")  # a VPN came up
        if len(sleeps) > 3:
            raise TimeoutError

    pki = ClusterPki(
        repo=store.pki,
        key=create_cluster_key(tmp_path / "cluster.key"),
        server_id="ctl-1:1",
        server_names=["ctl-1.example", "127.0.0.1"],
        settings=SETTINGS,
        wall_clock=store_clock,
        sleep=sleep,
        host_addresses=lambda: list(host),
    )
    await pki.open()
    pki.server_credentials()
    assert addresses_of(pki) == {"10.0.0.5", "127.0.0.1"}
    first = pki.server_certificate.serial_number

    with pytest.raises(TimeoutError):
        await pki.run()

    assert addresses_of(pki) == {"10.0.0.5", "100.64.7.9", "127.0.0.1"}
    assert pki.server_certificate.serial_number != first
    # Handed to the listener once; polls that found nothing new changed nothing.
    assert isinstance(pki._fetch(), grpc.ServerCertificateConfiguration)
    assert pki._fetch() is None
    assert len(await store.pki.certificates(kind="server")) == 2
    # An agent dialling the new address accepts the certificate.
    text, _ = await pki.create_token(ttl=SETTINGS.server_cert_lifetime, max_uses=1, labels={})
    chain = [pki.server_certificate, x509.load_pem_x509_certificate(pki.ca_bundle_pem)]
    verify_server(chain, parse_join_token(text), "100.64.7.9:9443")


def test_local_addresses_include_every_ipv4_address_of_this_host() -> None:
    found = local_addresses()
    assert "127.0.0.1" in found
    assert all(ipaddress.ip_address(a) for a in found)
    assert len(found) == len(set(found))
