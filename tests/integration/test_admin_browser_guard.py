"""The browser guard on a real `llmgw server`: what a web page could send is refused, tools work.

One server (open auth, `--admin-allowed-host gw.test`) and one real agent
(`node-1`), so that key creation, model add and node drain all have something
to act on. Every refused request is checked afterwards through the admin API:
no key, no model, the node not draining. The CLI commands that change things
(`llmgw models add/remove`, `llmgw nodes drain/undrain`) run against the same
server and still work.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for

pytestmark = pytest.mark.timeout(180)

JSON = {"Content-Type": "application/json"}
MODEL = {"name": "evil-model", "weights": "none", "profiles": [{"name": "p", "engine": "sim"}]}


@dataclass
class Gateway:
    server: Server
    agent: Proc

    @property
    def admin(self) -> str:
        return self.server.admin

    def get(self, path: str) -> Any:
        answer = httpx.get(self.admin + path, timeout=10)
        answer.raise_for_status()
        return answer.json()

    def key_names(self) -> set[str]:
        return {k["name"] for k in self.get("/admin/api/keys?all=true")["keys"]}

    def model_names(self) -> set[str]:
        return {m["name"] for m in self.get("/admin/api/models")["models"]}

    def draining(self) -> bool:
        node: dict[str, Any] = self.get("/admin/api/nodes/node-1")
        return bool(node["draining"])

    def assert_unchanged(self) -> None:
        assert "evil-key" not in self.key_names()
        assert "evil-model" not in self.model_names()
        assert self.draining() is False


@pytest.fixture(scope="module", name="gw")
def gateway_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("browser-guard")
    agent_port = free_port()
    server = Server(
        "--endpoint", "x=http://127.0.0.1:1=unused", "--agent-listen", f"127.0.0.1:{agent_port}",
        "--admin-allowed-host", "gw.test", data_dir=tmp / "data", wait_ready=False,
    )  # fmt: skip
    low = free_port_block(5)
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-1",
            "--gpus", "1x24GiB", "--weights-dir", str(tmp / "weights"),
            "--state-dir", str(tmp / "state"), "--port-range", f"{low}-{low + 4}",
        )
    )  # fmt: skip
    gateway = Gateway(server, agent)
    try:
        wait_for(
            lambda: [n["id"] for n in gateway.get("/admin/api/nodes")["nodes"]] == ["node-1"],
            "the agent to register",
        )
        yield gateway
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def refused(answer: httpx.Response, code: str) -> str:
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("permission_error", code), error
    message: str = error["message"]
    return message


def attempts(gw: Gateway) -> list[tuple[str, str]]:
    """(path, JSON body) of the three changes a page would want to make."""
    return [
        ("/admin/api/keys", json.dumps({"name": "evil-key", "admin": True})),
        ("/admin/api/models", json.dumps(MODEL)),
        ("/admin/api/nodes/node-1/drain", ""),
    ]


@pytest.mark.parametrize(
    "content_type",
    ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded", None],
)
def test_changes_a_page_can_send_without_preflight_are_refused(
    gw: Gateway, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    for path, body in attempts(gw):
        answer = httpx.post(gw.admin + path, content=body, headers=headers, timeout=10)
        message = refused(answer, "json_required")
        assert f"POST {path} needs Content-Type: application/json" in message
    gw.assert_unchanged()


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://127.0.0.2:8000"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"},
    ],
)
def test_changes_from_another_origin_are_refused(gw: Gateway, headers: dict[str, str]) -> None:
    for path, body in attempts(gw):
        for kind in (JSON, {"HX-Request": "true"}):
            answer = httpx.post(
                gw.admin + path, content=body, headers={**headers, **kind}, timeout=10
            )
            assert "came from" in refused(answer, "cross_origin_request")
    gw.assert_unchanged()


def test_a_rebinding_host_is_refused_even_for_reads(gw: Gateway) -> None:
    host = f"attacker.example:{gw.server.admin_port}"
    for path, body in attempts(gw):
        answer = httpx.post(gw.admin + path, content=body, headers={**JSON, "Host": host})
        message = refused(answer, "host_not_allowed")
        assert f"Host '{host}' is not allowed on the admin listener" in message
        assert "add 'attacker.example' to admin.allowed_hosts" in message
    for path in ("/admin/api/keys", "/admin/", "/metrics", "/readyz"):
        refused(httpx.get(gw.admin + path, headers={"Host": host}), "host_not_allowed")
    # A liveness probe is answered whatever the name.
    assert httpx.get(gw.admin + "/healthz", headers={"Host": host}).status_code == 200
    gw.assert_unchanged()
    output = gw.server.proc.output()
    assert f"refused POST /admin/api/keys from 127.0.0.1 on the admin listener: Host '{host}'" in (
        output
    )


def test_a_configured_name_and_localhost_are_served(gw: Gateway) -> None:
    port = gw.server.admin_port
    for host in (f"gw.test:{port}", f"localhost:{port}", f"[::1]:{port}"):
        own = {**JSON, "Host": host, "Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"}
        name = f"ok-{host.split(':')[0].strip('[')}"
        created = httpx.post(gw.admin + "/admin/api/keys", json={"name": name}, headers=own)
        assert created.status_code == 201, created.text
        assert created.json()["secret"].startswith("sk-")
        revoked = httpx.post(gw.admin + f"/admin/api/keys/{name}/revoke", headers=own)
        assert revoked.status_code == 200, revoked.text
        metrics = httpx.get(gw.admin + "/metrics", headers={"Host": host})
        assert metrics.status_code == 200 and "llmgw_" in metrics.text


def test_the_dashboards_own_htmx_actions_work(gw: Gateway) -> None:
    own = {
        "HX-Request": "true",
        "Origin": gw.admin,
        "Sec-Fetch-Site": "same-origin",
    }
    drained = httpx.post(gw.admin + "/admin/nodes/node-1/drain", headers=own)
    assert drained.status_code == 200 and "node node-1 is draining" in drained.text
    assert gw.draining() is True
    undrained = httpx.post(gw.admin + "/admin/nodes/node-1/undrain", headers=own)
    assert undrained.status_code == 200
    assert gw.draining() is False


def test_admin_on_the_api_port_checks_the_host_too(gw: Gateway) -> None:
    api, port = gw.server.url, gw.server.port
    message = refused(
        httpx.get(api + "/admin/login", headers={"Host": f"evil.example:{port}"}),
        "host_not_allowed",
    )
    assert "not allowed on /admin on the API port: add 'evil.example' to admin.allowed_hosts" in (
        message
    )
    assert httpx.get(api + "/admin/login").status_code == 200
    assert httpx.get(api + "/admin/login", headers={"Host": f"gw.test:{port}"}).status_code == 200
    # A cross-site login post is refused before the portal reads it.
    login = httpx.post(
        api + "/admin/login",
        data={"username": "a", "password": "b"},
        headers={"Origin": "http://127.0.0.2:8000"},
    )
    refused(login, "cross_origin_request")
    # The OpenAI API on the same port is not the admin's business.
    models = httpx.get(api + "/v1/models", headers={"Host": f"evil.example:{port}"})
    assert models.status_code == 200


def test_cli_admin_commands_still_work(gw: Gateway, tmp_path: Path) -> None:
    def cli(*args: str) -> str:
        result = subprocess.run(
            llmgw(*args, "--admin", gw.admin), capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    spec = tmp_path / "model.yaml"
    spec.write_text("name: cli-model\nweights: none\nprofiles: [{name: p, engine: sim}]\n")
    cli("models", "add", "--file", str(spec))
    assert "cli-model" in gw.model_names()
    cli("nodes", "drain", "node-1")
    assert gw.draining() is True
    cli("nodes", "undrain", "node-1")
    assert gw.draining() is False
    cli("models", "remove", "cli-model")
    assert "cli-model" not in gw.model_names()
