"""Config errors name the file (or flag), the field and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.config import ConfigError, load_server_config, parse_endpoint_flag, parse_listen


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "llmgw.yaml"
    path.write_text(text)
    return path


def test_file_and_flags_are_merged(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
listen: 127.0.0.1:7000
endpoints:
  - {id: a, url: "http://10.0.0.1:8000/", models: [m1]}
router:
  attempts: 2
  timeouts: {first_byte: 9}
""",
    )
    extra = parse_endpoint_flag("b=http://10.0.0.2:8000=m1,m2")
    cfg = load_server_config(
        path,
        {"extra_endpoints": [extra], "admin_listen": parse_listen("--admin-listen", "[::1]:9999")},
    )
    assert str(cfg.listen) == "127.0.0.1:7000"
    assert (cfg.admin_listen.host, cfg.admin_listen.port) == ("::1", 9999)
    assert [e.id for e in cfg.endpoints] == ["a", "b"]
    assert cfg.endpoints[0].url == "http://10.0.0.1:8000"
    assert cfg.endpoints[1].models == ["m1", "m2"]
    assert cfg.router.attempts == 2 and cfg.router.timeouts.first_byte == 9
    assert cfg.metrics_listen is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "endpoints:\n  - {id: a, url: 'localhost:8000', models: [m]}\n",
            "endpoints[0].url: 'localhost:8000' is not an http",
        ),
        (
            "endpoints:\n  - {id: a, url: 'http://h', models: []}\n",
            "endpoints[0].models: List should have at least 1 item",
        ),
        ("endpoints:\n  - {id: a, url: 'http://h'}\n", "endpoints[0].models: Field required"),
        ("router:\n  attempts: 0\n", "router.attempts: Input should be greater than or equal to 1"),
        (
            "router:\n  timeouts: {idle: -1}\n",
            "router.timeouts.idle: Input should be greater than 0",
        ),
        ("routr:\n  attempts: 2\n", "routr: unknown field"),
        ("listen: nonsense\n", "listen: "),
        (
            "endpoints:\n  - {id: a, url: 'http://h', models: [m]}\n  - {id: a, url: 'http://i', models: [m]}\n",
            "endpoint id 'a' is used twice",
        ),
        ("- just\n- a list\n", "the top level must be a mapping"),
        ("endpoints: [\n", "not valid YAML (line"),
    ],
)
def test_errors_name_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_server_config(path, {})
    message = str(info.value)
    assert message.startswith(str(path))
    assert expected in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_server_config(tmp_path / "nope.yaml", {})


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("a=http://h", "expected ID=URL=MODEL"),
        ("http://h=m", "expected ID=URL=MODEL"),
        ("a b=http://h=m", "id: must be 1-63 letters"),
        ("a=ftp://h=m", "is not an http:// or https:// URL"),
        ("a=http://h=m,,x", "is empty"),
        # No request could name these: the router refuses such a `model`.
        ("a=http://h=" + "m" * 257, "is not 1 to 256 printable characters"),
        ("a=http://h=m\tx", "is not 1 to 256 printable characters"),
    ],
)
def test_endpoint_flag_errors(flag: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_endpoint_flag(flag)
    assert str(info.value).startswith("--endpoint")
    assert expected in str(info.value)


@pytest.mark.parametrize("text", ["8080", "host:", ":80", "host:port", "h:70000"])
def test_listen_flag_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="--listen"):
        parse_listen("--listen", text)


def test_listener_limits_come_from_the_file_and_flags_win(tmp_path: Path) -> None:
    path = write(tmp_path, "server: {header_timeout: 4, body_timeout: 12, max_connections: 50}\n")
    cfg = load_server_config(path, {})
    assert (cfg.server.header_timeout, cfg.server.body_timeout) == (4, 12)
    assert cfg.server.max_connections == 50
    flagged = load_server_config(path, {"max_connections": 7, "header_timeout": 2.5})
    assert (flagged.server.header_timeout, flagged.server.max_connections) == (2.5, 7)
    assert flagged.server.body_timeout == 12
    defaults = load_server_config(None, {})
    assert (defaults.server.header_timeout, defaults.server.body_timeout) == (10, 30)


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [
        ("server: {header_timeout: 0}\n", {}, "server.header_timeout: Input should be greater"),
        ("server: {body_timeout: -1}\n", {}, "server.body_timeout: Input should be greater"),
        ("server: {max_connections: 0}\n", {}, "server.max_connections: Input should be greater"),
        ("server: {max_connections: many}\n", {}, "server.max_connections: Input should be"),
        ("server: {read_timeout: 5}\n", {}, "server.read_timeout: unknown field"),
        ("", {"body_timeout": 0}, "and flags: server.body_timeout: Input should be greater"),
    ],
)
def test_listener_limit_errors_name_the_field(
    tmp_path: Path, text: str, overrides: dict[str, object], expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_server_config(path, overrides)
    assert str(info.value).startswith(str(path))
    assert expected in str(info.value)


def test_the_servers_agent_pings_can_be_turned_off_or_spaced(tmp_path: Path) -> None:
    assert load_server_config(None, {}).control.agent_ping_interval is not None
    off = load_server_config(write(tmp_path, "control: {agent_ping_interval: null}\n"), {})
    assert off.control.agent_ping_interval is None
    spaced = load_server_config(write(tmp_path, "control: {agent_ping_interval: 120}\n"), {})
    assert spaced.control.agent_ping_interval == 120
    path = write(tmp_path, "control: {agent_ping_interval: 0}\n")
    with pytest.raises(ConfigError) as info:
        load_server_config(path, {})
    assert str(info.value).startswith(str(path))
    assert "control.agent_ping_interval: Input should be greater" in str(info.value)
