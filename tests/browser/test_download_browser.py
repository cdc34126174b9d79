"""Hub weights on the dashboard, in headless Chromium against a real fleet: a progress
bar on the model page and on the node card while the weights download, and the node
card's last-heard time and the weights it holds once they are on its disk.

A real server, a real agent and a `llmgw sim` engine (`hub_fleet`); the hub stand-in
paces its bytes (`bytes_per_second`) so the 30 MB download lasts about 20 s, until the
node card's bar has moved; then the pacing is lifted and the rest comes at once. The
pages are driven on the admin listener (loopback, no login) and are never reloaded
once open: what changes arrives by the pages' own live refresh.

Screenshots go to $LLMGW_TEST_ARTIFACTS, or tests/browser/artifacts/ (git-ignored).

Chromium is Debian's (/usr/bin/chromium); when it is missing these tests fail and
say so, they are never skipped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_fleet import config, hub_fleet, shards, tiny_repo
from hub_standin import HubStandin
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright
from procs import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

CHROMIUM = Path("/usr/bin/chromium")
SLOW = 1_500_000  # bytes per second: 20 s for 30 MB, several of the pages' refreshes
REFRESHES = 30_000  # ms: a page's live refresh (every 5 s) has come several times


def shots() -> Path:
    configured = os.environ.get("LLMGW_TEST_ARTIFACTS")
    path = Path(configured) if configured else Path(__file__).parent / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(name="page")
def page_fixture() -> Iterator[Page]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"the browser tests need Debian's chromium at {CHROMIUM}, which is not installed: "
            "run `apt-get install chromium` (`make test` installs it)"
        )
    with sync_playwright() as playwright:
        browser: Browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        errors: list[str] = []

        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                errors.append(message.text)

        page.on("console", on_console)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            yield page
        finally:
            context.close()
            browser.close()
    # No script error and no Content-Security-Policy violation.
    assert errors == [], errors


def test_a_download_shows_as_a_progress_bar_on_the_model_and_the_node_card(
    tmp_path: Path, hub: HubStandin, page: Page
) -> None:
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    short = f"org/tiny@{sha[:7]}"
    hub.bytes_per_second = SLOW
    with hub_fleet(tmp_path, hub, config(f"org/tiny@{sha}")) as fleet:
        admin = fleet.server.admin
        wait_for(
            lambda: [s for s in shards(fleet.server) if (s.get("download") or {}).get("percent")],
            "the download to report progress",
        )
        # The model page: the replica's row carries the bar, bytes and the file.
        page.goto(f"{admin}/admin/models/tiny")
        bar = page.locator(f'.download[data-download="{short}"]')
        expect(bar.locator("progress")).to_be_visible()
        expect(bar).to_contain_text(re.compile(r"\d+% · [\d.]+ MB of 30\.0 MB"))
        expect(bar.locator(".download-file")).to_have_text("model.safetensors")
        value = float(bar.locator("progress").get_attribute("value") or "-1")
        assert 0 < value < 100, value
        page.screenshot(path=str(shots() / "download-model.png"), full_page=True)
        # The models list: the model's row carries it too.
        page.goto(f"{admin}/admin/models")
        row = page.locator('tr[data-model="tiny"]')
        expect(row.locator(f'.download[data-download="{short}"] progress')).to_be_visible()

        # The node card: the same bar while it downloads, when the node was last heard
        # from, and, once done, the snapshot it holds with its size.
        page.goto(f"{admin}/admin/nodes")
        card = page.locator('article.node[data-node="node-a"]')
        expect(card.locator(f'.download[data-download="{short}"] progress')).to_be_visible()
        expect(card.locator(".heard")).to_have_text("heard from under 10 s ago")
        expect(card).to_contain_text("no hub weights on disk")
        page.screenshot(path=str(shots() / "download-nodes-during.png"), full_page=True)
        # The bar moves and then goes, by the page's own refresh (no reload). Once it has
        # moved, the rest of the file comes unpaced: nothing more is watched mid-way.
        first = card.locator(".download-percent").inner_text()
        expect(card.locator(".download-percent")).not_to_have_text(first, timeout=REFRESHES)
        hub.bytes_per_second = 0
        expect(card.locator(".download")).to_have_count(0, timeout=REFRESHES)
        weights = card.locator(".weights")
        expect(weights).to_contain_text(f"{short} 30.0 MB", timeout=REFRESHES)
        expect(weights).to_contain_text(re.compile(r"weights 30\.0 MB · [\d.,]+ GiB free"))
        expect(card.locator(".heard")).to_have_text("heard from under 10 s ago")
        page.screenshot(path=str(shots() / "download-nodes-after.png"), full_page=True)
