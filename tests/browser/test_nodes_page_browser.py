"""The nodes page at 100 nodes in headless Chromium: filter, folded GPU rows, and a
refresh that replaces only the card that changed while a fold stays open.

The dashboard is served over loopback HTTP with the synthetic fleet of
dashboard_fleet.py (100 nodes x 8 GPUs); the fleet changes from outside the
server's loop, as an agent's report would. The page's timed refresh is off
(an hour); each refresh is triggered as an action's would be (`llmgw-refresh`).

Chromium is Debian's (/usr/bin/chromium); when it is missing these tests fail and
say so, they are never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_server import ServedDashboard
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

CHROMIUM = Path("/usr/bin/chromium")

# Counts the node cards taken out of the page from now on.
WATCH_JS = """
() => {
  window.cardsReplaced = 0;
  new MutationObserver((records) => {
    for (const r of records) for (const n of r.removedNodes)
      if (n.nodeType === 1 && n.matches("article.node")) window.cardsReplaced += 1;
  }).observe(document.querySelector("#node-grid"), {childList: true});
}
"""


@pytest.fixture(scope="module", name="served")
def served_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedDashboard]:
    with ServedDashboard(tmp_path_factory.mktemp("nodes-page"), refresh_seconds=3600) as app:
        yield app


@pytest.fixture(scope="module", name="browser")
def browser_fixture() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"the browser tests need Debian's chromium at {CHROMIUM}, which is not installed: "
            "run `apt-get install chromium` (`make test` installs it)"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(name="page")
def page_fixture(browser: Browser) -> Iterator[Page]:
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
    # No script error and no Content-Security-Policy violation.
    assert errors == [], errors


def url(served: ServedDashboard, query: str = "") -> str:
    return f"http://127.0.0.1:{served.port}/admin/nodes{query}"


def refresh_and_wait(page: Page) -> None:
    """Trigger the page's refresh and wait until htmx has handled its answer."""
    with page.expect_response(lambda r: "/admin/nodes?" in r.url and "v=" in r.url):
        page.evaluate("document.body.dispatchEvent(new Event('llmgw-refresh'))")
    page.wait_for_function("() => !document.querySelector('#live.htmx-request')")


def test_the_filter_narrows_the_list_and_keeps_its_address(
    served: ServedDashboard, page: Page
) -> None:
    page.goto(url(served))
    cards = page.locator("article.node")
    expect(cards).to_have_count(100)
    page.evaluate("window.notReloaded = true")
    page.get_by_label("Filter nodes").fill("zone=b")
    expect(cards).to_have_count(25)
    expect(page.locator("#node-match")).to_contain_text("25 of 100 nodes match zone=b")
    expect(page).to_have_url(url(served, "?q=zone%3Db"))
    page.get_by_label("Filter nodes").fill("zone=b node-005")
    expect(cards).to_have_count(1)
    expect(page.locator('article[data-node="node-005"]')).to_be_visible()
    page.get_by_label("Filter nodes").fill("draining")
    expect(cards).to_have_count(5)
    for card in cards.all():
        expect(card.locator(".node-state")).to_contain_text("draining")
    page.get_by_label("Filter nodes").fill("")
    expect(cards).to_have_count(100)
    assert page.evaluate("window.notReloaded") is True
    # A link with the filter opens the page filtered.
    page.goto(url(served, "?q=zone%3Dc"))
    expect(cards).to_have_count(25)
    expect(page.get_by_label("Filter nodes")).to_have_value("zone=c")


def test_gpu_rows_fold_and_a_refresh_replaces_only_the_changed_card(
    served: ServedDashboard, page: Page
) -> None:
    page.goto(url(served))
    card = page.locator('article[data-node="node-010"]')
    gpu_rows = card.locator(".gpus li")
    expect(gpu_rows.first).to_be_hidden()  # folded: only the summary line shows
    expect(card.locator(".gpu-fold summary")).to_contain_text("8 GPUs")
    card.locator(".gpu-fold summary").click()
    expect(gpu_rows).to_have_count(8)
    expect(gpu_rows.first).to_be_visible()
    page.evaluate(WATCH_JS)

    refresh_and_wait(page)  # nothing changed: nothing replaced
    assert page.evaluate("window.cardsReplaced") == 0

    served.drain("node-010", True)
    try:
        refresh_and_wait(page)
        expect(card.locator(".node-state")).to_contain_text("draining")
        assert page.evaluate("window.cardsReplaced") == 1
        # The card is new, and its GPU rows are still unfolded as they were left.
        expect(gpu_rows.first).to_be_visible()
        expect(card.get_by_role("button", name="Undrain", exact=True)).to_be_visible()
    finally:
        served.drain("node-010", False)


def test_a_big_fleet_is_shown_a_page_at_a_time(
    tmp_path_factory: pytest.TempPathFactory, page: Page
) -> None:
    with ServedDashboard(
        tmp_path_factory.mktemp("nodes-pages"), nodes=150, refresh_seconds=3600
    ) as big:
        page.goto(url(big))
        cards = page.locator("article.node")
        expect(cards).to_have_count(100)
        expect(page.locator("#node-pages")).to_contain_text("nodes 1 to 100 of 150 (page 1 of 2)")
        page.get_by_role("link", name="next").click()
        expect(page).to_have_url(url(big, "?page=2"))
        expect(cards).to_have_count(50)
        expect(cards.first).to_have_attribute("data-node", "node-100")
        # The page's refresh keeps it on page 2.
        refresh_and_wait(page)
        expect(cards).to_have_count(50)
        page.get_by_role("link", name="previous").click()
        expect(cards).to_have_count(100)
        expect(cards.first).to_have_attribute("data-node", "node-000")
