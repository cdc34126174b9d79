"""Roles (admin, operator, viewer) through a real `llmgw server` and a real agent.

Users and keys are made with `llmgw users` and `llmgw keys` before the server
starts; the admin API is called on the admin listener with each key, the
dashboard and the admin API on the API port with each user's session, and the
`llmgw nodes` CLI with each key. What a role may not do is refused with a 403
that names the role, and changes nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import procs
import pytest
from procs import Proc, Server, free_port, free_port_block, llmgw

PASSWORD = "correct horse battery staple"
ROLES = ("admin", "operator", "viewer")


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return subprocess.run(
        llmgw(*args), input=stdin, capture_output=True, text=True, timeout=60, check=False, env=env
    )


def made(*args: str, stdin: str = "") -> str:
    result = cli(*args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


@dataclass
class Fleet:
    server: Server
    keys: dict[str, str]

    def api(self, role: str) -> httpx.Client:
        """The admin listener with `role`'s key."""
        return httpx.Client(
            base_url=self.server.admin,
            headers={"Authorization": f"Bearer {self.keys[role]}"},
            timeout=10,
        )

    def node(self, node_id: str) -> dict[str, Any]:
        answer = httpx.get(f"{self.server.admin}/admin/api/nodes/{node_id}", timeout=10)
        answer.raise_for_status()
        node: dict[str, Any] = answer.json()
        return node


@pytest.fixture(scope="module", name="fleet")
def fleet_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("roles")
    data = tmp / "data"
    for role in ROLES:
        made("users", "create", f"{role}-user", "--role", role, "--password-stdin",
             "--data-dir", str(data), stdin=PASSWORD + "\n")  # fmt: skip
    made("users", "create", "nobody", "--password-stdin", "--data-dir", str(data),
         stdin=PASSWORD + "\n")  # fmt: skip
    keys = {}
    for role in ROLES:
        created = made("keys", "create", "--name", f"{role}-key", "--role", role, "--json",
                       "--data-dir", str(data))  # fmt: skip
        keys[role] = json.loads(created)["secret"]
    keys["client"] = json.loads(
        made("keys", "create", "--name", "app", "--json", "--data-dir", str(data))
    )["secret"]
    config = tmp / "llmgw.yaml"
    config.write_text("control: {heartbeat_interval: 0.3, unreachable_after: 5, lost_after: 10}\n")
    agent_port = free_port()
    server = Server(
        "--endpoint", "x=http://127.0.0.1:1=unused", "--agent-listen", f"127.0.0.1:{agent_port}",
        "--config", str(config), data_dir=data, wait_ready=False, auth=True,
    )  # fmt: skip
    low = free_port_block(4)
    agent = Proc(
        llmgw("agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-1",
              "--gpus", "1x24GiB", "--weights-dir", str(tmp / "w"),
              "--port-range", f"{low}-{low + 3}")
    )  # fmt: skip
    try:
        fleet = Fleet(server, keys)
        procs.wait_for(
            lambda: httpx.get(server.admin + "/admin/api/nodes", timeout=10).json()["nodes"],
            "the agent to register",
            30,
        )
        yield fleet
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def refused_for_role(answer: httpx.Response, role: str) -> None:
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "role_not_allowed", error
    assert f"has the role {role}" in error["message"]


def test_admin_api_keys_do_what_their_role_may(fleet: Fleet) -> None:
    with fleet.api("viewer") as viewer:
        assert viewer.get("/admin/api/nodes").json()["nodes"][0]["id"] == "node-1"
        assert viewer.get("/admin/api/models").status_code == 200
        refused_for_role(viewer.post("/admin/api/nodes/node-1/drain", json={}), "viewer")
        assert fleet.node("node-1")["draining"] is False
        for path in ("/admin/api/keys", "/admin/api/usage", "/debug/tasks",
                     "/admin/api/join-tokens"):  # fmt: skip
            refused_for_role(viewer.get(path), "viewer")
        refused_for_role(viewer.post("/admin/api/keys", json={"name": "sneaky"}), "viewer")

    with fleet.api("operator") as operator:
        drained = operator.post("/admin/api/nodes/node-1/drain", json={})
        assert drained.status_code == 200, drained.text
        assert fleet.node("node-1")["draining"] is True
        assert operator.post("/admin/api/nodes/node-1/undrain", json={}).status_code == 200
        assert fleet.node("node-1")["draining"] is False
        assert operator.get("/debug/tasks").status_code == 200
        refused_for_role(operator.get("/admin/api/keys"), "operator")
        refused_for_role(operator.get("/admin/api/usage"), "operator")
        refused_for_role(operator.patch("/admin/api/keys/app", json={"role": "admin"}), "operator")

    with fleet.api("admin") as admin:
        listed = admin.get("/admin/api/keys").json()["keys"]
        assert {k["name"]: k["admin_role"] for k in listed} == {
            "admin-key": "admin", "operator-key": "operator", "viewer-key": "viewer", "app": None,
        }  # fmt: skip
        assert admin.get("/admin/api/usage").status_code == 200

    with fleet.api("client") as client:
        answer = client.get("/admin/api/nodes")
        assert answer.status_code == 403
        assert answer.json()["error"]["code"] == "admin_required"
    bad = httpx.get(
        fleet.server.admin + "/admin/api/nodes",
        headers={"Authorization": "Bearer sk-llmgw-not-a-key"},
        timeout=10,
    )
    assert bad.status_code == 401
    # Without a key, loopback is whoever runs the machine: every role's rights.
    assert httpx.get(fleet.server.admin + "/admin/api/keys", timeout=10).status_code == 200
    # Nothing the refused calls asked for happened.
    names = [k["name"] for k in httpx.get(fleet.server.admin + "/admin/api/keys").json()["keys"]]
    assert "sneaky" not in names


def test_the_cli_says_what_the_role_may_not_do(fleet: Fleet) -> None:
    admin = ("--admin", fleet.server.admin)
    viewer = cli("nodes", "drain", "node-1", *admin, "--admin-key", fleet.keys["viewer"])
    assert viewer.returncode == 2, (viewer.stdout, viewer.stderr)
    assert "Traceback" not in viewer.stderr
    (line,) = viewer.stderr.strip().splitlines()
    assert line.startswith("error: the admin API refused the request: API key 'viewer-key' "
                           "has the role viewer, which may not POST /admin/api/nodes/node-1/drain")  # fmt: skip
    assert fleet.node("node-1")["draining"] is False
    listed = cli("nodes", "list", *admin, "--admin-key", fleet.keys["viewer"])
    assert listed.returncode == 0 and "node-1" in listed.stdout

    operator = cli("nodes", "drain", "node-1", *admin, "--admin-key", fleet.keys["operator"])
    assert operator.returncode == 0, operator.stderr
    assert fleet.node("node-1")["draining"] is True
    undrained = cli("nodes", "undrain", "node-1", *admin, "--admin-key", fleet.keys["operator"])
    assert undrained.returncode == 0, undrained.stderr
    assert fleet.node("node-1")["draining"] is False


def session(fleet: Fleet, name: str) -> tuple[httpx.Client, str]:
    client = httpx.Client(base_url=fleet.server.url, timeout=10)
    answer = client.post("/admin/login", data={"username": name, "password": PASSWORD})
    assert answer.status_code == 303, answer.text
    csrf: str = client.get("/admin/api/session").json()["csrf_token"]
    return client, csrf


def nav_links(page: str) -> list[str]:
    nav = page[page.index("<nav") : page.index("</nav>")]
    return re.findall(r'href="(/admin/[^"]*)"', nav)


def test_each_user_sees_and_does_what_their_role_may(fleet: Fleet) -> None:
    html = {"Accept": "text/html"}
    viewer, csrf = session(fleet, "viewer-user")
    try:
        assert viewer.get("/admin/api/session").json()["role"] == "viewer"
        overview = viewer.get("/admin/", headers=html)
        assert overview.status_code == 200
        assert nav_links(overview.text) == ["/admin/", "/admin/nodes", "/admin/models",
                                            "/admin/events"]  # fmt: skip
        assert 'data-role="viewer"' in overview.text
        nodes_page = viewer.get("/admin/nodes", headers=html).text
        assert 'data-node="node-1"' in nodes_page and "/drain" not in nodes_page
        assert "Add a model" not in viewer.get("/admin/models", headers=html).text
        keys_page = viewer.get("/admin/keys", headers=html)
        assert keys_page.status_code == 403 and "has the role viewer" in keys_page.text
        assert "viewer-key" not in keys_page.text
        refused_for_role(viewer.get("/admin/api/keys"), "viewer")
        drain = viewer.post(
            "/admin/nodes/node-1/drain", headers={"X-CSRF-Token": csrf, "HX-Request": "true"}
        )
        assert drain.status_code == 403 and "has the role viewer" in drain.text
        refused_for_role(
            viewer.post("/admin/api/nodes/node-1/drain", json={}, headers={"X-CSRF-Token": csrf}),
            "viewer",
        )
        assert fleet.node("node-1")["draining"] is False
    finally:
        viewer.close()

    operator, csrf = session(fleet, "operator-user")
    try:
        overview = operator.get("/admin/", headers=html).text
        assert "/admin/keys" not in nav_links(overview) and "/admin/usage" not in nav_links(
            overview
        )
        nodes_page = operator.get("/admin/nodes", headers=html).text
        assert "/admin/nodes/node-1/drain" in nodes_page
        drain = operator.post(
            "/admin/nodes/node-1/drain", headers={"X-CSRF-Token": csrf, "HX-Request": "true"}
        )
        assert drain.status_code == 200, drain.text
        assert fleet.node("node-1")["draining"] is True
        undrain = operator.post(
            "/admin/api/nodes/node-1/undrain", json={}, headers={"X-CSRF-Token": csrf}
        )
        assert undrain.status_code == 200
        assert operator.get("/admin/usage.csv").status_code == 403
    finally:
        operator.close()

    admin, _ = session(fleet, "admin-user")
    try:
        overview = admin.get("/admin/", headers=html).text
        assert "/admin/keys" in nav_links(overview) and "/admin/usage" in nav_links(overview)
        assert "viewer-key" in admin.get("/admin/keys", headers=html).text
    finally:
        admin.close()

    nobody, _ = session(fleet, "nobody")
    try:
        answer = nobody.get("/admin/api/nodes")
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "admin_required"
    finally:
        nobody.close()


def test_a_new_role_applies_to_an_open_session(fleet: Fleet) -> None:
    client, _ = session(fleet, "viewer-user")
    data_dir = str(fleet.server.data_dir)
    try:
        refused_for_role(client.get("/admin/api/join-tokens"), "viewer")
        made("users", "role", "viewer-user", "operator", "--data-dir", data_dir)
        # Past the role check: this server's agents are plaintext, so it has no
        # join tokens to show, and says so.
        tokens = client.get("/admin/api/join-tokens")
        assert tokens.status_code == 409 and tokens.json()["error"]["code"] != "role_not_allowed"
        assert client.get("/admin/api/session").json()["role"] == "operator"
        made("users", "role", "viewer-user", "none", "--data-dir", data_dir)
        assert client.get("/admin/api/nodes").json()["error"]["code"] == "admin_required"
    finally:
        made("users", "role", "viewer-user", "viewer", "--data-dir", data_dir)
        client.close()
