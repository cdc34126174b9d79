"""The nodes page at 100 nodes in a real browser: load time and the cost of a refresh.

Serves the dashboard over real HTTP (uvicorn on loopback, in a thread) with the
synthetic fleet of tests/dashboard_fleet.py: 100 nodes x 8 GPUs, 200 models,
shards ready, loading and failed, some nodes draining. Headless Chromium
(Debian's /usr/bin/chromium, driven by Playwright) then:

- loads /admin/nodes `--loads` times in a fresh tab each, and reads the
  navigation timing: `load` is `loadEventEnd` (ms from the start of the
  navigation: the HTML fetched, parsed, styled, laid out and htmx run);
- triggers the page's refresh `--refreshes` times with nothing changed, then
  with one node changed (drained in the server between refreshes), and times
  each from the trigger to the end of htmx's work plus two animation frames (so
  the browser has laid out and painted what was swapped); `cards replaced`
  counts the node cards the refresh took out of the page.

The markdown section is printed and written into bench/RESULTS.md between the
`dashboard-nodes-browser` markers; `--no-write` only prints; `--label` names
the run (e.g. "before" / "after") and keeps earlier runs with other labels.

Not guaranteed: comparable numbers across machines, or under load; the fleet
is synthetic (seeded) and does not change on its own between refreshes.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from dashboard_server import ServedDashboard  # noqa: E402
from sections import RESULTS, write_section  # noqa: E402

NAME = "dashboard-nodes-browser"
COMMAND = ".venv/bin/python bench/dashboard_nodes_browser.py --label LABEL"
CHROMIUM = "/usr/bin/chromium"

# Resolves two animation frames after htmx handled the refresh triggered now (it
# swaps, then fires afterRequest; a 204 swaps nothing); counts node cards taken out.
REFRESH_JS = """
() => new Promise((resolve) => {
  let replaced = 0;
  const observer = new MutationObserver((records) => {
    for (const r of records) for (const n of r.removedNodes)
      if (n.nodeType === 1) replaced += n.matches("article.node") ? 1
        : n.querySelectorAll("article.node").length;
  });
  observer.observe(document.querySelector("main"), {childList: true, subtree: true});
  const start = performance.now();
  const done = () => requestAnimationFrame(() => requestAnimationFrame(() => {
    observer.disconnect();
    resolve({ms: performance.now() - start, replaced});
  }));
  // htmx swaps first, then fires afterRequest (bubbling to the body).
  const onRequest = () => {
    document.body.removeEventListener("htmx:afterRequest", onRequest);
    done();
  };
  document.body.addEventListener("htmx:afterRequest", onRequest);
  document.body.dispatchEvent(new Event("llmgw-refresh"));
})
"""


def load_ms(page: Page, url: str) -> float:
    page.goto(url, wait_until="load")
    timing: dict[str, float] = page.evaluate(
        "() => performance.getEntriesByType('navigation')[0].toJSON()"
    )
    return float(timing["loadEventEnd"])


def refresh(page: Page) -> dict[str, Any]:
    result: dict[str, Any] = page.evaluate(REFRESH_JS)
    return result


def measure(loads: int, refreshes: int) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="llmgw-bench-nodes-") as tmp,
        ServedDashboard(Path(tmp), refresh_seconds=3600) as app,
    ):
        url = f"http://127.0.0.1:{app.port}/admin/nodes"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                warm = browser.new_page(viewport={"width": 1280, "height": 900})
                load_ms(warm, url)
                warm.close()
                loads_ms = []
                for _ in range(loads):
                    tab = browser.new_page(viewport={"width": 1280, "height": 900})
                    loads_ms.append(load_ms(tab, url))
                    tab.close()
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(url, wait_until="load")
                cards = page.locator("article.node").count()
                refresh(page)  # warm-up
                still = [refresh(page) for _ in range(refreshes)]
                one = []
                for i in range(refreshes):
                    app.drain("node-005", i % 2 == 0)
                    one.append(refresh(page))
            finally:
                browser.close()
    return {"loads": loads_ms, "still": still, "one": one, "cards": cards}


def _tree() -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src/llmgw/web"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"`{commit}`" + (" + uncommitted changes in src/llmgw/web" if dirty else "")


def _chromium() -> str:
    try:
        return subprocess.run(
            [CHROMIUM, "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "Chromium (version unknown)"


def _row(label: str, what: str, values: list[float], replaced: str = "") -> str:
    return (
        f"| {label} | {what} | {statistics.median(values):.0f} | {min(values):.0f} "
        f"| {max(values):.0f} | {replaced} |"
    )


def report(label: str, data: dict[str, Any], load: str) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    still, one = data["still"], data["one"]
    replaced_still = sorted({r["replaced"] for r in still})
    replaced_one = sorted({r["replaced"] for r in one})
    return "\n".join(
        [
            f"Run `{label}`: {now}, tree {_tree()}, `nproc` = {os.cpu_count()}, "
            f"{_chromium()}, Python {platform.python_version()}, load average before {load}; "
            f"{data['cards']} node cards on the page.",
            "",
            "| run | what | median ms | best ms | worst ms | node cards replaced |",
            "|---|---|--:|--:|--:|--:|",
            _row(label, f"load ({len(data['loads'])} fresh tabs)", data["loads"]),
            _row(
                label,
                f"refresh, nothing changed (x{len(still)})",
                [r["ms"] for r in still],
                "/".join(map(str, replaced_still)),
            ),
            _row(
                label,
                f"refresh, one node changed (x{len(one)})",
                [r["ms"] for r in one],
                "/".join(map(str, replaced_one)),
            ),
        ]
    )


def write(label: str, run: str) -> None:
    """Keep the runs of other labels in the section, replace this label's."""
    begin, end = f"<!-- {NAME}:start -->", f"<!-- {NAME}:end -->"
    text = RESULTS.read_text()
    runs: dict[str, str] = {}
    if begin in text and end in text:
        body = text.split(begin, 1)[1].split(end, 1)[0]
        for chunk in body.split("\n<!-- run ")[1:]:
            name, rest = chunk.split(" -->\n", 1)
            runs[name] = rest.strip()
    runs[label] = run
    parts = [
        "## Dashboard nodes page in Chromium: 100 nodes x 8 GPUs",
        "",
        f"Command: `{COMMAND}` (headless Chromium via Playwright, the dashboard served "
        "over loopback HTTP by uvicorn; see the script's docstring for what is timed).",
    ]
    for name, body in runs.items():
        parts += ["", f"<!-- run {name} -->", body]
    write_section(NAME, "\n".join(parts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--label", default="current", help="name of this run in RESULTS.md")
    parser.add_argument("--loads", type=int, default=7, help="page loads, each in a fresh tab")
    parser.add_argument("--refreshes", type=int, default=10, help="refreshes of each kind")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    data = measure(args.loads, args.refreshes)
    run = report(args.label, data, load)
    print(run)
    if not args.no_write:
        write(args.label, run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
