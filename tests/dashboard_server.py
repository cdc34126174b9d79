"""The dashboard over real HTTP (uvicorn on loopback, in a thread) with a synthetic fleet.

For browser tests and the nodes page benchmark: the fleet of dashboard_fleet.py
(nodes x 8 GPUs, 200 models, shards in every state, some nodes draining), a real
SQLite store for keys and usage, and the same `dashboard_sources(...)` the
server uses. `drain` changes the fleet from outside the server's loop, as an
agent or another admin would.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import uvicorn
from dashboard_fleet import FixedLeader, build_fleet, fixed_servers, full_history
from starlette.applications import Starlette

from llmgw.auth import KeyService
from llmgw.cli.dashboard_wiring import dashboard_sources
from llmgw.store import open_store, store_url
from llmgw.web import create_dashboard_routes


class ServedDashboard:
    """The dashboard on a loopback port, in a thread with its own event loop."""

    def __init__(self, data_dir: Path, *, nodes: int = 100, refresh_seconds: float = 5.0) -> None:
        self.fleet = build_fleet(nodes=nodes, gpus_per_node=8, models=200)
        self._refresh_seconds = refresh_seconds
        self._data_dir = data_dir
        self._ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: uvicorn.Server | None = None
        self.port = 0
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        store = await open_store(store_url(self._data_dir, None))
        await store.upgrade()
        sources = dashboard_sources(
            inventory=self.fleet.inventory,
            catalog=self.fleet.catalog,
            model_control=self.fleet.control,
            keys=KeyService(keys=store.keys, wall_clock=self.fleet.clock.wall),
            usage=store.usage,
            leadership=FixedLeader(),
            servers=fixed_servers,
            lease_ttl=15.0,
            history=full_history(),
            wall_clock=self.fleet.clock.wall,
        )
        app = Starlette(
            routes=create_dashboard_routes(sources=sources, refresh_seconds=self._refresh_seconds)
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        serving = asyncio.ensure_future(self.server.serve())
        # uvicorn says it has started only through this flag.
        while not self.server.started:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await serving
        finally:
            await store.close()

    def __enter__(self) -> ServedDashboard:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the dashboard did not start within 60 s")
        return self

    def __exit__(self, *_: object) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self._thread.join(30)

    def drain(self, node_id: str, draining: bool) -> None:
        assert self.loop is not None
        done = threading.Event()

        def change() -> None:
            self.fleet.inventory.set_draining(node_id, draining)
            done.set()

        self.loop.call_soon_threadsafe(change)
        done.wait(10)
