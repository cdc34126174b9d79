"""Dashboard render time: every page, whole and as its refreshing fragment, at fleet scale.

Builds, in memory, what a server with 100 nodes x 8 GPUs and 200 models holds:
a real `Inventory` (nodes registered as agents do, with shards: ready, loading
and failed ones with an engine output tail, some nodes draining), a real
`Catalog` and a `Controller` (built, never run) behind `ModelControlService`,
a real SQLite store with 40 API keys and 20,000 usage records over 30 days, an
hour of router metrics history, and 500 events. The dashboard gets them through
the same `dashboard_sources(...)` adapters the server uses, so each page costs
what it costs in the server, data gathering included.

Each page is requested `--repeat` times (20) after a warm-up through
`httpx.ASGITransport` (no sockets), as a browser's first load (whole page,
gzip accepted) and as htmx's refresh (`HX-Request: true`); the table gives the
best and median wall time per page against the 200 ms target, and the page's
size before and after gzip. "sources" is the part spent reading the sources
(the admin API's dicts) for that page, measured apart.

The markdown section is printed and written into bench/RESULTS.md between the
`dashboard-render` markers (appended at the end when missing); `--no-write`
only prints.

Not guaranteed: browser-side time (parsing, htmx's swap) is not measured, nor
are concurrent requests; numbers compare only between runs on the same idle
machine. The fleet is synthetic (seeded), built by tests/dashboard_fleet.py.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import gzip
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic fleet is shared with the unit tests
sys.path.insert(0, str(ROOT / "bench"))

from dashboard_fleet import (  # noqa: E402
    FixedLeader,
    build_fleet,
    fake_events,
    fixed_servers,
    full_history,
    seed_store,
)
from sections import write_section  # noqa: E402

from llmgw.auth import KeyService  # noqa: E402
from llmgw.cli.dashboard_wiring import dashboard_sources  # noqa: E402
from llmgw.store import open_store, store_url  # noqa: E402
from llmgw.web import (  # noqa: E402
    DashboardSources,
    create_dashboard_routes,
    views,
)
from llmgw.web.usage_page import parse_range, usage_page  # noqa: E402

NAME = "dashboard-render"
HEADING = "## Dashboard render time: 100 nodes x 8 GPUs, 200 models"
COMMAND = ".venv/bin/python bench/dashboard_render.py"
TARGET_MS = 200.0


@dataclasses.dataclass
class Row:
    page: str
    kind: str
    size: int
    packed: int
    best: float
    median: float
    sources: float | None


def _tree() -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"`{commit}`" + (" + uncommitted changes in src/" if dirty else "")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


async def build(data_dir: Path) -> tuple[DashboardSources, str, Any]:
    fleet = build_fleet(nodes=100, gpus_per_node=8, models=200)
    store = await open_store(store_url(data_dir, None))
    await store.upgrade()
    await seed_store(store, fleet.clock, keys=40, records=20_000, days=30)
    sources = dashboard_sources(
        inventory=fleet.inventory,
        catalog=fleet.catalog,
        model_control=fleet.control,
        keys=KeyService(keys=store.keys, wall_clock=fleet.clock.wall),
        usage=store.usage,
        leadership=FixedLeader(),
        servers=fixed_servers,
        lease_ttl=15.0,
        history=full_history(),
        wall_clock=fleet.clock.wall,
    )
    events = fake_events(500)
    # The controller keeps its own events and is not run here; 500 of the same shape.
    sources = dataclasses.replace(sources, events=lambda: events)
    nodes = sources.nodes()
    shards = sum(len(n["shards"]) for n in nodes)
    failed = sum(1 for n in nodes for s in n["shards"] if s["state"] == "failed")
    draining = sum(1 for n in nodes if n["draining"])
    shape = (
        f"{len(nodes)} nodes x 8 GPUs ({shards} shards, {failed} failed with an output tail; "
        f"{draining} nodes draining), 200 models (every 17th wants a GPU kind no node has), "
        "40 keys and 20,000 usage records over 30 days in SQLite, an hour of metrics "
        "history (360 points), 500 events (seed 7)."
    )
    return sources, shape, store


async def timed(
    client: httpx.AsyncClient, path: str, headers: dict[str, str], repeat: int
) -> tuple[list[float], httpx.Response]:
    response = await client.get(path, headers=headers)  # warm-up
    assert response.status_code == 200, (path, response.status_code, response.text[:300])
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = await client.get(path, headers=headers)
        times.append(time.perf_counter() - start)
    return times, response


def source_time(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def measure(sources: DashboardSources, repeat: int) -> list[Row]:
    app = Starlette(routes=create_dashboard_routes(sources=sources))
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    loop = asyncio.get_running_loop()
    span = parse_range({"range": "30d"}, sources.wall_clock())
    failed = next(
        s["model"] for n in sources.nodes() for s in n["shards"] if s["state"] == "failed"
    )

    async def usage_sources() -> None:
        await usage_page(sources, span)

    pages: list[tuple[str, str, Callable[[], object] | None]] = [
        ("overview", "/admin/", lambda: views.overview(sources)),
        ("nodes", "/admin/nodes", lambda: views.nodes_page(sources)),
        ("models", "/admin/models", lambda: views.models_page(sources)),
        (f"model (a failed replica: {failed})", f"/admin/models/{failed}",
         lambda: views.model_page(sources, failed)),
        ("model (unplaceable: model-016)", "/admin/models/model-016",
         lambda: views.model_page(sources, "model-016")),
        ("usage (30 days)", "/admin/usage?range=30d", None),
        ("keys", "/admin/keys", None),
        ("events", "/admin/events", lambda: views.events_page(sources)),
    ]  # fmt: skip
    rows = []
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        for page, path, source in pages:
            src = source_time(source, repeat) if source is not None else None
            if page.startswith("usage"):
                times = []
                for _ in range(repeat):
                    start = loop.time()
                    await usage_sources()
                    times.append(loop.time() - start)
                src = statistics.median(times)
            for kind, headers in (
                ("page", {"Accept-Encoding": "gzip"}),
                ("fragment", {"HX-Request": "true", "Accept-Encoding": "gzip"}),
            ):
                times, response = await timed(client, path, headers, repeat)
                size = len(response.content)
                rows.append(
                    Row(
                        page, kind, size, len(gzip.compress(response.content, 5)),
                        min(times), statistics.median(times), src if kind == "page" else None,
                    )
                )  # fmt: skip
    return rows


def report(rows: list[Row], shape: str, repeat: int, load: str) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    worst = max(r.median for r in rows) * 1000
    verdict = "met" if worst < TARGET_MS else "**missed**"
    lines = [
        HEADING,
        "",
        f"Run {now} on `nproc` = {os.cpu_count()}, {_cpu()}, Python "
        f"{platform.python_version()} ({platform.python_implementation()}), load average "
        f"before the run {load}. Tree: {_tree()}.",
        "",
        f"Command: `{COMMAND}`",
        "",
        f"Data: {shape}",
        "",
        f"Each page requested {repeat} times after a warm-up over `httpx.ASGITransport` "
        "(in process, no sockets): `page` is a browser's first load (the whole page, "
        "gzipped), `fragment` is htmx's refresh every 5 s (`HX-Request: true`, the live "
        "part only). `sources` is the median time of reading the sources alone (the admin "
        "API's dicts: for the models pages that is `ModelControlService.statuses()`, "
        "one pass over the fleet for every model's state).",
        "",
        "| page | request | KiB | KiB gzipped | best ms | median ms | of which sources ms |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        src = f"{r.sources * 1000:.1f}" if r.sources is not None else ""
        lines.append(
            f"| {r.page} | {r.kind} | {r.size / 1024:,.0f} | {r.packed / 1024:,.0f} "
            f"| {r.best * 1000:.1f} | {r.median * 1000:.1f} | {src} |"
        )
    lines += [
        "",
        f"Target (from the issue): no page over {TARGET_MS:.0f} ms to render with 100 nodes "
        f"and 200 models — {verdict} (slowest median {worst:.0f} ms).",
        "",
    ]
    return "\n".join(lines)


async def run(repeat: int) -> tuple[list[Row], str]:
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-dash-") as tmp:
        sources, shape, store = await build(Path(tmp))
        try:
            return await measure(sources, repeat), shape
        finally:
            await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=20, help="timed requests per page")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows, shape = asyncio.run(run(args.repeat))
    body = report(rows, shape, args.repeat, load)
    print(body)
    if not args.no_write:
        write_section(NAME, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
