"""The nodes page: its filter, folded GPU rows, assigned GPUs, and refreshes that
replace only the cards that changed (out-of-band swaps; 204 when nothing did).

Over ASGI with the synthetic fleet of dashboard_fleet.py and the real
`dashboard_sources(...)`; the browser's side is in tests/browser.
"""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from dashboard_fleet import GIB, DashboardFleet, fleet_sources
from starlette.applications import Starlette

from llmgw.control.inventory.model import (
    Download,
    GpuInfo,
    GpuUsage,
    HostReading,
    NodeRegistration,
    ShardReport,
    ShardSpec,
)
from llmgw.store import open_store, store_url
from llmgw.web import DashboardSources, create_dashboard_routes
from llmgw.web.views import heard

HX = {"HX-Request": "true"}


@dataclass
class Nodes:
    client: httpx.AsyncClient
    sources: DashboardSources
    fleet: DashboardFleet


@pytest.fixture(name="nodes")
async def nodes_fixture(tmp_path: Path) -> AsyncIterator[Nodes]:
    store = await open_store(store_url(tmp_path / "data", None))
    await store.upgrade()
    try:
        sources, fleet = await fleet_sources(store, nodes=12, models=10)
        app = Starlette(routes=create_dashboard_routes(sources=sources))
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            yield Nodes(client, sources, fleet)
    finally:
        await store.close()


def cards(page: str) -> list[str]:
    return re.findall(r'<article class="card node" id="node-([^"]+)"', page)


def versions(page: str) -> list[str]:
    return [
        html.unescape(v) for v in re.findall(r'<input type="hidden" name="v" value="([^"]+)"', page)
    ]


async def refresh(nodes: Nodes, shown: list[str], q: str = "") -> httpx.Response:
    params = [("v", v) for v in shown] + ([("q", q)] if q else [])
    return await nodes.client.get("/admin/nodes", params=params, headers=HX)


async def test_the_filter_matches_ids_labels_fabric_and_states(nodes: Nodes) -> None:
    every = cards((await nodes.client.get("/admin/nodes")).text)
    assert len(every) == 12
    zone_a = cards((await nodes.client.get("/admin/nodes", params={"q": "zone=a"})).text)
    assert zone_a == [n for i, n in enumerate(every) if i % 4 == 0]
    both = (await nodes.client.get("/admin/nodes", params={"q": "ZONE=B  node-00"})).text
    assert cards(both) == ["node-001", "node-005", "node-009"]
    assert "3 of 12 nodes match <strong>ZONE=B node-00</strong>" in both
    nodes.fleet.inventory.set_draining("node-003", True)
    draining = (await nodes.client.get("/admin/nodes", params={"q": "draining"}, headers=HX)).text
    assert draining.lstrip().startswith('<section id="live"')
    assert cards(draining) == ["node-003"]
    assert 'hx-get="/admin/nodes?q=draining"' in draining
    none = (await nodes.client.get("/admin/nodes", params={"q": "no-such-node"})).text
    assert cards(none) == [] and "0 of 12 nodes match" in none and "try a node id" in none
    # The filter box keeps what was typed; the page works without htmx too.
    assert (
        'name="q" value="zone=a"'
        in (await nodes.client.get("/admin/nodes", params={"q": "zone=a"})).text
    )


async def test_a_refresh_answers_nothing_when_nothing_changed(nodes: Nodes) -> None:
    page = (await nodes.client.get("/admin/nodes")).text
    shown = versions(page)
    assert len(shown) == 13 and shown[0].startswith("#summary ")
    answer = await refresh(nodes, shown)
    assert answer.status_code == 204 and answer.content == b""


async def test_a_refresh_replaces_only_the_cards_that_changed(nodes: Nodes) -> None:
    shown = versions((await nodes.client.get("/admin/nodes")).text)
    nodes.fleet.inventory.set_draining("node-004", True)
    answer = await refresh(nodes, shown)
    assert answer.status_code == 200
    body = answer.text
    assert re.findall(
        r'<article class="card node" id="node-([^"]+)" data-node="[^"]+" hx-swap-oob="true"', body
    ) == ["node-004"]
    assert "node-summary" not in body  # the counts did not change
    assert "/admin/nodes/node-004/undrain" in body

    # A new node is appended, a removed one deleted, and the counts follow.
    shown = versions((await nodes.client.get("/admin/nodes")).text)
    register(nodes.fleet, "node-new")
    nodes.fleet.inventory.forget("node-007")
    nodes.fleet.inventory.forget("node-008")
    body = (await refresh(nodes, shown)).text
    assert '<article id="node-node-007" hx-swap-oob="delete"></article>' in body
    assert '<article id="node-node-008" hx-swap-oob="delete"></article>' in body
    assert (
        '<div hx-swap-oob="beforeend:#node-grid"><article class="card node" id="node-node-new"'
        in body
    )
    assert '<div id="node-summary" hx-swap-oob="true">' in body
    assert cards(body) == ["node-new"]


async def test_gpu_rows_are_folded_and_an_assigned_gpu_looks_assigned_without_memory(
    nodes: Nodes,
) -> None:
    shard = ShardSpec(
        shard_id="cold-1", model="cold", engine="sim", weights="w", gpu_indices=(1,), port=20001
    )
    register(
        nodes.fleet,
        "node-cold",
        shards=(
            ShardReport(
                shard_id="cold-1", model="cold", state="loading", message="", pid=1,
                endpoint_url="", output_tail=(), exit_code=None, spec=shard,
            ),
        ),
    )  # fmt: skip
    nodes.fleet.inventory.heartbeat("node-cold", [GpuUsage(0, 0.0, 0, 0), GpuUsage(1, 0.0, 0, 0)])
    page = (await nodes.client.get("/admin/nodes", params={"q": "node-cold"})).text
    card = page.split('id="node-node-cold"', 1)[1].split("</article>", 1)[0]
    fold = re.search(
        r'<details class="gpu-fold" data-fold="gpus"><summary class="small">([^<]+)</summary>', card
    )
    assert (
        fold is not None
        and html.unescape(fold.group(1)) == "2 GPUs · 1 assigned · 0.0 GiB / 48.0 GiB"
    )
    rows = re.findall(r"<li title=[^>]*>.*?</li>", card)
    assert len(rows) == 2
    assert 'class="in-use"' not in rows[0] and "assigned" not in rows[0].split(">", 1)[1]
    assert 'class="in-use"' in rows[1] and "0.0 GiB / 24.0 GiB · 0% · assigned" in html.unescape(
        rows[1]
    )


def register(fleet: DashboardFleet, node_id: str, shards: tuple[ShardReport, ...] = ()) -> None:
    fleet.inventory.register(
        NodeRegistration(
            node_id=node_id,
            hostname=f"{node_id}.example",
            agent_version="0.1.0",
            gpus=tuple(
                GpuInfo(g, f"GPU-{node_id}-{g}", "NVIDIA L4", 24 * GIB, 24 * GIB) for g in range(2)
            ),
            cpu_count=8,
            memory_total=64 * GIB,
            weights_disk_free=100 * GIB,
            gpu_source="declared",
            labels={"zone": "z"},
            fabric={},
            running_shards=shards,
            port_range=(20000, 20009),
            weights_dir="/w",
        )
    )


async def test_a_filtered_page_refreshes_only_its_own_cards(nodes: Nodes) -> None:
    page = (await nodes.client.get("/admin/nodes", params={"q": "zone=a"})).text
    assert 'hx-get="/admin/nodes?q=zone%3Da"' in page
    shown = versions(page)
    assert len(shown) == 1 + 3
    nodes.fleet.inventory.set_draining("node-001", True)  # zone b: not on this page
    assert (await refresh(nodes, shown, q="zone=a")).status_code == 204
    nodes.fleet.inventory.set_draining("node-004", True)  # zone a
    body = (await refresh(nodes, shown, q="zone=a")).text
    assert cards(body) == ["node-004"]


def _card(page: str, node_id: str) -> str:
    return html.unescape(page.split(f'id="node-{node_id}"', 1)[1].split("</article>", 1)[0])


async def test_a_download_is_a_bar_on_its_node_card_and_moves_it_on_a_refresh(
    nodes: Nodes,
) -> None:
    sha = "abc1234" + "0" * 33
    spec = ShardSpec(
        shard_id="big-1", model="big", engine="sim", weights=f"org/big@{sha}", port=20001
    )

    def report(done: int, files: tuple[str, ...]) -> ShardReport:
        return ShardReport(
            shard_id="big-1", model="big", state="starting", spec=spec,
            message=f"downloading org/big@abc1234 {done * 100 // 4_000_000_000}% of 4.0 GB",
            download=Download(
                repo="org/big", revision=sha, done=done, total=4_000_000_000,
                rate=50_000_000.0, files=files, started=None,
            ),
        )  # fmt: skip

    register(nodes.fleet, "node-dl", shards=(report(1_000_000_000, ("b.safetensors",)),))
    page = (await nodes.client.get("/admin/nodes", params={"q": "node-dl"})).text
    card = _card(page, "node-dl")
    assert '<progress max="100" value="25" aria-label="downloading org/big@abc1234">' in card
    assert (
        '<span class="download-percent">25%</span> · 1.0 GB of 4.0 GB · 50.0 MB/s · 60 s left · '
        '<span class="mono download-file">b.safetensors</span>'
    ) in card
    assert "downloading org/big@abc1234 25%" not in card  # the bar says it, once
    # Heard from just now: the text stays while heartbeats keep coming.
    assert '<span class="muted heard">heard from under 10 s ago</span>' in card
    assert "no hub weights on disk · 100.0 GiB free" in card
    shown = versions(page)
    nodes.fleet.inventory.shard_status(
        "node-dl", report(2_000_000_000, ("b.safetensors", "a.safetensors"))
    )
    body = (await refresh(nodes, shown, "node-dl")).text
    moved = _card(body, "node-dl")
    assert 'value="50"' in moved and "b.safetensors</span> and 1 more" in moved


def test_last_heard_moves_in_steps() -> None:
    assert [heard(a) for a in (None, 0.2, 9.9, 10, 59, 61, 3599, 7300, 200000)] == [
        "never", "under 10 s ago", "under 10 s ago", "10 s ago", "50 s ago", "1 min ago",
        "59 min ago", "2 h ago", "2 d ago",
    ]  # fmt: skip


async def test_a_card_shows_the_weights_disk_once_a_heartbeat_carried_it(nodes: Nodes) -> None:
    register(nodes.fleet, "node-disk")
    page = (await nodes.client.get("/admin/nodes", params={"q": "node-disk"})).text
    assert 'class="small muted disk"' not in page  # Register alone: the disk's size is unknown
    gib = 1 << 30
    reading = HostReading(
        disk_total=100 * gib, disk_free=40 * gib, memory_total=64 * gib, memory_available=gib
    )
    nodes.fleet.inventory.heartbeat("node-disk", [], [], reading)
    page = (await nodes.client.get("/admin/nodes", params={"q": "node-disk"})).text
    card = page.split('id="node-node-disk"', 1)[1].split("</article>", 1)[0]
    line = re.search(r'<p class="small muted disk">([^<]+)</p>', card)
    assert line is not None
    assert html.unescape(line.group(1)) == "disk 60.0 GiB / 100.0 GiB · 40.0 GiB free"
