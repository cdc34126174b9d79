"""A real admin server on loopback for the admin CLI tests (`llmgw status`, nodes, models).

Real routes (nodes, models, leader) over a real `Inventory` and a real
`Catalog` on a SQLite store, served by uvicorn in a thread. Doubles only where
the control plane's other parts would be: the reconciler's `ModelControl`
(`ScriptedControl`, whose statuses change on a script), leadership
(`StaticLeader`) and the agent service's `remove_weights`. A scripted
inventory changes shards a moment after a node is drained, on the server's
own event loop, as agent reports would.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from llmgw.control.adminapi import model_routes, node_routes
from llmgw.control.catalog import Catalog, CatalogModel, parse_model
from llmgw.control.inventory import Inventory, Node, NodeBrief
from llmgw.control.leadership import LeaderInfo, leader_routes
from llmgw.store import ControlServer, open_store, store_url

SINCE = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

CONFIG_MODELS = [
    {"name": "gemma", "weights": "/m/gemma.gguf", "profiles": [{"engine": "llamacpp"}]},
    {"name": "llama-8b", "weights": "/m/llama", "profiles": [{"engine": "vllm", "gpus": 1}]},
    {"name": "qwen", "weights": "/m/qwen", "profiles": [{"engine": "vllm", "gpus": 2}]},
]


def idle() -> dict[str, Any]:
    return {
        "state": "stopped",
        "desired_replicas": 0,
        "ready_replicas": 0,
        "replicas": [],
        "last_failure": None,
        "unplaceable": None,
        "retry_in_seconds": 0.0,
    }


def replica(rid: str, node: str, state: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": rid,
        "node": node,
        "state": state,
        "gpus": extra.pop("gpus", [0]),
        "endpoint_url": extra.pop("endpoint_url", None),
        "message": extra.pop("message", ""),
        **extra,
    }


@dataclass
class ScriptedControl:
    """A `ModelControl`: canned statuses; `activate` plays a script of status changes."""

    canned: dict[str, dict[str, Any]] = field(default_factory=dict)
    scripts: dict[str, list[tuple[float, dict[str, Any]]]] = field(default_factory=dict)
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)
    explanations: dict[str, dict[str, Any]] = field(default_factory=dict)
    activated: list[str] = field(default_factory=list)
    # Set when a model's status is read: a script step's status is read once before the
    # next step replaces it, so a poller on a loaded machine still sees every step.
    read: dict[str, asyncio.Event] = field(default_factory=dict)

    def status(self, name: str) -> dict[str, object]:
        if name in self.read:
            self.read[name].set()
        return dict(self.canned.get(name) or idle())

    def statuses(self) -> dict[str, dict[str, object]]:
        return {name: self.status(name) for name in self.canned}

    def explain(self, name: str) -> dict[str, object]:
        return self.explanations.get(
            name, {"model": name, "placeable": True, "placement": {"node": "node-b"}}
        )

    def dry_run(self, model: CatalogModel) -> dict[str, object]:
        return {"model": model.name, "placeable": True}

    async def activate(self, name: str) -> dict[str, object]:
        self.activated.append(name)
        read: asyncio.Event | None = None
        for delay, status in self.scripts.get(name, []):
            await asyncio.sleep(delay)
            if read is not None:
                async with asyncio.timeout(30):
                    await read.wait()
            read = self.read[name] = asyncio.Event()
            self.canned[name] = status
        return {**self.status(name), "error": self.errors.get(name)}


@dataclass
class StaticLeader:
    role: str = "leader"
    leader: str | None = "srv-a"

    def info(self) -> LeaderInfo:
        return LeaderInfo(
            server="srv-a" if self.role == "leader" else "srv-b",
            role="leader" if self.role == "leader" else "standby",
            leader=self.leader,
            epoch=3,
            since=SINCE,
            expires_at=SINCE,
            agent_address="10.0.0.1:9443",
            role_since=SINCE,
        )


class StaticServers:
    """The two servers of StaticLeader, both seen at SINCE."""

    async def servers(self) -> list[ControlServer]:
        return [
            ControlServer(
                server=name, hostname=name, version="0.1.0", api_url=f"http://{name}:8080",
                agent_address=f"{name}:9443", started_at=SINCE, last_seen=SINCE,
            )
            for name in ("srv-a", "srv-b")
        ]  # fmt: skip


Step = Callable[[Inventory], object]


class ScriptedInventory(Inventory):
    """An `Inventory` that plays `on_drain[node_id]` once that node is drained.

    The script is a list of (moment, step); steps of the same moment happen
    together. Negative moments are played at once, with the drain; then one
    moment after each read of the nodes (the admin API's GET), so a client
    that polls sees every moment once, in order, however slow the machine is.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_drain: dict[str, list[tuple[float, Step]]] = {}
        self._playing: list[list[Step]] = []
        self._owed = 0  # a listing was read: the next moment plays when the next one starts

    def set_draining(self, node_id: str, draining: bool) -> Node:
        node = super().set_draining(node_id, draining)
        script = self.on_drain.pop(node_id, []) if draining else []
        moments: dict[float, list[Step]] = {}
        for moment, step in sorted(script, key=lambda entry: entry[0]):
            moments.setdefault(moment, []).append(step)
        for moment, steps in moments.items():
            if moment < 0:
                for step in steps:
                    step(self)
            else:
                self._playing.append(steps)
        return node

    def briefs(self) -> list[NodeBrief]:
        # The admin API's node list reads briefs, then the nodes on its page: the
        # moment owed after a listing is played when the next listing starts, so
        # that the listing itself still shows the state before it.
        if self._owed:
            self._owed = 0
            self._play()
        seen = super().briefs()
        if self._playing:
            self._owed = 1
        return seen

    def _play(self) -> None:
        if self._playing:
            for step in self._playing.pop(0):
                step(self)


class RecordHeaders:
    """ASGI middleware that keeps every request's Authorization header (None when absent)."""

    def __init__(self, app: ASGIApp, seen: list[str | None]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            value = headers.get(b"authorization")
            self.seen.append(value.decode() if value is not None else None)
        await self.app(scope, receive, send)


@dataclass
class AdminServer:
    url: str
    control: ScriptedControl
    inventory: Inventory
    authorization: list[str | None]


@contextmanager
def serve(
    tmp_path: Path,
    *,
    inventory: Inventory,
    control: ScriptedControl | None = None,
    leader: StaticLeader | None = None,
    remove_weights: Callable[[str, str], Awaitable[None]] | None = None,
) -> Iterator[AdminServer]:
    """The admin app on a free loopback port; `leader=None` serves no leader route."""
    control = control or ScriptedControl()
    seen: list[str | None] = []

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The store lives on the server thread's event loop.
        store = await open_store(store_url(tmp_path / "data", None))
        await store.upgrade()
        models = [parse_model(m, source="config") for m in CONFIG_MODELS]
        catalog = Catalog(repo=store.catalog, config_models=models, config_file="llmgw.yaml")
        await catalog.load()
        app.router.routes.extend(
            [
                *node_routes(inventory=inventory, remove_weights=remove_weights),
                *model_routes(catalog=catalog, control=control),
                *(
                    leader_routes(
                        leadership=leader,
                        servers=StaticServers(),
                        # Just before SINCE: StaticLeader's lease (to SINCE) still holds.
                        wall_clock=lambda: SINCE - timedelta(seconds=1),
                        ttl=15.0,
                    )
                    if leader is not None
                    else []
                ),
            ]
        )
        try:
            yield
        finally:
            await store.close()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = RecordHeaders(Starlette(lifespan=lifespan), seen)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "admin server did not start"
            time.sleep(0.01)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        yield AdminServer(url=url, control=control, inventory=inventory, authorization=seen)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def unused_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def clean_env(tmp_path: Path) -> dict[str, str | None]:
    """No admin address or key from the environment, and no admin config file from $HOME."""
    return {
        "LLMGW_ADMIN_URL": None,
        "LLMGW_ADMIN_KEY": None,
        "LLMGW_ADMIN_CONFIG": None,
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "HOME": str(tmp_path / "home"),
    }
