"""The router's queue on the dashboard's model page (the real dashboard over a small fleet)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
from dashboard_fleet import fleet_sources
from starlette.applications import Starlette

from llmgw.store import open_store, store_url
from llmgw.web import create_dashboard_routes

SATURATED = {
    "model": "model-001",
    "waiting": 3,
    "classes": {
        "interactive": {"waiting": 1, "oldest_wait_seconds": 0.5},
        "default": {"waiting": 0, "oldest_wait_seconds": 0},
        "batch": {"waiting": 2, "oldest_wait_seconds": 12.0},
    },
    "state": "saturated",
    "saturated": True,
    "reserve": 2,
    "elsewhere": {"in_flight": 4, "waiting": 1},
    "replicas": [],
}


async def test_the_model_page_shows_its_queue(tmp_path: Path) -> None:
    store = await open_store(store_url(tmp_path / "data", None))
    await store.upgrade()
    try:
        sources, _ = await fleet_sources(store, nodes=2, models=3)
        held = {
            **SATURATED,
            "state": "full but for kept places",
            "saturated": False,
            "reserve": 1,
            "elsewhere": {},
        }
        states = {"model-001": SATURATED, "model-000": held}
        queued = dataclasses.replace(sources, queue=states.get)
        app = Starlette(routes=create_dashboard_routes(sources=queued))
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            page = (await client.get("/admin/models/model-001")).text
            other = (await client.get("/admin/models/model-002")).text
            kept = (await client.get("/admin/models/model-000")).text
    finally:
        await store.close()
    queue = page.split('<dd id="queue">')[1].split("</dd>")[0]
    assert queue.startswith("saturated · 3 waiting · interactive 1 (oldest ")
    assert "batch 2 (oldest " in queue
    assert "default" not in queue
    assert queue.endswith(
        " · 2 kept for keys under their share · other routers: 4 in flight, 1 waiting"
    )
    assert other.split('<dd id="queue">')[1].split("</dd>")[0] == "empty"
    # Requests wait while the only free places are the reserve's: over their share.
    held_back = kept.split('<dd id="queue">')[1].split("</dd>")[0]
    assert held_back.startswith("full but for kept places · 3 waiting · ")
    assert held_back.endswith(" · 1 kept for keys under their share")
