"""Single sign-on in a real browser (Debian's Chromium via Playwright).

A real `llmgw server` whose `auth.oidc` points at the test provider
(`tests/oidc_issuer.py`, a real HTTP server on loopback, reached as `localhost`
while the gateway is reached as 127.0.0.1, so the provider is another site for
the browser and the cookies' SameSite rules apply as in production), and one
real agent (`node-1`) so that there is a node to drain. The browser starts on
the gateway's login page, follows the single sign-on link to the provider,
picks a user on the provider's page and comes back signed in; what it may do
then comes from the user's groups.

Chromium is Debian's (/usr/bin/chromium, which `make test` installs); when it is
missing these tests fail and say so, they are never skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from oidc_issuer import CLIENT_SECRET, IdpUser, OidcIssuer, sso_config
from playwright.sync_api import Browser, Page, expect, sync_playwright
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

CHROMIUM = Path("/usr/bin/chromium")
DESKTOP = {"width": 1280, "height": 900}
# Generous: the machine running these is shared and often loaded.
WAIT_MS = 30_000


@pytest.fixture(scope="module", name="issuer")
def issuer_fixture() -> Iterator[OidcIssuer]:
    users = {
        "bob": IdpUser("sub-bob", "bob@example.com", ["llm-admins"]),
        "ann": IdpUser("sub-ann", "ann@example.com", ["llm-ops"]),
        "vic": IdpUser("sub-vic", "vic@example.com", ["llm-viewers"]),
    }
    with OidcIssuer(users=users) as running:
        yield running


@pytest.fixture(scope="module", name="server")
def server_fixture(
    tmp_path_factory: pytest.TempPathFactory, issuer: OidcIssuer
) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("sso-browser")
    secret = tmp / "client-secret"
    secret.write_text(CLIENT_SECRET + "\n")
    config = tmp / "llmgw.yaml"
    config.write_text(yaml.safe_dump(sso_config(issuer, str(secret), local_login=False)))
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(config),
        "--endpoint", "e=http://127.0.0.1:1=m", wait_ready=False,
    )  # fmt: skip
    low = free_port_block(10)
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-1",
            "--gpus", "2x24GiB", "--weights-dir", str(tmp / "weights"),
            "--port-range", f"{low}-{low + 9}",
        )
    )  # fmt: skip
    try:
        wait_for(
            lambda: httpx.get(server.admin + "/admin/api/nodes", timeout=10).json()["nodes"],
            "the agent to register",
            60,
        )
        yield server
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


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
    context = browser.new_context(viewport=DESKTOP)
    context.set_default_timeout(WAIT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def sign_in(page: Page, server: Server, issuer: OidcIssuer, user: str) -> None:
    page.goto(server.url + "/admin/")
    expect(page).to_have_url(re.compile(r"/admin/login$"))
    # Passwords are off on this server: only the single sign-on link is offered.
    expect(page.get_by_label("Password")).to_have_count(0)
    page.get_by_role("link", name="Sign in with single sign-on").click()
    expect(page).to_have_url(re.compile("^" + re.escape(issuer.url + "/authorize?")))
    expect(page.get_by_role("heading", name="Test identity provider")).to_be_visible()
    page.get_by_role("button", name=user, exact=True).click()
    expect(page).to_have_url(re.compile(r"127\.0\.0\.1:\d+/admin/$"))
    expect(page.locator("header .who")).to_contain_text(issuer.users[user].email)


def test_an_admin_signs_in_and_logs_out(page: Page, server: Server, issuer: OidcIssuer) -> None:
    sign_in(page, server, issuer, "bob")
    expect(page.locator("header .who")).to_contain_text("admin")
    nav = page.locator("nav")
    expect(nav.get_by_role("link", name="Keys")).to_be_visible()
    expect(page.locator("#live")).to_contain_text("GPUs in use")
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert cookies["llmgw_session"]["httpOnly"] is True
    assert cookies["llmgw_session"]["sameSite"] == "Strict"

    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"/admin/login$"))
    page.goto(server.url + "/admin/nodes")
    expect(page).to_have_url(re.compile(r"/admin/login$"))


def test_groups_give_the_operator_role(page: Page, server: Server, issuer: OidcIssuer) -> None:
    sign_in(page, server, issuer, "ann")
    expect(page.locator("header .who")).to_contain_text("operator")
    nav = page.locator("nav")
    expect(nav.get_by_role("link", name="Nodes")).to_be_visible()
    expect(nav.get_by_role("link", name="Keys")).to_have_count(0)
    nav.get_by_role("link", name="Nodes").click()
    expect(page.locator('article[data-node="node-1"]')).to_contain_text("node-1")
    expect(page.get_by_role("button", name="Drain", exact=True)).to_be_visible()


def test_a_viewer_cannot_drain_a_node_or_see_keys(
    page: Page, server: Server, issuer: OidcIssuer
) -> None:
    sign_in(page, server, issuer, "vic")
    expect(page.locator("header .who")).to_contain_text("viewer")
    nav = page.locator("nav")
    expect(nav.get_by_role("link")).to_have_text(["Overview", "Nodes", "Models", "Events"])
    nav.get_by_role("link", name="Nodes").click()
    expect(page.locator('article[data-node="node-1"]')).to_contain_text("node-1")
    expect(page.get_by_role("button", name="Drain", exact=True)).to_have_count(0)

    # A drain sent anyway, with the page's own CSRF token, is refused naming the role.
    refused = page.evaluate(
        """async () => {
            const headers = JSON.parse(document.body.getAttribute("hx-headers"));
            const answer = await fetch("/admin/nodes/node-1/drain",
                {method: "POST", headers: {...headers, "HX-Request": "true"}});
            return [answer.status, await answer.text()];
        }"""
    )
    assert refused[0] == 403 and "has the role viewer" in refused[1], refused
    node = httpx.get(server.admin + "/admin/api/nodes/node-1", timeout=10).json()
    assert node["draining"] is False

    keys = page.goto(server.url + "/admin/keys")
    assert keys is not None and keys.status == 403
    expect(page.locator("body")).to_contain_text("has the role viewer")
