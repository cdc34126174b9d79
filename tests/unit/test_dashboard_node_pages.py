"""The nodes page of a big fleet renders a page of cards, not all of them.

Over ASGI with 250 nodes of the synthetic fleet in dashboard_fleet.py and the real
`dashboard_sources(...)`: 100 cards a page in id order, links to the pages before
and after, the filter applied before paging, and refreshes of a page that touch
only that page.
"""

from __future__ import annotations

import html
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from dashboard_fleet import fleet_sources
from starlette.applications import Starlette
from test_dashboard_nodes import HX, cards, versions

from llmgw.store import open_store, store_url
from llmgw.web import create_dashboard_routes
from llmgw.web.nodes_page import PAGE_SIZE

NODES = 250


@pytest.fixture(name="client")
async def client_fixture(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    store = await open_store(store_url(tmp_path / "data", None))
    await store.upgrade()
    try:
        sources, _ = await fleet_sources(store, nodes=NODES, models=10)
        app = Starlette(routes=create_dashboard_routes(sources=sources))
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            yield client
    finally:
        await store.close()


def ids(numbers: range) -> list[str]:
    return [f"node-{i:03d}" for i in numbers]


async def test_pages_of_cards_in_id_order_with_links_between_them(
    client: httpx.AsyncClient,
) -> None:
    assert PAGE_SIZE == 100
    first = html.unescape((await client.get("/admin/nodes")).text)
    assert cards(first) == ids(range(100))
    assert "nodes 1 to 100 of 250 (page 1 of 3)" in first
    assert 'href="/admin/nodes?page=2" rel="next"' in first and 'rel="prev"' not in first

    second = html.unescape((await client.get("/admin/nodes", params={"page": "2"})).text)
    assert cards(second) == ids(range(100, 200))
    assert 'href="/admin/nodes?page=1" rel="prev"' in second
    assert 'href="/admin/nodes?page=3" rel="next"' in second
    # The page's refresh asks for the same page.
    assert 'hx-get="/admin/nodes?page=2"' in second

    last = html.unescape((await client.get("/admin/nodes", params={"page": "3"})).text)
    assert cards(last) == ids(range(200, 250)) and "nodes 201 to 250 of 250" in last
    assert 'rel="next"' not in last
    # Past the last page: the last; an unreadable page: the first.
    beyond = (await client.get("/admin/nodes", params={"page": "99"})).text
    assert cards(beyond) == ids(range(200, 250))
    assert cards((await client.get("/admin/nodes", params={"page": "two"})).text) == ids(range(100))


async def test_the_filter_applies_before_paging(client: httpx.AsyncClient) -> None:
    # zone=a is every fourth node: 63 of 250 fit on one page, no links.
    zone_a = html.unescape((await client.get("/admin/nodes", params={"q": "zone=a"})).text)
    assert cards(zone_a) == ids(range(0, NODES, 4))
    assert "63 of 250 nodes match" in zone_a and 'rel="next"' not in zone_a
    # "node-1" matches node-1xx: 100 of them, on one page.
    ones = html.unescape((await client.get("/admin/nodes", params={"q": "node-1"})).text)
    assert cards(ones) == ids(range(100, 200)) and 'rel="next"' not in ones
    # Every node carries team=inference: pages keep the filter in their links.
    every = html.unescape((await client.get("/admin/nodes", params={"q": "inference"})).text)
    assert 'href="/admin/nodes?q=inference&page=2" rel="next"' in every


async def test_a_refresh_of_a_page_changes_nothing_when_nothing_changed(
    client: httpx.AsyncClient,
) -> None:
    page = (await client.get("/admin/nodes", params={"page": "2"})).text
    shown = versions(page)
    params = [("v", v) for v in shown] + [("page", "2")]
    answer = await client.get("/admin/nodes", params=params, headers=HX)
    assert answer.status_code == 204
    # The versions of page 2 sent with page 1: page 2's cards go, page 1's come.
    params = [("v", v) for v in shown]
    moved = (await client.get("/admin/nodes", params=params, headers=HX)).text
    assert moved.count('hx-swap-oob="delete"') == 100
    assert cards(moved) == ids(range(100))
