"""Single sign-on through OpenID Connect on a real `llmgw server`, driven over HTTP.

The provider is `tests/oidc_issuer.py` (a real HTTP server on loopback); the
client plays the browser: it follows the gateway to the provider, the provider
(auto-approving as one user) back to the gateway's callback, and keeps cookies.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from oidc_issuer import CLIENT_SECRET, IdpUser, OidcIssuer, sso_config
from procs import Server, llmgw
from test_admin_login import PASSWORD, add_user

ENDPOINT = "e=http://127.0.0.1:1=m"


def write_config(tmp_path: Path, issuer: OidcIssuer, **kwargs: Any) -> Path:
    secret = tmp_path / "client-secret"
    secret.write_text(CLIENT_SECRET + "\n")
    config = tmp_path / "llmgw.yaml"
    config.write_text(yaml.safe_dump(sso_config(issuer, str(secret), **kwargs)))
    return config


@pytest.fixture
def issuer() -> Iterator[OidcIssuer]:
    users = {
        "ann": IdpUser("sub-ann", "ann@example.com", ["llm-ops"]),
        "vic": IdpUser("sub-vic", "vic@example.com", ["llm-viewers", "staff"]),
        "eve": IdpUser("sub-eve", "eve@elsewhere.org", ["llm-admins"]),
        "bob": IdpUser("sub-bob", "bob@example.com", ["llm-admins"]),
    }
    with OidcIssuer(users=users, auto_user="ann") as running:
        yield running


@pytest.fixture
def server(tmp_path: Path, issuer: OidcIssuer) -> Iterator[Server]:
    config = write_config(tmp_path, issuer)
    running = Server("--endpoint", ENDPOINT, "--config", str(config), wait_ready=False)
    try:
        yield running
    finally:
        running.proc.stop()


def start_sign_in(client: httpx.Client, issuer: OidcIssuer) -> str:
    """Follow the gateway to the provider and back; the callback URL it sends us to."""
    begin = client.get("/admin/oidc/login")
    assert begin.status_code == 303, begin.text
    assert begin.headers["location"].startswith(issuer.url + "/authorize?")
    at_provider = client.get(begin.headers["location"])
    assert at_provider.status_code == 302, at_provider.text
    callback = at_provider.headers["location"]
    assert callback.startswith(str(client.base_url) + "/admin/oidc/callback?")
    return callback


@contextmanager
def sign_in(server: Server, issuer: OidcIssuer) -> Iterator[tuple[httpx.Client, httpx.Response]]:
    """A browser-like client that went through a sign-in, and the callback's answer."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client, client.get(start_sign_in(client, issuer))


def session_of(client: httpx.Client) -> dict[str, Any]:
    answer = client.get("/admin/api/session")
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = answer.json()
    return data


def test_a_user_signs_in_gets_the_role_of_their_groups_and_logs_out(
    server: Server, issuer: OidcIssuer
) -> None:
    with sign_in(server, issuer) as (client, done):
        assert done.status_code == 200, done.text
        assert "Signed in as" in done.text and "ann@example.com" in done.text
        cookie = next(c for c in done.headers.get_list("set-cookie") if "llmgw_session=" in c)
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        session = session_of(client)
        assert session["user"] == "ann@example.com"
        assert session["role"] == "operator"
        # An operator sees the fleet but not the keys.
        assert client.get("/admin/api/nodes").status_code == 200
        keys = client.get("/admin/api/keys")
        assert keys.status_code == 403 and "operator" in keys.json()["error"]["message"]
        # The user was created as a single sign-on user: no password opens it.
        password = client.post(
            "/admin/login", data={"username": "ann@example.com", "password": PASSWORD}
        )
        assert password.status_code == 401
        listed = subprocess.run(
            llmgw("users", "list", "--data-dir", str(server.data_dir)),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        (row,) = [line for line in listed.stdout.splitlines() if "ann@example.com" in line]
        assert row.split()[:3] == ["ann@example.com", "operator", "sso"], listed.stdout
        passwd = subprocess.run(
            llmgw("users", "passwd", "ann@example.com", "--password-stdin",
                  "--data-dir", str(server.data_dir)),
            input=PASSWORD + "\n", capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert passwd.returncode != 0
        assert "signs in through single sign-on and has no password here" in passwd.stderr
        out = client.post("/admin/logout", headers={"X-CSRF-Token": session["csrf_token"]})
        assert out.status_code == 303
        assert client.get("/admin/api/session").status_code == 401


def test_the_role_is_read_again_at_every_sign_in(server: Server, issuer: OidcIssuer) -> None:
    with sign_in(server, issuer) as (first, _):
        assert session_of(first)["role"] == "operator"
        issuer.users["ann"].groups = ["llm-admins"]
        with sign_in(server, issuer) as (second, done):
            assert done.status_code == 200
            assert session_of(second)["role"] == "admin"
            assert second.get("/admin/api/keys").status_code == 200
        # No group maps to a role any more: refused with a page saying so, and the
        # role is taken away from the sessions already open.
        issuer.users["ann"].groups = ["staff"]
        with sign_in(server, issuer) as (third, refused):
            assert refused.status_code == 403
            assert "none of your groups (staff) gives a role" in refused.text
            assert "auth.oidc.roles" in refused.text
            assert "llmgw_session=" not in refused.headers.get("set-cookie", "")
            assert third.get("/admin/api/session").status_code == 401
        assert first.get("/admin/api/nodes").status_code == 403


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ("wrong_key", "signature does not match the identity provider&#x27;s keys"),
        ("expired", "the ID token has expired"),
        ("wrong_aud", "meant for another client"),
        ("bad_nonce", "nonce does not match this sign-in"),
    ],
)
def test_a_bad_id_token_is_refused(
    server: Server, issuer: OidcIssuer, tamper: str, message: str
) -> None:
    issuer.tamper = tamper
    with sign_in(server, issuer) as (client, refused):
        assert refused.status_code == 400, refused.text
        assert message in refused.text
        assert "Traceback" not in refused.text
        assert "llmgw_session=" not in refused.headers.get("set-cookie", "")
        assert client.get("/admin/api/session").status_code == 401


def test_a_replayed_state_is_refused(server: Server, issuer: OidcIssuer) -> None:
    client = httpx.Client(base_url=server.url, timeout=30)
    with client:
        callback = start_sign_in(client, issuer)
        state = httpx.URL(callback).params["state"]
        assert client.get(callback).status_code == 200
        # The same answer again, even from the browser that started it.
        client.cookies.set("llmgw_oidc", state, path="/admin/oidc")
        again = client.get(callback)
        assert again.status_code == 400
        assert "already used" in again.text
        # From another browser (no sign-in cookie): refused before anything else.
        with httpx.Client(timeout=30) as other:
            elsewhere = other.get(callback)
        assert elsewhere.status_code == 400
        assert "not started in this browser" in elsewhere.text
        # A made-up state, bound to the browser, is unknown too.
        client.cookies.set("llmgw_oidc", "made-up", path="/admin/oidc")
        forged = client.get("/admin/oidc/callback", params={"state": "made-up", "code": "x"})
        assert forged.status_code == 400 and "not known here" in forged.text
        # One token request only: the replays never reached the provider.
        assert issuer.token_requests == 1


def test_a_refusal_at_the_provider_is_shown(server: Server, issuer: OidcIssuer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        callback = httpx.URL(start_sign_in(client, issuer))
        answer = client.get(
            "/admin/oidc/callback",
            params={
                "error": "access_denied",
                "error_description": "the user said no",
                "state": callback.params["state"],
            },
        )
        assert answer.status_code == 403
        assert "did not sign you in (access_denied: the user said no)" in answer.text
        assert client.get("/admin/api/session").status_code == 401


def test_a_rotated_signing_key_is_fetched_again(server: Server, issuer: OidcIssuer) -> None:
    with sign_in(server, issuer) as (_, done):
        assert done.status_code == 200
    issuer.rotate()
    with sign_in(server, issuer) as (after, done):
        assert done.status_code == 200, done.text
        assert session_of(after)["role"] == "operator"


def test_allowed_domains_and_taken_names(tmp_path: Path, issuer: OidcIssuer) -> None:
    data = tmp_path / "data"
    # A local user already holds bob's e-mail as a name: SSO must not take it over.
    add_user(data, "bob@example.com", admin=False)
    config = write_config(tmp_path, issuer, allowed_domains=["example.com"])
    server = Server(
        "--endpoint", ENDPOINT, "--config", str(config), data_dir=data, wait_ready=False
    )
    try:
        issuer.auto_user = "eve"
        with sign_in(server, issuer) as (_, refused):
            assert refused.status_code == 403
            assert "not in an allowed e-mail domain (example.com)" in refused.text
        issuer.auto_user = "bob"
        with sign_in(server, issuer) as (_, taken):
            assert taken.status_code == 403
            assert "already taken by another user" in taken.text
        issuer.auto_user = "vic"
        with sign_in(server, issuer) as (client, done):
            assert done.status_code == 200
            assert session_of(client)["role"] == "viewer"
    finally:
        server.proc.stop()


def test_local_login_off_refuses_passwords(tmp_path: Path, issuer: OidcIssuer) -> None:
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    config = write_config(tmp_path, issuer, local_login=False)
    server = Server(
        "--endpoint", ENDPOINT, "--config", str(config), data_dir=data, wait_ready=False
    )
    try:
        page = httpx.get(server.url + "/admin/login", timeout=30)
        assert "Sign in with single sign-on" in page.text
        assert "<input id=password" not in page.text
        with httpx.Client(base_url=server.url, timeout=30) as client:
            refused = client.post("/admin/login", data={"username": "alice", "password": PASSWORD})
            assert refused.status_code == 403
            assert "password logins are turned off" in refused.text
            assert "auth.local_login" in refused.text
            assert client.get("/admin/api/session").status_code == 401
    finally:
        server.proc.stop()


def run_server(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw("server", "--config", str(config), "--endpoint", ENDPOINT,
              "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--agent-listen", "off",
              "--data-dir", str(config.parent / "data")),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_config_errors_name_the_field_and_file(tmp_path: Path, issuer: OidcIssuer) -> None:
    config = tmp_path / "llmgw.yaml"
    config.write_text(yaml.safe_dump({"auth": {"local_login": False}}))
    result = run_server(config)
    assert result.returncode != 0
    assert f"{config}" in result.stderr and "auth: " in result.stderr
    assert "local_login is false and oidc is not set" in result.stderr

    settings = sso_config(issuer, str(tmp_path / "missing-secret"))
    settings["auth"]["oidc"]["scopes"] = ["email"]
    settings["auth"]["oidc"]["roles"] = {}
    config.write_text(yaml.safe_dump(settings))
    result = run_server(config)
    assert result.returncode != 0
    assert "auth.oidc.scopes: must include openid" in result.stderr
    assert "auth.oidc.roles: no group is mapped to a role" in result.stderr

    config.write_text(yaml.safe_dump(sso_config(issuer, str(tmp_path / "missing-secret"))))
    result = run_server(config)
    assert result.returncode != 0
    assert f"{config}: auth.oidc.client_secret_file: " in result.stderr
    assert "missing-secret does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_provider_that_is_down_gets_a_page_saying_so(tmp_path: Path) -> None:
    secret = tmp_path / "client-secret"
    secret.write_text(CLIENT_SECRET + "\n")
    # A provider that was there once and is gone: its port no longer answers.
    with OidcIssuer() as gone:
        settings = sso_config(gone, str(secret))
    issuer_url = gone.url
    config = tmp_path / "llmgw.yaml"
    config.write_text(yaml.safe_dump(settings))
    server = Server("--endpoint", ENDPOINT, "--config", str(config), wait_ready=False)
    try:
        answer = httpx.get(server.url + "/admin/oidc/login", timeout=30)
        assert answer.status_code == 502
        assert "cannot reach the identity provider" in answer.text
        assert issuer_url in answer.text
        assert "Back to the login page" in answer.text
        # Password logins still work beside it.
        assert httpx.get(server.url + "/admin/login", timeout=30).status_code == 200
    finally:
        server.proc.stop()
