"""The nodes page and the admin API's node list at fleet scale (10,000 nodes x 8 GPUs).

Builds, in memory, the synthetic fleet of tests/dashboard_fleet.py with
`--nodes` nodes (10,000) of 8 GPUs and 200 models (a real `Inventory` with
shards, a real `Catalog`, the same `dashboard_sources(...)` and admin routes the
server mounts) and times, over `httpx.ASGITransport` (no sockets), `--repeat`
requests (10) after a warm-up of each:

- the dashboard's nodes page (first page, a middle page, a filtered page) as
  a browser's first load, and the page's htmx refresh sending back the versions
  it shows (nothing changed: 204);
- `GET /admin/api/nodes?limit=100` (one page), and the whole list without a
  limit, as every client got it before paging.

Prints a markdown section (best and median ms, answer size); nothing is
written to bench/RESULTS.md.

Not guaranteed: browser-side time; a synthetic, seeded fleet; numbers compare
only between runs on the same, otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from starlette.applications import Starlette

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic fleet is shared with the unit tests

from dashboard_fleet import FixedLeader, build_fleet, fixed_servers, full_history  # noqa: E402

from llmgw.auth import KeyService  # noqa: E402
from llmgw.cli.dashboard_wiring import dashboard_sources  # noqa: E402
from llmgw.control.adminapi import node_routes  # noqa: E402
from llmgw.store import open_store, store_url  # noqa: E402
from llmgw.web import create_dashboard_routes  # noqa: E402

HX = {"HX-Request": "true"}
TARGET_MS = 300.0


async def timed(
    client: httpx.AsyncClient, path: str, repeat: int, headers: dict[str, str] | None = None
) -> tuple[list[float], httpx.Response]:
    response = await client.get(path, headers=headers)  # warm-up
    assert response.status_code in (200, 204), (path, response.status_code, response.text[:300])
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = await client.get(path, headers=headers)
        times.append(time.perf_counter() - start)
    return times, response


async def run(nodes: int, repeat: int, data_dir: Path) -> str:
    began = time.perf_counter()
    fleet = build_fleet(nodes=nodes, gpus_per_node=8, models=200)
    store = await open_store(store_url(data_dir, None))
    await store.upgrade()
    built = time.perf_counter() - began
    try:
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
        app = Starlette(
            routes=[
                *create_dashboard_routes(sources=sources),
                *node_routes(inventory=fleet.inventory),
            ]
        )
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        rows = []
        async with httpx.AsyncClient(
            transport=transport, base_url="http://admin", timeout=120
        ) as client:
            middle = max(1, nodes // 200)
            cases = [
                ("nodes page 1", "/admin/nodes", None),
                (f"nodes page {middle}", f"/admin/nodes?page={middle}", None),
                ("nodes, filter zone=a, page 1", "/admin/nodes?q=zone%3Da", None),
            ]
            for label, path, headers in cases:
                times, response = await timed(client, path, repeat, headers)
                rows.append((label, times, len(response.content)))
            page = (await client.get("/admin/nodes")).text
            shown = [
                line.split('value="', 1)[1].split('"', 1)[0]
                for line in page.split('<input type="hidden" name="v" ')[1:]
            ]
            refresh = "/admin/nodes?" + "&".join(
                "v=" + v.replace(" ", "+").replace("#", "%23") for v in shown
            )
            times, response = await timed(client, refresh, repeat, HX)
            assert response.status_code == 204, response.status_code
            rows.append(("nodes page 1, refresh (nothing changed: 204)", times, 0))
            for label, path in (
                ("GET /admin/api/nodes?limit=100", "/admin/api/nodes?limit=100"),
                ("GET /admin/api/nodes (the whole list)", "/admin/api/nodes"),
            ):
                times, response = await timed(client, path, max(3, repeat // 3))
                rows.append((label, times, len(response.content)))
    finally:
        await store.close()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"## Nodes page and node list at {nodes:,} nodes x 8 GPUs",
        "",
        f"Run {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on `nproc` = "
        f"{os.cpu_count()}, Python {platform.python_version()}, load average before the "
        f"timings {load} (a machine shared with other engineers' runs).",
        "",
        f"Command: `.venv/bin/python bench/nodes_page_scale.py --nodes {nodes}`",
        "",
        f"Fleet built in memory in {built:.1f} s (tests/dashboard_fleet.py: {nodes:,} nodes "
        "with shards, 200 models). Each request timed after a warm-up over "
        "`httpx.ASGITransport`.",
        "",
        "| request | KiB | best ms | median ms |",
        "|---|--:|--:|--:|",
    ]
    for label, times, size in rows:
        lines.append(
            f"| {label} | {size / 1024:.0f} | {min(times) * 1000:.1f} | "
            f"{statistics.median(times) * 1000:.1f} |"
        )
    worst = max(statistics.median(t) for label, t, _ in rows if label.startswith("nodes"))
    verdict = "met" if worst * 1000 < TARGET_MS else "NOT met"
    lines += [
        "",
        f"Target (issue 30): the nodes page under {TARGET_MS:.0f} ms at {nodes:,} nodes: "
        f"{verdict} (slowest median {worst * 1000:.0f} ms).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llmgw-nodes-page-") as tmp:
        print(asyncio.run(run(args.nodes, args.repeat, Path(tmp))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
