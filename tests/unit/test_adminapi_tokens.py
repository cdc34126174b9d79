"""The join token admin routes over httpx's ASGI transport: a real cluster PKI on a real SQLite store.

A token's labels and fabric labels are what its nodes keep, so what goes into
them is checked: keys matched whole, values printable and bounded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette

from llmgw.control.adminapi.tokens import join_token_routes
from llmgw.control.agentsvc.cluster_pki import ClusterPki, PkiSettings
from llmgw.pki.cluster import create_cluster_key
from llmgw.store import open_store, store_url


def now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    store = await open_store(store_url(tmp_path / "data", None))
    await store.upgrade()
    pki = ClusterPki(
        repo=store.pki, key=create_cluster_key(tmp_path / "cluster.key"), server_id="s:1",
        server_names=["127.0.0.1"], wall_clock=now, nodeids=store.nodeids,
        settings=PkiSettings(
            ca_lifetime=timedelta(days=30), server_cert_lifetime=timedelta(days=1),
            node_cert_lifetime=timedelta(days=1), poll_interval=1.0,
        ),
    )  # fmt: skip
    await pki.open()
    app = Starlette(routes=join_token_routes(issuer=pki, unavailable="off", wall_clock=now))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin"
    ) as made:
        yield made
    await store.close()


async def test_a_token_fixes_labels_and_fabric_labels_and_lists_them(
    client: httpx.AsyncClient,
) -> None:
    made = await client.post(
        "/admin/api/join-tokens",
        json={"labels": {"zone": "a"}, "fabric": {"ib-domain": "pod3"}, "max_uses": 1},
    )
    assert made.status_code == 201, made.text
    assert (made.json()["labels"], made.json()["fabric"]) == ({"zone": "a"}, {"ib-domain": "pod3"})
    [listed] = (await client.get("/admin/api/join-tokens")).json()["tokens"]
    assert (listed["labels"], listed["fabric"]) == ({"zone": "a"}, {"ib-domain": "pod3"})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"labels": {"zone\n": "a"}}, "labels"),
        ({"labels": {"zone": "a\nb"}}, "labels"),
        ({"labels": {"zone": "x" * 254}}, "labels"),
        ({"fabric": {"ib domain": "pod3"}}, "fabric"),
        ({"fabric": ["ib-domain=pod3"]}, "fabric"),
        ({"fabrics": {}}, "fabrics"),
    ],
)
async def test_labels_a_token_cannot_carry_are_refused_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, object], param: str
) -> None:
    refused = await client.post("/admin/api/join-tokens", json=body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == param
    assert (await client.get("/admin/api/join-tokens")).json()["tokens"] == []
