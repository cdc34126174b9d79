"""`auth.oidc` and `auth.local_login` in the server config, and the group to role rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from llmgw.auth.oidc import role_for
from llmgw.config import ConfigError, load_server_config

ROLES = {"admins": ["a"], "operators": ["o"], "viewers": ["v"]}


def load(tmp_path: Path, auth: dict[str, Any]) -> str:
    path = tmp_path / "llmgw.yaml"
    path.write_text(yaml.safe_dump({"auth": auth}))
    try:
        load_server_config(path, {})
    except ConfigError as exc:
        return str(exc)
    return ""


def oidc(**fields: Any) -> dict[str, Any]:
    return {
        "issuer": "https://idp.example.com/realms/x",
        "client_id": "llmgw",
        "client_secret_file": "/etc/llmgw/secret",
        "roles": ROLES,
        **fields,
    }


def test_a_good_section_loads_with_its_defaults(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text(yaml.safe_dump({"auth": {"oidc": oidc(allowed_domains=["@Example.COM"])}}))
    cfg = load_server_config(path, {})
    assert cfg.auth.local_login is True
    assert cfg.auth.oidc is not None
    assert cfg.auth.oidc.scopes == ["openid", "email", "profile"]
    assert cfg.auth.oidc.groups_claim == "groups"
    assert cfg.auth.oidc.allowed_domains == ["example.com"]


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"local_login": False}, "auth: local_login is false and oidc is not set"),
        ({"oidc": oidc(issuer="http://idp.example.com")}, "auth.oidc.issuer: 'http://idp"),
        ({"oidc": oidc(scopes=["email"])}, "auth.oidc.scopes: must include openid"),
        ({"oidc": oidc(roles={})}, "auth.oidc.roles: no group is mapped to a role"),
        ({"oidc": oidc(allowed_domains=["not a domain"])}, "auth.oidc.allowed_domains"),
        (
            {"oidc": oidc(redirect_uri="https://gw.example.com/elsewhere")},
            "auth.oidc.redirect_uri: 'https://gw.example.com/elsewhere': the callback path",
        ),
        ({"oidc": oidc(client_secret="inline")}, "auth.oidc.client_secret: unknown field"),
    ],
)
def test_bad_settings_name_the_file_and_field(
    tmp_path: Path, auth: dict[str, Any], message: str
) -> None:
    error = load(tmp_path, auth)
    assert error.startswith(str(tmp_path / "llmgw.yaml"))
    assert message in error


def test_http_is_accepted_for_a_provider_on_loopback(tmp_path: Path) -> None:
    assert load(tmp_path, {"oidc": oidc(issuer="http://127.0.0.1:8081")}) == ""
    assert load(tmp_path, {"oidc": oidc(issuer="http://localhost:8081/realms/x")}) == ""


def test_the_highest_role_of_any_group_wins() -> None:
    roles = {"admin": ["a"], "operator": ["o"], "viewer": ["v", "v2"]}
    assert role_for(["v", "o"], roles) == "operator"
    assert role_for(["x", "a", "v"], roles) == "admin"
    assert role_for(["v2"], roles) == "viewer"
    assert role_for(["x"], roles) is None
    assert role_for([], roles) is None
