"""Reading the server config from a YAML file and from command-line flags.

Errors name the file (or the flag), the field path and the problem, e.g.
`llmgw.yaml: endpoints[0].url: 'localhost:8000' is not an http:// or https:// URL`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from llmgw.config.errors import ConfigError
from llmgw.config.server import EndpointConfig, ListenAddress, ServerConfig, split_host_port


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def describe_validation_error(source: str, exc: ValidationError) -> str:
    """One line per problem: `source: field.path: message`."""
    lines = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field (check its spelling and where it is nested)"
        lines.append(f"{source}: {_field_path(tuple(error['loc']))}: {message}")
    return "\n".join(lines)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file; ConfigError naming the file otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: config file not found") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of settings")
    return data


def load_server_config(path: Path | None, overrides: dict[str, Any]) -> ServerConfig:
    """The file's settings with `overrides` (from flags, already parsed) laid on top.

    `overrides` may hold `listen`, `admin_listen`, `metrics_listen`, `data_dir`,
    `store`, `insecure_agents`, `cluster_key_file`, `auth_mode`, `header_timeout`,
    `body_timeout`, `max_connections` (the `server:` section), `extra_endpoints`
    (appended to the file's endpoints) and
    `admin_allowed_hosts` (appended to the file's `admin.allowed_hosts`).
    """
    data: dict[str, Any] = read_yaml_mapping(path) if path is not None else {}
    source = str(path) if path is not None else "command line"
    try:
        file_config = ServerConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(source, exc)) from exc
    merged = file_config.model_dump()
    for key in (
        "listen",
        "admin_listen",
        "metrics_listen",
        "agent_listen",
        "data_dir",
        "store",
        "insecure_agents",
    ):
        if key in overrides:
            merged[key] = overrides[key]
    if "cluster_key_file" in overrides:
        merged["control"]["cluster_key_file"] = overrides["cluster_key_file"]
    if "auth_mode" in overrides:
        merged["auth"]["mode"] = overrides["auth_mode"]
    for key in ("header_timeout", "body_timeout", "max_connections"):
        if key in overrides:
            merged["server"][key] = overrides[key]
    merged["endpoints"] = [*merged["endpoints"], *overrides.get("extra_endpoints", [])]
    merged["admin"]["allowed_hosts"] = [
        *merged["admin"]["allowed_hosts"],
        *overrides.get("admin_allowed_hosts", []),
    ]
    try:
        return ServerConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(f"{source} and flags", exc)) from exc


def parse_endpoint_flag(text: str) -> dict[str, Any]:
    """`--endpoint id=URL=model[,model]` as endpoint fields."""
    endpoint_id, sep, rest = text.partition("=")
    url, sep2, models = rest.rpartition("=")
    if not sep or not sep2 or not endpoint_id or not url or not models:
        raise ConfigError(
            f"--endpoint {text!r}: expected ID=URL=MODEL[,MODEL...], "
            "for example gpu1=http://10.0.0.5:8000=llama-3-8b"
        )
    fields = {"id": endpoint_id, "url": url, "models": [m.strip() for m in models.split(",")]}
    try:
        return EndpointConfig.model_validate(fields).model_dump()
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(f"--endpoint {text!r}", exc)) from exc


def parse_listen(flag: str, text: str) -> dict[str, Any]:
    """`--listen HOST:PORT` as listen-address fields."""
    try:
        return ListenAddress.model_validate(split_host_port(text)).model_dump()
    except (ValueError, ValidationError) as exc:
        detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise ConfigError(f"{flag} {text!r}: {detail}") from exc
