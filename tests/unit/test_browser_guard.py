"""The browser guard: Host, Origin / Sec-Fetch-Site and Content-Type rules, one at a time.

An app that records every request it sees sits behind `browser_guard`; a
refused request must answer 403 with an OpenAI-shaped error naming the reason
and never reach the app.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from llmgw.config import ConfigError, load_server_config
from llmgw.router.browser_guard import browser_guard, split_host

JSON = {"Content-Type": "application/json"}
HX = {"HX-Request": "true"}


class Recorder:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def handle(self, request: Request) -> JSONResponse:
        self.seen.append(f"{request.method} {request.url.path}")
        return JSONResponse({"ok": True})


def guarded(recorder: Recorder, **options: object) -> httpx.AsyncClient:
    routes = [
        Route(path, recorder.handle, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
        for path in ("/healthz", "/metrics", "/admin/", "/admin/api/keys", "/admin/login",
                     "/admin/api/session")
    ]  # fmt: skip
    settings: dict[str, object] = {"surface": "the admin listener", "allowed_hosts": ["gw.test"]}
    settings.update(options)
    app = browser_guard(Starlette(routes=routes), **settings)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:9090")


@pytest.fixture(name="recorder")
def recorder_fixture() -> Recorder:
    return Recorder()


@pytest.fixture(name="client")
async def client_fixture(recorder: Recorder) -> AsyncIterator[httpx.AsyncClient]:
    async with guarded(recorder, host_exempt=["/healthz"]) as client:
        yield client


def refused(answer: httpx.Response, code: str) -> str:
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("permission_error", code)
    message: str = error["message"]
    return message


async def test_json_changes_from_a_tool_pass(client: httpx.AsyncClient, recorder: Recorder) -> None:
    assert (await client.post("/admin/api/keys", json={"name": "a"})).status_code == 200
    # No body at all, but the JSON type: what the CLI sends for drain, revoke, rotate.
    assert (await client.post("/admin/api/keys", headers=JSON)).status_code == 200
    assert (await client.patch("/admin/api/keys", content=b"{}", headers={
        "Content-Type": "application/json; charset=utf-8"})).status_code == 200  # fmt: skip
    assert (await client.delete("/admin/api/keys", headers=JSON)).status_code == 200
    assert recorder.seen == [
        "POST /admin/api/keys",
        "POST /admin/api/keys",
        "PATCH /admin/api/keys",
        "DELETE /admin/api/keys",
    ]


@pytest.mark.parametrize(
    ("headers", "body", "named"),
    [
        ({"Content-Type": "text/plain"}, b'{"name": "a"}', "got 'text/plain'"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, b"name=a", "urlencoded"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, b"--x--", "multipart"),
        ({}, b"", "none was sent"),
        ({"Content-Type": "application/jsonp"}, b"{}", "application/jsonp"),
    ],
)
async def test_changes_without_json_are_refused(
    client: httpx.AsyncClient,
    recorder: Recorder,
    headers: dict[str, str],
    body: bytes,
    named: str,
) -> None:
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        answer = await client.request(method, "/admin/api/keys", content=body, headers=headers)
        message = refused(answer, "json_required")
        assert named in message and "Content-Type: application/json" in message
    assert recorder.seen == []


async def test_the_dashboards_htmx_form_passes(
    client: httpx.AsyncClient, recorder: Recorder
) -> None:
    answer = await client.post("/admin/", data={"name": "a"}, headers=HX)
    assert answer.status_code == 200
    # htmx sends exactly "true"; anything else is not the dashboard.
    refused(await client.post("/admin/", data={"name": "a"}, headers={"HX-Request": "1"}),
            "json_required")  # fmt: skip
    assert recorder.seen == ["POST /admin/"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://127.0.0.2:8000"},
        {"Origin": "http://127.0.0.1:8000"},  # another port is another origin
        {"Origin": "http://localhost:9090"},  # another name for the same address, too
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1"},  # port 80
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.1:9090"},
    ],
)
async def test_changes_from_another_origin_are_refused(
    client: httpx.AsyncClient, recorder: Recorder, headers: dict[str, str]
) -> None:
    for extra in (JSON, HX):
        answer = await client.post("/admin/api/keys", json={}, headers={**headers, **extra})
        message = refused(answer, "cross_origin_request")
        assert "POST /admin/api/keys came from" in message
        assert next(iter(headers.values())) in message
    assert recorder.seen == []


async def test_changes_from_the_own_origin_pass(
    client: httpx.AsyncClient, recorder: Recorder
) -> None:
    own = {"Origin": "http://127.0.0.1:9090", "Sec-Fetch-Site": "same-origin"}
    assert (await client.post("/admin/api/keys", json={}, headers=own)).status_code == 200
    typed = {"Sec-Fetch-Site": "none"}
    assert (await client.post("/admin/api/keys", json={}, headers=typed)).status_code == 200
    assert len(recorder.seen) == 2


async def test_an_https_page_in_front_of_a_plain_listener_passes(recorder: Recorder) -> None:
    """A reverse proxy that terminates TLS: the page is https, the listener http."""
    async with guarded(recorder) as client:
        client.base_url = httpx.URL("http://gw.test")
        headers = {**JSON, "Origin": "https://gw.test", "Host": "gw.test"}
        assert (await client.post("/admin/api/keys", headers=headers)).status_code == 200
        # The same name on another port is another origin.
        headers["Origin"] = "https://gw.test:8443"
        refused(await client.post("/admin/api/keys", headers=headers), "cross_origin_request")


async def test_plain_reads_from_another_site_pass_but_secret_reads_do_not(
    recorder: Recorder,
) -> None:
    cross = {"Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.2:8000"}
    async with guarded(recorder, secret_reads=["/admin/api/session"]) as client:
        # A link from elsewhere to the dashboard still opens it.
        assert (await client.get("/admin/", headers=cross)).status_code == 200
        message = refused(
            await client.get("/admin/api/session", headers=cross), "cross_origin_request"
        )
        assert "GET /admin/api/session" in message
        own = {"Sec-Fetch-Site": "same-origin"}
        assert (await client.get("/admin/api/session", headers=own)).status_code == 200
    assert recorder.seen == ["GET /admin/", "GET /admin/api/session"]


async def test_form_paths_skip_the_content_type_rule_only(recorder: Recorder) -> None:
    async with guarded(recorder, form_paths=["/admin/login"]) as client:
        own = {"Origin": "http://127.0.0.1:9090"}
        answer = await client.post("/admin/login", data={"username": "a"}, headers=own)
        assert answer.status_code == 200
        cross = {"Origin": "http://127.0.0.2:8000"}
        refused(
            await client.post("/admin/login", data={"username": "a"}, headers=cross),
            "cross_origin_request",
        )
        refused(await client.post("/admin/api/keys", data={"a": "b"}), "json_required")
    assert recorder.seen == ["POST /admin/login"]


@pytest.mark.parametrize(
    "host",
    ["attacker.example:9090", "attacker.example", "127.0.0.1.attacker.example:9090",
     "localhost.attacker.example", "gw.test.attacker.example"],
)  # fmt: skip
async def test_a_rebinding_host_is_refused_for_every_method(
    client: httpx.AsyncClient, recorder: Recorder, host: str
) -> None:
    for method in ("GET", "POST", "DELETE"):
        answer = await client.request(method, "/admin/api/keys", headers={**JSON, "Host": host})
        message = refused(answer, "host_not_allowed")
        assert f"Host {host!r} is not allowed on the admin listener" in message
        assert f"add {host.partition(':')[0]!r} to admin.allowed_hosts" in message
        assert "--admin-allowed-host" in message
    for path in ("/metrics", "/admin/"):
        refused(await client.get(path, headers={"Host": host}), "host_not_allowed")
    assert recorder.seen == []


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:9090", "127.8.9.10:9090", "[::1]:9090", "localhost:9090", "LOCALHOST.",
     "10.0.0.5:9090", "gw.test:9090", "GW.TEST", "gw.test."],
)  # fmt: skip
async def test_addresses_localhost_and_configured_names_pass(
    client: httpx.AsyncClient, recorder: Recorder, host: str
) -> None:
    assert (await client.get("/metrics", headers={"Host": host})).status_code == 200
    answer = await client.post("/admin/api/keys", json={}, headers={"Host": host})
    assert answer.status_code == 200
    assert len(recorder.seen) == 2


async def test_liveness_is_answered_whatever_the_host(
    client: httpx.AsyncClient, recorder: Recorder
) -> None:
    answer = await client.get("/healthz", headers={"Host": "probe.internal:9090"})
    assert answer.status_code == 200
    # Only reads: a change to an exempt path still meets the other rules.
    refused(await client.post("/healthz", content=b"x", headers={"Host": "x.test"}),
            "json_required")  # fmt: skip
    assert recorder.seen == ["GET /healthz"]


async def test_a_request_without_host_is_refused(recorder: Recorder) -> None:
    app = browser_guard(
        Starlette(routes=[Route("/x", recorder.handle)]),
        surface="the admin listener",
        allowed_hosts=(),
    )
    messages: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        messages.append(message)

    scope = {"type": "http", "method": "GET", "path": "/x", "headers": [], "scheme": "http",
             "query_string": b"", "client": ("127.0.0.1", 1)}  # fmt: skip
    await app(scope, receive, send)  # type: ignore[arg-type]
    assert messages[0]["status"] == 403
    assert b"host_required" in messages[1]["body"]  # type: ignore[operator]
    assert recorder.seen == []


def test_host_headers_are_split_into_name_and_port() -> None:
    assert split_host("Example.COM:8080") == ("example.com", 8080)
    assert split_host("[::1]:9090") == ("::1", 9090)
    assert split_host("localhost.") == ("localhost", None)
    for bad in ("", ":80", "a:b", "[::1", "[::1]x"):
        with pytest.raises(ValueError):
            split_host(bad)


def test_allowed_hosts_come_from_the_file_and_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text("admin:\n  allowed_hosts: [GW.Example.com, '[fd00::5]']\n")
    cfg = load_server_config(path, {"admin_allowed_hosts": ["other.example."]})
    assert cfg.admin.allowed_hosts == ["gw.example.com", "fd00::5", "other.example"]
    assert load_server_config(None, {}).admin.allowed_hosts == []


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("https://gw.example.com", "without scheme or path"),
        ("gw.example.com:8443", "leave the port out"),
        ("gw example", "not a host name or IP address"),
        ("*.example.com", "not a host name or IP address"),
    ],
)
def test_bad_allowed_hosts_name_the_field(tmp_path: Path, entry: str, problem: str) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text(f"admin:\n  allowed_hosts: ['{entry}']\n")
    with pytest.raises(ConfigError) as caught:
        load_server_config(path, {})
    message = str(caught.value)
    assert f"{path}: admin.allowed_hosts" in message and problem in message


def test_a_listener_on_every_address_allows_this_hosts_names() -> None:
    from llmgw.cli.gateway import _own_names
    from llmgw.config import ListenAddress

    everywhere = _own_names(ListenAddress(host="0.0.0.0", port=8080), ["GW.example.com"])
    assert {"gw.example.com", socket.gethostname().lower(), socket.getfqdn().lower()} <= everywhere
    one = _own_names(ListenAddress(host="admin.internal", port=9090), [])
    assert one == {"admin.internal"}


async def test_the_cli_shows_the_guards_reason_without_the_admin_key_hint(
    recorder: Recorder,
) -> None:
    from llmgw.cli.adminclient import Admin, AdminError, _decode

    async with guarded(recorder) as client:
        answer = await client.get("/admin/api/keys", headers={"Host": "evil.example:9090"})
    admin = Admin(url="http://evil.example:9090", key=None, source="--admin")
    with pytest.raises(AdminError) as caught:
        _decode(answer, admin, "http://evil.example:9090/admin/api/keys", "")
    message = caught.value.message
    assert message.startswith("the admin API refused the request: Host 'evil.example:9090'")
    assert "admin.allowed_hosts" in message and "--admin-key" not in message


@pytest.mark.parametrize(
    ("value", "problem"),
    [("https://gw.example.com", "without scheme or path"), ("gw.example.com:443", "port out")],
)
def test_a_bad_admin_allowed_host_flag_is_named(tmp_path: Path, value: str, problem: str) -> None:
    from typer.testing import CliRunner

    from llmgw.cli.main import app

    result = CliRunner().invoke(
        app, ["server", "--admin-allowed-host", value, "--data-dir", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert f"error: --admin-allowed-host {value!r}: " in result.output
    assert problem in result.output
