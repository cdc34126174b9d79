"""The join token admin routes over httpx's ASGI transport: a real cluster PKI on a real SQLite store.

A token's labels and fabric labels are what its nodes keep, so what goes into
them is checked: keys matched whole, values printable and bounded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pki_fixtures import now, opened_pki
from starlette.applications import Starlette

from llmgw.control.adminapi.tokens import join_token_routes


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with opened_pki(tmp_path) as (_, pki):
        app = Starlette(routes=join_token_routes(issuer=pki, unavailable="off", wall_clock=now))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://admin"
        ) as made:
            yield made


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
