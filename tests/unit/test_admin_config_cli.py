"""Where admin commands find the admin API and its key: flag, environment, config file, default.

Against a real admin server on loopback that records each request's
Authorization header, so the key actually sent is what is checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from admin_cli_server import AdminServer, clean_env, serve, unused_url
from test_inventory_state import VirtualClock, registration
from typer.testing import CliRunner

from llmgw.cli.adminclient import DEFAULT_ADMIN_URL, resolve_admin
from llmgw.cli.main import app
from llmgw.control.inventory import Inventory


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AdminServer]:
    clock = VirtualClock()
    inventory = Inventory(
        clock=clock, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    inventory.register(registration("node-a"))
    with serve(tmp_path, inventory=inventory) as running:
        yield running


def default_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "xdg" / "llmgw" / "admin.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def run(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={**clean_env(tmp_path), **env})
    return result.exit_code, result.stdout, result.stderr


def listed(out: str) -> list[str]:
    return [node["id"] for node in json.loads(out)]


def test_the_address_comes_from_the_flag_then_the_environment_then_the_file(
    server: AdminServer, tmp_path: Path
) -> None:
    gone = unused_url()
    path = default_file(tmp_path, f"admin_url: {server.url}\n")
    code, out, err = run(tmp_path, "nodes", "list", "--json")
    assert (code, err, listed(out)) == (0, "", ["node-a"])

    code, out, err = run(tmp_path, "nodes", "list", "--json", LLMGW_ADMIN_URL=gone)
    assert code == 1 and out == ""
    assert err.startswith(f"error: cannot reach the admin API at {gone} (from LLMGW_ADMIN_URL)")

    code, out, err = run(
        tmp_path, "nodes", "list", "--json", "--admin", server.url, LLMGW_ADMIN_URL=gone
    )
    assert (code, err, listed(out)) == (0, "", ["node-a"])

    path.write_text(f"admin_url: {gone}/\n")
    code, _, err = run(tmp_path, "status")
    assert code == 1
    assert err.startswith(f"error: cannot reach the admin API at {gone} (from admin_url in {path})")


def test_without_flag_environment_or_file_the_default_is_loopback_9090(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in clean_env(tmp_path).items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    admin = resolve_admin(None, None, None)
    assert (admin.url, admin.key, admin.source) == (DEFAULT_ADMIN_URL, None, "the default")


def test_the_key_comes_from_the_flag_then_the_environment_then_the_file(
    server: AdminServer, tmp_path: Path
) -> None:
    sent = server.authorization
    run(tmp_path, "nodes", "list", "--admin", server.url)
    assert sent[-1] is None
    default_file(tmp_path, "admin_key: file-key\n")
    run(tmp_path, "nodes", "list", "--admin", server.url)
    assert sent[-1] == "Bearer file-key"
    run(tmp_path, "nodes", "list", "--admin", server.url, LLMGW_ADMIN_KEY="env-key")
    assert sent[-1] == "Bearer env-key"
    run(
        tmp_path,
        "nodes",
        "list",
        "--admin",
        server.url,
        "--admin-key",
        "flag-key",
        LLMGW_ADMIN_KEY="env-key",
    )
    assert sent[-1] == "Bearer flag-key"


def test_a_config_file_named_by_flag_or_environment(server: AdminServer, tmp_path: Path) -> None:
    path = tmp_path / "ops.yaml"
    path.write_text(f"admin_url: {server.url}\nadmin_key: ops-key\n")
    path.chmod(0o600)
    code, out, err = run(tmp_path, "nodes", "list", "--json", "--admin-config", str(path))
    assert (code, err, listed(out)) == (0, "", ["node-a"])
    assert server.authorization[-1] == "Bearer ops-key"
    code, out, err = run(tmp_path, "nodes", "list", "--json", LLMGW_ADMIN_CONFIG=str(path))
    assert (code, err, listed(out)) == (0, "", ["node-a"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("admin_url: [unclosed\n", "not valid YAML (line 2, column 1)"),
        ("- http://127.0.0.1:9090\n", "the admin config file must be a mapping"),
        ("admin_ur: http://127.0.0.1:9090\n", "unknown field 'admin_ur'"),
        ("admin_url: 9090\n", "field 'admin_url' must be a non-empty string, got 9090"),
        (
            "admin_url: ftp://gw:9090\n",
            "field 'admin_url' must be an http:// or https:// URL, got 'ftp://gw:9090'",
        ),
        ("admin_key: ''\n", "field 'admin_key' must be a non-empty string, got ''"),
    ],
)
def test_a_bad_config_file_is_one_error_naming_the_file_and_field(
    tmp_path: Path, content: str, message: str
) -> None:
    path = default_file(tmp_path, content)
    code, out, err = run(tmp_path, "status")
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {path}: {message}")
    assert err.count("\n") == 1


def test_a_missing_named_config_file_and_a_bad_address_are_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    code, _, err = run(tmp_path, "nodes", "list", "--admin-config", str(missing))
    assert code == 2
    assert err == (
        f"error: {missing}: admin config file not found (given by --admin-config or "
        "LLMGW_ADMIN_CONFIG)\n"
    )
    code, _, err = run(tmp_path, "status", LLMGW_ADMIN_URL="127.0.0.1:9090")
    assert code == 2
    assert (
        err == "error: LLMGW_ADMIN_URL must be an http:// or https:// URL, got '127.0.0.1:9090'\n"
    )


def test_a_key_file_others_can_read_gets_a_warning(server: AdminServer, tmp_path: Path) -> None:
    path = default_file(tmp_path, f"admin_url: {server.url}\nadmin_key: k\n", mode=0o644)
    code, out, err = run(tmp_path, "nodes", "list", "--json")
    assert code == 0 and listed(out) == ["node-a"]
    assert err == (
        f"warning: {path} holds an admin key but other users may read it (mode 0644); "
        f"run `chmod 600 {path}`\n"
    )
    path.chmod(0o600)
    assert run(tmp_path, "nodes", "list", "--json")[2] == ""
    # No key, nothing to protect.
    path.write_text(f"admin_url: {server.url}\n")
    path.chmod(0o644)
    assert run(tmp_path, "nodes", "list", "--json")[2] == ""


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["nodes", "list"],
        ["nodes", "show"],
        ["nodes", "drain"],
        ["nodes", "undrain"],
        ["nodes", "remove-weights"],
        ["models", "list"],
        ["models", "show"],
        ["models", "add"],
        ["models", "remove"],
        ["models", "explain"],
        ["models", "activate"],
    ],
)
def test_every_admin_command_takes_json_and_the_admin_options(
    tmp_path: Path, command: list[str]
) -> None:
    code, out, _ = run(tmp_path, *command, "--help")
    assert code == 0
    for option in ("--json", "--admin ", "--admin-key", "--admin-config"):
        assert option in out, (command, option)
