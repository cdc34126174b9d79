"""A team's dashboard page, `/admin/teams/T`, in a real browser (Chromium via Playwright).

A real `llmgw server` (keys required) in front of a real `llmgw sim`; users, teams,
memberships and keys are made with the real CLI (in one process) before it starts, and logged in
on the API port as a person would. A team-admin sees their team's keys and usage
(by key and by end user), creates a key that works at once and revokes one; they
see nothing of another team, and the server refuses what the page offers no
button for (another team's keys, another team's key through their own team). A
member sees the usage and no keys; an admin sees every team.

Chromium is Debian's (/usr/bin/chromium, which `make test` installs); when it is
missing these tests fail and say so, they are never skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from clitools import made_all
from playwright.sync_api import Browser, Page, expect, sync_playwright
from procs import Server, Sim, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

CHROMIUM = Path("/usr/bin/chromium")
PASSWORD = "correct horse battery staple"


@dataclass
class Fleet:
    server: Server
    model: str
    secrets: dict[str, str]
    ids: dict[str, str]

    def ask(self, key: str, user: str) -> int:
        return httpx.post(
            self.server.url + "/v1/chat/completions",
            json={"model": self.model, "user": user, "max_tokens": 4,
                  "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {self.secrets[key]}"},
            timeout=60,
        ).status_code  # fmt: skip


@pytest.fixture(scope="module", name="fleet")
def fleet_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    data = tmp_path_factory.mktemp("team-page") / "data"
    store = ["--data-dir", str(data)]
    # Ten commands in one process (clitools.made_all), not ten processes.
    commands: list[tuple[list[str], str]] = [
        (["users", "create", user, "--password-stdin", *extra, *store], PASSWORD + "\n")
        for user, extra in (("ann", []), ("carl", []), ("root", ["--role", "admin"]))
    ]
    commands += [(["teams", "create", team, *store], "") for team in ("red", "blue")]
    commands += [
        (["teams", "members", "add", "red", "ann", "--role", "team-admin", *store], ""),
        (["teams", "members", "add", "red", "carl", *store], ""),
    ]
    keys = (("red-1", "red"), ("red-2", "red"), ("blue-1", "blue"))
    commands += [
        (["keys", "create", "--name", name, "--team", team, "--json", *store], "")
        for name, team in keys
    ]
    outputs = made_all(commands)
    secrets: dict[str, str] = {}
    ids: dict[str, str] = {}
    for (name, _), output in zip(keys, outputs[-len(keys) :], strict=True):
        created = json.loads(output)
        secrets[name], ids[name] = created["secret"], created["id"]
    model = "team-page-sim"
    sim = Sim(model=model)
    try:
        server = Server("--endpoint", f"s={sim.url}={model}", *store, data_dir=data, auth=True)
        try:
            fleet = Fleet(server=server, model=model, secrets=secrets, ids=ids)
            assert fleet.ask("red-2", "alice") == 200
            assert fleet.ask("blue-1", "mallory") == 200
            yield fleet
        except BaseException:
            print(server.proc.output())
            raise
        finally:
            server.proc.stop()
    finally:
        sim.proc.stop()


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


def logged_in(browser: Browser, fleet: Fleet, name: str) -> Page:
    page = browser.new_context().new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(fleet.server.url + "/admin/login")
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    # Users without an admin role land on a page that says so; every user may log out.
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
    return page


def post_as(page: Page, fleet: Fleet, path: str, form: dict[str, str] | None = None) -> Any:
    """A change the page offers no button for, sent with the session (cookie, CSRF
    token and htmx's header) as a script in the page could."""
    csrf = page.request.get(fleet.server.url + "/admin/api/session").json()["csrf_token"]
    return page.request.post(
        fleet.server.url + path,
        form=form or {},
        headers={"X-CSRF-Token": csrf, "HX-Request": "true"},
    )


def test_a_team_admin_manages_their_team_on_its_page(fleet: Fleet, browser: Browser) -> None:
    page = logged_in(browser, fleet, "ann")
    try:
        page.goto(fleet.server.url + "/admin/teams/red")
        expect(page.locator("h1")).to_have_text("Team red")
        keys = page.locator("#live")
        expect(keys.locator('tr[data-key="red-1"]')).to_be_visible()
        expect(keys.locator('tr[data-key="red-2"]')).to_be_visible()
        expect(keys).not_to_contain_text("blue-1")
        # Usage by key and by end user, as the page refreshes itself.
        expect(keys).to_contain_text(re.compile(r"alice · red-2"), timeout=30_000)
        expect(keys).not_to_contain_text("mallory")

        # A new key, in the team, working at once.
        page.get_by_label("Name").fill("red-new")
        page.get_by_label("Requests / min per end user").fill("1")
        page.get_by_role("button", name="Create key").click()
        flash = page.locator("#flash")
        expect(flash).to_contain_text("key red-new created in team red")
        fleet.secrets["red-new"] = page.locator("#new-secret").inner_text().strip()
        assert fleet.ask("red-new", "zoe") == 200
        assert fleet.ask("red-new", "zoe") == 429  # its end-user limit: 1 a minute
        expect(keys.locator('tr[data-key="red-new"]')).to_be_visible()

        # Revoke a key of the team: its clients are refused from then on.
        keys.locator('tr[data-key="red-1"]').get_by_role("button", name="Revoke").click()
        expect(flash).to_contain_text("key red-1 revoked")
        wait_for(lambda: fleet.ask("red-1", "x") == 401, "key red-1 to be refused", 30)

        # Another team's page: refused, and nothing of it shown.
        for other in ("blue", "nope"):
            answer = page.goto(fleet.server.url + f"/admin/teams/{other}")
            assert answer is not None and answer.status == 403
            expect(page.get_by_role("alert")).to_contain_text(f"may not GET /admin/teams/{other}")
            expect(page.locator("body")).not_to_contain_text("blue-1")
        # What the page has no button for, the server refuses too.
        assert post_as(page, fleet, "/admin/teams/blue/keys", {"name": "sneaky"}).status == 403
        sneaky = post_as(page, fleet, f"/admin/teams/red/keys/{fleet.ids['blue-1']}/revoke")
        assert sneaky.status == 404 and "team &#39;red&#39; has no key" in sneaky.text()
        assert fleet.ask("blue-1", "x") == 200
        assert page.request.get(fleet.server.url + "/admin/keys").status == 403
    finally:
        page.context.close()


def test_a_member_sees_usage_and_an_admin_sees_every_team(fleet: Fleet, browser: Browser) -> None:
    page = logged_in(browser, fleet, "carl")
    try:
        page.goto(fleet.server.url + "/admin/teams/red")
        expect(page.locator("h1")).to_have_text("Team red")
        expect(page.locator("#live")).to_contain_text("Usage by key")
        expect(page.locator("#live")).to_contain_text(re.compile(r"alice · red-2"))
        expect(page.get_by_role("button", name="Create key")).to_have_count(0)
        expect(page.get_by_role("button", name="Revoke")).to_have_count(0)
        refused = post_as(page, fleet, "/admin/teams/red/keys", {"name": "by-member"})
        assert refused.status == 403, refused.text()
    finally:
        page.context.close()

    page = logged_in(browser, fleet, "root")
    try:
        page.goto(fleet.server.url + "/admin/teams/blue")
        expect(page.locator("h1")).to_have_text("Team blue")
        expect(page.locator('#live tr[data-key="blue-1"]')).to_be_visible()
        expect(page.locator("#live")).to_contain_text(re.compile(r"mallory · blue-1"))
        answer = page.goto(fleet.server.url + "/admin/teams/nope")
        assert answer is not None and answer.status == 404
        expect(page.locator("main")).to_contain_text("there is no team 'nope'")
    finally:
        page.context.close()
