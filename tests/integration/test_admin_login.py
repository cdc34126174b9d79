"""Admin login on the API port of a real `llmgw server`: users from `llmgw users`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
from procs import Server, llmgw

PASSWORD = "correct horse battery staple"


def add_user(data_dir: Path, name: str, *, admin: bool) -> None:
    result = subprocess.run(
        [*llmgw("users", "create", name, "--password-stdin", "--data-dir", str(data_dir)),
         *(["--admin"] if admin else [])],
        input=PASSWORD + "\n", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def login(server: Server, name: str, password: str = PASSWORD) -> httpx.Client:
    client = httpx.Client(base_url=server.url, timeout=10)
    answer = client.post("/admin/login", data={"username": name, "password": password})
    assert answer.status_code in (303, 401), answer.text
    return client


def test_an_admin_logs_in_on_the_api_port_and_uses_the_admin_api(tmp_path: Path) -> None:
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob", admin=False)
    server = Server("--endpoint", "e=http://127.0.0.1:1=m", data_dir=data, wait_ready=False)
    try:
        # Not logged in: the admin API on the API port is closed; the debug and
        # metrics endpoints are never there.
        anonymous = httpx.get(server.url + "/admin/api/nodes", timeout=10)
        assert anonymous.status_code == 401
        assert httpx.get(server.url + "/metrics", timeout=10).status_code == 404

        wrong = login(server, "alice", "not the password at all")
        assert wrong.get("/admin/api/nodes").status_code == 401
        wrong.close()

        alice = login(server, "alice")
        cookie = alice.cookies.get("llmgw_session")
        assert cookie
        # Passwords were checked in the logins' own pool, not the shared default executor.
        threads = httpx.get(server.admin + "/debug/threads?format=json", timeout=30).json()
        names = [name for group in threads["groups"] for name in group["names"]]
        assert any(name.startswith("llmgw-login") for name in names), names
        nodes = alice.get("/admin/api/nodes")
        assert nodes.status_code == 200 and nodes.json()["nodes"] == []
        # Only the admin API goes through: not the admin listener's metrics or debug.
        assert alice.get("/admin/metrics").status_code == 404
        session = alice.get("/admin/api/session").json()
        model = {"name": "extra", "weights": "none", "profiles": [{"engine": "sim"}]}
        no_csrf = alice.post("/admin/api/models", json=model)
        assert no_csrf.status_code == 403
        assert no_csrf.json()["error"]["code"] == "csrf_failed"
        created = alice.post(
            "/admin/api/models", json=model, headers={"X-CSRF-Token": session["csrf_token"]}
        )
        assert created.status_code == 201, created.text
        out = alice.post("/admin/logout", headers={"X-CSRF-Token": session["csrf_token"]})
        assert out.status_code == 303
        assert alice.get("/admin/api/nodes").status_code == 401
        alice.close()

        bob = login(server, "bob")
        refused = bob.get("/admin/api/nodes")
        assert refused.status_code == 403
        assert "nodes" not in refused.text
        bob.close()
    finally:
        server.proc.stop()
