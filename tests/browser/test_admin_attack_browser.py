"""A hostile web page in a real browser cannot drive the admin listener (Chromium via Playwright).

A real `llmgw server` (its admin listener on 127.0.0.1, no credential needed
from loopback) and one real agent, `node-1`, so that there is a node to drain.
The operator's browser opens a page of another origin, served by a small HTTP
server on *another* loopback address (127.0.0.2). That page tries, against key
creation, model add and node drain:

- `fetch` with `mode: "no-cors"` and `text/plain` (no CORS preflight needed);
- HTML form posts (`text/plain` shaped like JSON, and URL-encoded) into hidden
  frames;
- a `cors` fetch with `application/json` (the preflight is never granted);
- the same through a rebinding-shaped name: Chromium resolves `rebind.test` to
  127.0.0.1 (`--host-resolver-rules`), and a script running in a page whose
  origin is `http://rebind.test:ADMINPORT` (as after the attacker's DNS answer
  changed) sends same-origin JSON requests and reads the answers.

Afterwards the admin API shows no new key, no new model and the node not
draining; the server's log names a refusal for each request that arrived; and
no secret reached any frame of the page or its script variables.

Chromium is Debian's (/usr/bin/chromium, which `make test` installs); when it is
missing these tests fail and say so, they are never skipped.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

CHROMIUM = Path("/usr/bin/chromium")
ATTACKER_HOST = "127.0.0.2"
REBIND = "rebind.test"
KEY_BODY = {"name": "evil-key", "admin": True}
MODEL_BODY = {
    "name": "evil-model",
    "weights": "none",
    "profiles": [{"name": "p", "engine": "sim", "engine_args": ["--evil"]}],
}
# Every route a page would want to drive: (path, JSON body or "").
TARGETS = [
    ("/admin/api/keys", json.dumps(KEY_BODY)),
    ("/admin/api/models", json.dumps(MODEL_BODY)),
    ("/admin/api/nodes/node-1/drain", ""),
    # The dashboard's own action routes, too.
    ("/admin/keys", "name=evil-key"),
    ("/admin/nodes/node-1/drain", ""),
]

# The attacker's page: everything a page can try without a preflight, then a
# cors fetch that needs one. Results land in window.results; window.done ends it.
ATTACK_PAGE = """<!doctype html>
<html><body>
<h1>cute cats</h1>
<script>
const ADMIN = "%(admin)s";
const REBIND = "%(rebind)s";
const TARGETS = %(targets)s;
window.results = [];
window.stolen = [];
function record(kind, url, outcome) { window.results.push({kind, url, outcome}); }

function formPost(url, enctype, fields, i) {
  return new Promise((resolve) => {
    const frame = document.createElement("iframe");
    frame.name = "sink" + i;
    frame.style.display = "none";
    document.body.appendChild(frame);
    const form = document.createElement("form");
    form.method = "POST"; form.action = url; form.enctype = enctype; form.target = frame.name;
    for (const [name, value] of fields) {
      const input = document.createElement("input");
      input.type = "hidden"; input.name = name; input.value = value;
      form.appendChild(input);
    }
    document.body.appendChild(form);
    let settled = false;
    frame.addEventListener("load", () => {
      if (settled) return;
      settled = true;
      let readable = "unreadable";
      try { readable = frame.contentDocument.body.innerText; window.stolen.push(readable); }
      catch (e) { readable = "unreadable: " + e.name; }
      record("form " + enctype, url, readable);
      resolve();
    });
    form.submit();
  });
}

async function run() {
  let i = 0;
  for (const [path, body] of TARGETS) {
    for (const base of [ADMIN, REBIND]) {
      const url = base + path;
      try {
        const r = await fetch(url, {method: "POST", mode: "no-cors", body: body,
                                    headers: {"Content-Type": "text/plain"}});
        record("no-cors text/plain", url, "opaque " + r.type);
      } catch (e) { record("no-cors text/plain", url, "error " + e.name); }
      try {
        const r = await fetch(url, {method: "POST", mode: "cors", body: body || "{}",
                                    headers: {"Content-Type": "application/json"}});
        window.stolen.push(await r.text());
        record("cors json", url, "read " + r.status);
      } catch (e) { record("cors json", url, "error " + e.name); }
    }
    // A text/plain form whose body reads as JSON: {"name": "evil-key", "x": "="}
    await formPost(ADMIN + path, "text/plain", [['{"name": "evil-key", "x": "', '"}']], i++);
    await formPost(ADMIN + path, "application/x-www-form-urlencoded",
                   [["name", "evil-key"], ["spec", JSON.stringify(%(model)s)]], i++);
  }
  // Reading what the admin API holds, cross-origin: CORS never grants it.
  try {
    const r = await fetch(ADMIN + "/admin/api/keys");
    window.stolen.push(await r.text());
    record("cors read", ADMIN + "/admin/api/keys", "read " + r.status);
  } catch (e) { record("cors read", ADMIN + "/admin/api/keys", "error " + e.name); }
  window.done = true;
}
run();
</script>
</body></html>
"""

# The rebinding page: its origin is http://rebind.test:ADMINPORT, so its requests
# are same-origin and JSON needs no preflight; only the Host rule stands.
REBIND_PAGE = """<!doctype html>
<html><body>
<script>
const TARGETS = %(targets)s;
window.results = [];
window.stolen = [];
async function attempt(path, init) {
  try {
    const r = await fetch(path, init);
    const text = await r.text();
    window.stolen.push(text);
    window.results.push({path, status: r.status, text});
  } catch (e) {
    window.results.push({path, status: null, text: "error " + e.name + ": " + e.message});
  }
}
async function run() {
  for (const [path, body] of TARGETS) {
    await attempt(path, {method: "POST", body: body || "{}",
                         headers: {"Content-Type": "application/json"}});
  }
  for (const path of ["/admin/api/keys", "/admin/api/nodes", "/metrics"]) {
    await attempt(path, {});
  }
  window.done = true;
}
run();
</script>
</body></html>
"""


@dataclass
class Target:
    server: Server
    agent: Proc

    def get(self, path: str) -> Any:
        answer = httpx.get(self.server.admin + path, timeout=10)
        answer.raise_for_status()
        return answer.json()

    def assert_unchanged(self) -> None:
        keys = self.get("/admin/api/keys?all=true")["keys"]
        assert keys == [], keys
        models = {m["name"] for m in self.get("/admin/api/models")["models"]}
        assert "evil-model" not in models
        assert self.get("/admin/api/nodes/node-1")["draining"] is False


@pytest.fixture(scope="module", name="target")
def target_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("attack")
    agent_port = free_port()
    server = Server(
        "--endpoint", "x=http://127.0.0.1:1=unused", "--agent-listen", f"127.0.0.1:{agent_port}",
        data_dir=tmp / "data", wait_ready=False,
    )  # fmt: skip
    low = free_port_block(5)
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-1",
            "--gpus", "1x24GiB", "--weights-dir", str(tmp / "weights"),
            "--state-dir", str(tmp / "state"), "--port-range", f"{low}-{low + 4}",
        )
    )  # fmt: skip
    target = Target(server, agent)
    try:
        wait_for(
            lambda: [n["id"] for n in target.get("/admin/api/nodes")["nodes"]] == ["node-1"],
            "the agent to register",
        )
        target.assert_unchanged()
        yield target
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


@pytest.fixture(name="attacker")
def attacker_fixture(target: Target) -> Iterator[str]:
    """The attacker's site on another loopback address; its URL."""
    page = ATTACK_PAGE % {
        "admin": target.server.admin,
        "rebind": f"http://{REBIND}:{target.server.admin_port}",
        "targets": json.dumps(TARGETS),
        "model": json.dumps(MODEL_BODY),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    httpd = ThreadingHTTPServer((ATTACKER_HOST, 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{ATTACKER_HOST}:{httpd.server_address[1]}/cats.html"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.fixture(scope="module", name="browser")
def browser_fixture() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"the browser tests need Debian's chromium at {CHROMIUM}, which is not installed: "
            "run `apt-get install chromium` (`make test` installs it)"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            # The rebinding: the attacker's name now answers with this machine's address.
            args=[f"--host-resolver-rules=MAP {REBIND} 127.0.0.1"],
        )
        try:
            yield browser
        finally:
            browser.close()


def run_page(page: Page) -> list[dict[str, Any]]:
    page.wait_for_function("window.done === true", timeout=120_000)
    results: list[dict[str, Any]] = page.evaluate("window.results")
    return results


def assert_no_secret(page: Page) -> None:
    stolen = json.dumps(page.evaluate("window.stolen"))
    assert "sk-" not in stolen, stolen
    for frame in page.frames:
        try:
            content = frame.content()
        except Exception as exc:  # a frame may be gone; then it holds nothing
            content = str(exc)
        assert "sk-" not in content, (frame.url, content)


def refusals(target: Target) -> list[str]:
    return [line for line in target.server.proc.output().splitlines() if "refused POST" in line]


def test_a_page_of_another_origin_changes_nothing(
    target: Target, attacker: str, browser: Browser
) -> None:
    before = len(refusals(target))
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(attacker)
        results = run_page(page)
        # Every attempt ran to its end in the browser.
        assert len(results) == len(TARGETS) * 6 + 1, results
        for result in results:
            if result["kind"] == "cors json":
                # The preflight was not granted: the POST was never sent.
                assert result["outcome"] == "error TypeError", result
            if result["kind"] == "cors read":
                assert result["outcome"] == "error TypeError", result
            if result["kind"].startswith("form"):
                # The answer went to a frame of another origin, which the page cannot read.
                assert result["outcome"].startswith("unreadable"), result
        assert_no_secret(page)
    finally:
        context.close()
    target.assert_unchanged()
    # The requests did reach the server, and each was refused there, with its reason.
    admin_port = target.server.admin_port

    def arrived() -> bool:
        return len(refusals(target)) - before >= len(TARGETS) * 4

    wait_for(arrived, "the server to log every refused request", within=30)
    logged = "\n".join(refusals(target)[before:])
    for path, _ in TARGETS:
        assert f"refused POST {path} from 127.0.0.1 on the admin listener" in logged
    assert "came from another site's page (Sec-Fetch-Site: cross-site)" in logged
    assert f"Host '{REBIND}:{admin_port}' is not allowed on the admin listener" in logged


def test_a_rebound_name_gets_nothing_even_from_its_own_origin(
    target: Target, browser: Browser
) -> None:
    before = len(refusals(target))
    origin = f"http://{REBIND}:{target.server.admin_port}"
    page_html = REBIND_PAGE % {"targets": json.dumps(TARGETS)}
    context = browser.new_context()
    try:
        page = context.new_page()
        # A document of origin http://rebind.test:ADMINPORT that came from this
        # machine: the liveness probe, the one answer the guard gives any name.
        # (A real attacker's page comes from its own address first; Chromium's
        # local-network checks may then stop its requests by themselves, which
        # other browsers do not, so the test gives the page this machine's
        # address to leave the server's own defence as the only one.)
        loaded = page.goto(f"{origin}/healthz")
        assert loaded is not None and loaded.status == 200
        # The attacker's script, running in that origin.
        page.set_content(page_html)
        results = run_page(page)
        assert [r["path"] for r in results] == [
            *(path for path, _ in TARGETS),
            "/admin/api/keys",
            "/admin/api/nodes",
            "/metrics",
        ]
        for result in results:
            # Same-origin, so the page reads the answer: a refusal naming the setting.
            assert result["status"] == 403, result
            error = json.loads(result["text"])["error"]
            assert error["code"] == "host_not_allowed", error
            assert f"add '{REBIND}' to admin.allowed_hosts" in error["message"]
        assert_no_secret(page)
        assert "node-1" not in json.dumps(page.evaluate("window.stolen"))
    finally:
        context.close()
    target.assert_unchanged()
    wait_for(
        lambda: len(refusals(target)) - before >= len(TARGETS),
        "the server to log the refused changes",
        within=30,
    )
