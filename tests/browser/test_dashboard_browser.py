"""The dashboard in a real browser (headless Chromium via Playwright) against a real fleet.

One `llmgw server` (keys required, a `models:` catalog, short control timings),
two real agents declaring `--gpus 2x24GiB` and real `llmgw sim` engines started
by them: `chat-sim` runs, `broken-sim` is started with an engine flag the sim
does not know, so it fails with the engine's own output. An admin user is made
with `llmgw users create` before the server starts, for the login on the API
port. The pages are driven on the admin listener (loopback, no login) except
where the login itself is tested.

Screenshots of every page (desktop and phone width) are written to
$LLMGW_TEST_ARTIFACTS, or tests/browser/artifacts/ (git-ignored), and kept.

Chromium is Debian's (/usr/bin/chromium, which `make test` installs); when it is
missing these tests fail and say so, they are never skipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import procs
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright
from procs import Proc, Server, free_port, free_port_block, llmgw


def wait_for(check: Callable[[], object], what: str, within: float = 30.0) -> Any:
    """`procs.wait_for` with this module's deadline."""
    return procs.wait_for(check, what, within)


pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

CHROMIUM = Path("/usr/bin/chromium")
PASSWORD = "correct horse battery staple"
CONTROL = (
    "control: {heartbeat_interval: 0.3, unreachable_after: 1.5, lost_after: 3, "
    "reconcile_interval: 0.5, retry_base: 1, retry_max: 4, activation_timeout: 60, "
    "activation_keepalive: 0.3, stop_grace: 5}\n"
    "router: {health: {interval: 0.5}}\n"
)
MODELS = """\
models:
  - name: chat-sim
    weights: none
    min_replicas: 1
    profiles: [{name: sim-1gpu, engine: sim, gpus: 1}]
  - name: broken-sim
    weights: none
    min_replicas: 1
    profiles: [{name: sim-1gpu, engine: sim, gpus: 1, engine_args: ["--no-such-flag"]}]
"""
NODES = ("node-1", "node-2")
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def artifacts_dir() -> Path:
    configured = os.environ.get("LLMGW_TEST_ARTIFACTS")
    path = Path(configured) if configured else Path(__file__).parent / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Fleet:
    server: Server
    agents: list[Proc]
    api_key: str

    def admin_get(self, path: str) -> Any:
        answer = httpx.get(self.server.admin + path, timeout=10)
        answer.raise_for_status()
        return answer.json()


def add_user(data_dir: Path, name: str, role: str) -> None:
    result = subprocess.run(
        [*llmgw("users", "create", name, "--role", role, "--password-stdin",
                "--data-dir", str(data_dir))],
        input=PASSWORD + "\n", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module", name="fleet")
def fleet_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("dashboard-fleet")
    (tmp / "llmgw.yaml").write_text(CONTROL + MODELS)
    add_user(tmp / "data", "alice", "admin")
    add_user(tmp / "data", "victor", "viewer")
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp / "llmgw.yaml"),
        auth=True, data_dir=tmp / "data",
    )  # fmt: skip
    agents: list[Proc] = []
    try:
        for node in NODES:
            low = free_port_block(10)
            agents.append(
                Proc(
                    llmgw(
                        "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", node,
                        "--gpus", "2x24GiB", "--weights-dir", str(tmp / node),
                        "--port-range", f"{low}-{low + 9}",
                    )
                )
            )  # fmt: skip
        admin = server.admin
        wait_for(
            lambda: len(httpx.get(admin + "/admin/api/nodes", timeout=10).json()["nodes"]) == 2,
            "both agents to register",
        )
        # A key made through the admin API, and traffic with it, so the usage page has data.
        created = httpx.post(admin + "/admin/api/keys", json={"name": "seed-key"}, timeout=10)
        assert created.status_code == 201, created.text
        fleet = Fleet(server, agents, created.json()["secret"])
        wait_for(
            lambda: fleet.admin_get("/admin/api/models/chat-sim")["status"]["ready_replicas"] == 1,
            "chat-sim to be ready",
            within=60,
        )
        for _ in range(3):
            answer = httpx.post(
                server.url + "/v1/chat/completions",
                json={"model": "chat-sim", "max_tokens": 5,
                      "messages": [{"role": "user", "content": "hello"}]},
                headers={"Authorization": f"Bearer {fleet.api_key}"},
                timeout=30,
            )  # fmt: skip
            assert answer.status_code == 200, answer.text
        yield fleet
    except BaseException:
        print(server.proc.output())
        for agent in agents:
            print(agent.output())
        raise
    finally:
        for agent in agents:
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
def page_fixture(browser: Browser, fleet: Fleet) -> Iterator[Page]:
    context = browser.new_context(viewport=DESKTOP)
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
    # No script error, no Content-Security-Policy violation, on any page visited.
    assert errors == [], errors


def shoot(page: Page, name: str) -> None:
    page.screenshot(path=str(artifacts_dir() / f"{name}.png"), full_page=True)


def test_every_page_loads_with_real_data(fleet: Fleet, page: Page, browser: Browser) -> None:
    admin = fleet.server.admin
    wait_for(lambda: fleet.admin_get("/admin/api/usage")["usage"] != [], "usage to be recorded")
    checks: dict[str, list[str]] = {
        "/admin/": ["Nodes", "GPUs in use", "Replicas", "Leadership", "Requests / s"],
        "/admin/nodes": [*NODES, "24.0 GiB"],
        "/admin/models": ["chat-sim", "broken-sim"],
        "/admin/models/chat-sim": ["sim-1gpu", "ready"],
        "/admin/usage": ["seed-key", "chat-sim"],
        "/admin/keys": ["seed-key"],
        "/admin/events": ["chat-sim", "start"],
    }
    for path, texts in checks.items():
        page.goto(admin + path)
        live = page.locator("#live")
        for text in texts:
            expect(live).to_contain_text(text)
        expect(page.locator("nav a[aria-current=page]")).to_have_count(1)
        name = path.strip("/").replace("/", "-") or "admin-overview"
        shoot(page, f"page-{name}")
    overview_counts = page.goto(admin + "/admin/")
    assert overview_counts is not None and overview_counts.status == 200
    expect(page.locator("#live")).to_contain_text("ready 2")  # both nodes
    # The servers on the store: this one, leading.
    this_server = fleet.admin_get("/admin/api/leader")["server"]
    listed = page.locator("#live ul.servers li")
    expect(listed).to_have_count(1)
    expect(listed.first).to_contain_text(f"{this_server} leader this one")

    phone = browser.new_context(viewport=PHONE, is_mobile=True)
    try:
        small = phone.new_page()
        for path in checks:
            small.goto(admin + path)
            expect(small.locator("#live")).to_be_visible()
            # Nothing wider than the screen but the tables, which scroll in their box.
            width = small.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"] + 1, (path, width)
            shoot(small, "phone-" + (path.strip("/").replace("/", "-") or "admin-overview"))
    finally:
        phone.close()


def test_drain_a_node_from_its_page(fleet: Fleet, page: Page) -> None:
    page.goto(fleet.server.admin + "/admin/nodes")
    card = page.locator('article[data-node="node-2"]')
    expect(card.locator(".node-state")).not_to_contain_text("draining")
    # A marker that a full page load would wipe out.
    page.evaluate("window.notReloaded = true")

    card.get_by_role("button", name="Drain", exact=True).click()
    expect(page.locator("#flash")).to_contain_text("node node-2 is draining")
    expect(card.locator(".node-state")).to_contain_text("draining")
    expect(card.get_by_role("button", name="Undrain", exact=True)).to_be_visible()
    assert page.evaluate("window.notReloaded") is True
    node = fleet.admin_get("/admin/api/nodes/node-2")
    assert node["draining"] is True
    shoot(page, "drain-node-2")

    # A change made elsewhere shows up by the page's own refresh (every 5 s).
    answer = httpx.post(fleet.server.admin + "/admin/api/nodes/node-2/undrain", json={}, timeout=10)
    assert answer.status_code == 200
    expect(card.get_by_role("button", name="Drain", exact=True)).to_be_visible(timeout=12_000)
    expect(card.locator(".node-state")).not_to_contain_text("draining")
    assert page.evaluate("window.notReloaded") is True


def test_create_a_key_and_use_it(fleet: Fleet, page: Page) -> None:
    page.goto(fleet.server.admin + "/admin/keys")
    form = page.locator("form[hx-post='/admin/keys']")
    form.get_by_label("Name", exact=True).fill("browser-key")
    form.get_by_label("Requests / min").fill("100")
    form.get_by_label("Per end user: req/min").fill("5")
    form.get_by_role("button", name="Create key").click()
    secret_box = page.locator("#new-secret")
    expect(secret_box).to_be_visible()
    secret = secret_box.inner_text().strip()
    assert re.fullmatch(r"sk-\S+", secret), secret
    expect(page.locator('tr[data-key="browser-key"]')).to_contain_text("100 req/min")
    expect(page.locator('tr[data-key="browser-key"]')).to_contain_text("each end user: 5 req/min")
    shoot(page, "key-created")

    models = httpx.get(
        fleet.server.url + "/v1/models", headers={"Authorization": f"Bearer {secret}"}, timeout=10
    )
    assert models.status_code == 200, models.text
    assert "chat-sim" in {m["id"] for m in models.json()["data"]}
    refused = httpx.get(fleet.server.url + "/v1/models", timeout=10)
    assert refused.status_code == 401

    # The secret is in that one answer only: a reload shows the key, never the secret.
    page.reload()
    assert secret not in page.content()

    # Edit it. The form opens outside the refreshing table: a refresh while typing
    # leaves what was typed alone.
    row = page.locator('tr[data-key="browser-key"]')
    with page.expect_response(lambda r: r.request.method == "GET" and r.url.endswith("/edit")):
        row.get_by_role("button", name="Edit", exact=True).click()
    # Nothing else in flight (the page's own refresh may be) before typing starts.
    page.wait_for_load_state("networkidle")
    editor = page.locator("#key-edit form")
    rpm = editor.get_by_label("Requests / min")
    expect(rpm).to_have_value("100")
    rpm.fill("50")
    editor.get_by_label("Models").fill("chat-sim")
    editor.get_by_label("Admin role").select_option("viewer")
    with page.expect_response(lambda r: r.request.method == "GET" and r.url.endswith("/keys")):
        page.evaluate("document.body.dispatchEvent(new Event('llmgw-refresh'))")
    expect(rpm).to_have_value("50")
    editor.get_by_role("button", name="Save").click()
    expect(page.locator("#flash")).to_contain_text("key browser-key updated")
    expect(row).to_contain_text("50 req/min")
    expect(row).to_contain_text("chat-sim")
    expect(row).to_contain_text("viewer")
    shoot(page, "key-edited")
    (key,) = [k for k in fleet.admin_get("/admin/api/keys")["keys"] if k["name"] == "browser-key"]
    assert (key["rpm"], key["models"], key["admin_role"]) == (50, ["chat-sim"], "viewer")
    # The secret is kept.
    kept = httpx.get(
        fleet.server.url + "/v1/models", headers={"Authorization": f"Bearer {secret}"}, timeout=10
    )
    assert kept.status_code == 200, kept.text


def test_log_in_on_the_api_port(fleet: Fleet, browser: Browser) -> None:
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        page.goto(fleet.server.url + "/admin/")
        expect(page).to_have_url(re.compile(r"/admin/login$"))
        page.get_by_label("User name").fill("alice")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        expect(page).to_have_url(re.compile(r"/admin/$"))
        expect(page.locator("header .who")).to_contain_text("alice")
        expect(page.locator("#live")).to_contain_text("GPUs in use")
        shoot(page, "portal-overview")

        # A change through the portal: htmx sends the session's CSRF token.
        page.locator("nav").get_by_role("link", name="Nodes").click()
        card = page.locator('article[data-node="node-1"]')
        card.get_by_role("button", name="Drain", exact=True).click()
        expect(card.locator(".node-state")).to_contain_text("draining")
        card.get_by_role("button", name="Undrain", exact=True).click()
        expect(card.get_by_role("button", name="Drain", exact=True)).to_be_visible()

        page.get_by_role("button", name="Log out").click()
        expect(page).to_have_url(re.compile(r"/admin/login$"))
        page.goto(fleet.server.url + "/admin/nodes")
        expect(page).to_have_url(re.compile(r"/admin/login$"))
    finally:
        context.close()


def log_in(page: Page, fleet: Fleet, name: str) -> None:
    page.goto(fleet.server.url + "/admin/")
    expect(page).to_have_url(re.compile(r"/admin/login$"))
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile(r"/admin/$"))


def test_a_viewer_sees_the_fleet_and_no_way_to_change_it(fleet: Fleet, browser: Browser) -> None:
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        log_in(page, fleet, "victor")
        expect(page.locator("header .who")).to_contain_text("victor")
        expect(page.locator("header .who")).to_contain_text("viewer")
        nav = page.locator("nav")
        expect(nav.get_by_role("link")).to_have_text(["Overview", "Nodes", "Models", "Events"])
        expect(page.locator("#live")).to_contain_text("GPUs in use")

        nav.get_by_role("link", name="Nodes").click()
        card = page.locator('article[data-node="node-1"]')
        expect(card).to_contain_text("node-1")
        expect(page.get_by_role("button", name="Drain", exact=True)).to_have_count(0)
        expect(page.get_by_role("button", name="Undrain", exact=True)).to_have_count(0)
        shoot(page, "viewer-nodes")

        page.goto(fleet.server.url + "/admin/models/chat-sim")
        expect(page.locator("#live")).to_contain_text("sim-1gpu")
        expect(page.get_by_role("button", name="Activate now")).to_have_count(0)
        expect(page.get_by_role("button", name="Remove")).to_have_count(0)
        page.goto(fleet.server.url + "/admin/models")
        expect(page.get_by_role("button", name="Add model")).to_have_count(0)

        # A drain sent anyway (as a crafted htmx request with the page's CSRF token)
        # is refused with the role named, and the node stays as it was.
        refused = page.evaluate(
            """async () => {
                const headers = JSON.parse(document.body.getAttribute("hx-headers"));
                const answer = await fetch("/admin/nodes/node-1/drain",
                    {method: "POST", headers: {...headers, "HX-Request": "true"}});
                return [answer.status, await answer.text()];
            }"""
        )
        assert refused[0] == 403 and "has the role viewer" in refused[1], refused
        assert fleet.admin_get("/admin/api/nodes/node-1")["draining"] is False

        keys = page.goto(fleet.server.url + "/admin/keys")
        assert keys is not None and keys.status == 403
        expect(page.locator("body")).to_contain_text("has the role viewer")
        expect(page.locator("body")).not_to_contain_text("seed-key")
        shoot(page, "viewer-keys-refused")
    finally:
        context.close()


def test_a_failed_model_shows_its_reason_and_output_tail(fleet: Fleet, page: Page) -> None:
    wait_for(
        lambda: (
            fleet.admin_get("/admin/api/models/broken-sim")["status"]["last_failure"] is not None
        ),
        "broken-sim to fail",
    )
    page.goto(fleet.server.admin + "/admin/models/broken-sim")
    failure = page.locator("#last-failure")
    expect(failure).to_contain_text("node-")
    expect(failure.locator("pre.tail")).to_contain_text("No such option: --no-such-flag")
    status = fleet.admin_get("/admin/api/models/broken-sim")["status"]
    expect(failure).to_contain_text(status["last_failure"]["message"])
    expect(page.locator("#problem")).to_be_visible()
    shoot(page, "failed-model")

    page.goto(fleet.server.admin + "/admin/")
    attention = page.locator("#live table").last
    expect(attention).to_contain_text("broken-sim")
    events = json.dumps(fleet.admin_get("/admin/api/events?model=broken-sim"))
    assert "failed" in events
