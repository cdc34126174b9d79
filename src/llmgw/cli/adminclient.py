"""What the admin-API commands (`llmgw nodes`, `llmgw models`, `llmgw status`) share.

Where the admin API is, and its key, each come from the first of: the flag
(`--admin`, `--admin-key`), the environment (LLMGW_ADMIN_URL,
LLMGW_ADMIN_KEY), the admin config file (`admin_url:`, `admin_key:` in
`--admin-config PATH`, LLMGW_ADMIN_CONFIG, or ~/.config/llmgw/admin.yaml when
it exists), then the default http://127.0.0.1:9090 without a key. A config
file that holds a key and that other users can read gets a warning.

`request` turns every failure into one `error: ...` line on stderr and an exit
code: 1 when the admin API cannot be reached or fails, 2 for bad input, an
unknown name or a request the API refuses (4xx). `call` raises `AdminError`
instead, for callers that poll and decide themselves. Imports only typer and
the standard library at the top; httpx and yaml are imported when used, so
`llmgw --help` stays fast.

Not guaranteed: retries. A request that times out is reported, not repeated
(a POST may have been applied; look before trying again).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

EXIT_UNREACHABLE = 1
EXIT_BAD_INPUT = 2
DEFAULT_ADMIN_URL = "http://127.0.0.1:9090"
HTTP_TIMEOUT_SECONDS = 10.0
CONFIG_FIELDS = ("admin_url", "admin_key")
# The admin listener's browser guard (llmgw.router.browser_guard) refuses with these.
BROWSER_GUARD_CODES = frozenset(
    {"host_not_allowed", "host_required", "cross_origin_request", "json_required"}
)

AdminOption = Annotated[
    str | None,
    typer.Option(
        "--admin",
        help="Base URL of the server's admin listener (reach a remote one by SSH tunnel). "
        "When not given: $LLMGW_ADMIN_URL, then admin_url in the admin config file, "
        f"then {DEFAULT_ADMIN_URL}.",
        show_default=False,
    ),
]
AdminKeyOption = Annotated[
    str | None,
    typer.Option(
        "--admin-key",
        help="An admin API key, needed only when the admin listener is not on loopback. "
        "When not given: $LLMGW_ADMIN_KEY, then admin_key in the admin config file.",
        show_default=False,
    ),
]
AdminConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--admin-config",
        envvar="LLMGW_ADMIN_CONFIG",
        help="YAML file with admin_url and admin_key (keep it chmod 600), read for what "
        "the flags and environment leave unset. Default: ~/.config/llmgw/admin.yaml "
        "when it exists.",
        show_default=False,
    ),
]
PollOption = Annotated[
    float,
    typer.Option("--poll-interval", min=0.01, hidden=True, help="Seconds between polls."),
]


@dataclass(frozen=True, slots=True)
class Admin:
    """Where the admin API is, its key, and where the address came from (for messages)."""

    url: str
    key: str | None
    source: str


class AdminError(Exception):
    """A request failed; `message` is for people, `code` the exit code it deserves."""

    def __init__(self, message: str, code: int, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


def fail(message: str, code: int) -> NoReturn:
    """Print `error: message` on stderr and exit with `code`."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def warn(message: str) -> None:
    typer.echo(f"warning: {message}", err=True)


# ---- where the admin API is ----


def default_config_path() -> Path:
    """~/.config/llmgw/admin.yaml, or under $XDG_CONFIG_HOME when that is set."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "llmgw" / "admin.yaml"


def resolve_admin(admin: str | None, admin_key: str | None, admin_config: Path | None) -> Admin:
    """The admin address and key: flag, then environment, then config file, then default."""
    url, source = admin, "--admin"
    if not url:
        url, source = os.environ.get("LLMGW_ADMIN_URL") or None, "LLMGW_ADMIN_URL"
    key = admin_key or os.environ.get("LLMGW_ADMIN_KEY") or None
    path = admin_config.expanduser() if admin_config is not None else None
    if path is None and (url is None or key is None):
        default = default_config_path()
        path = default if default.is_file() else None
    if path is not None:
        values = read_admin_config(path, explicit=admin_config is not None)
        if url is None and "admin_url" in values:
            url, source = values["admin_url"], f"admin_url in {path}"
        if key is None:
            key = values.get("admin_key")
    if url is None:
        url, source = DEFAULT_ADMIN_URL, "the default"
    if not url.startswith(("http://", "https://")):
        fail(f"{source} must be an http:// or https:// URL, got {url!r}", EXIT_BAD_INPUT)
    return Admin(url=url.rstrip("/"), key=key, source=source)


def read_admin_config(path: Path, *, explicit: bool) -> dict[str, str]:
    """`admin_url` and `admin_key` from a YAML file; `error: PATH: ...` (exit 2) when bad."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except FileNotFoundError:
        given = "given by --admin-config or LLMGW_ADMIN_CONFIG" if explicit else "default"
        fail(f"{path}: admin config file not found ({given})", EXIT_BAD_INPUT)
    except OSError as exc:
        fail(f"{path}: cannot read the admin config file: {exc.strerror}", EXIT_BAD_INPUT)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        fail(f"{path}: not valid YAML{where}: {problem}", EXIT_BAD_INPUT)
    if data is None:
        return {}
    if not isinstance(data, dict):
        fail(
            f"{path}: the admin config file must be a mapping with admin_url and admin_key, "
            f"not {type(data).__name__}",
            EXIT_BAD_INPUT,
        )
    values: dict[str, str] = {}
    for field, value in data.items():
        if field not in CONFIG_FIELDS:
            fail(
                f"{path}: unknown field {field!r}; the admin config file holds admin_url "
                "and admin_key",
                EXIT_BAD_INPUT,
            )
        if not isinstance(value, str) or not value.strip():
            fail(
                f"{path}: field {field!r} must be a non-empty string, got {value!r}",
                EXIT_BAD_INPUT,
            )
        values[field] = value.strip()
    url = values.get("admin_url")
    if url is not None and not url.startswith(("http://", "https://")):
        fail(
            f"{path}: field 'admin_url' must be an http:// or https:// URL, got {url!r}",
            EXIT_BAD_INPUT,
        )
    if "admin_key" in values and stat.S_IMODE(mode) & 0o077:
        warn(
            f"{path} holds an admin key but other users may read it (mode "
            f"{stat.S_IMODE(mode):04o}); run `chmod 600 {path}`"
        )
    return values


# ---- one request ----


def error_code(body: Any) -> str | None:
    """The code of an OpenAI-style error body, if any."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = body["error"].get("code")
        if isinstance(code, str):
            return code
    return None


def error_message(body: Any, fallback: str) -> str:
    """The message of an OpenAI-style error body, or `fallback`."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = body["error"].get("message")
        if isinstance(message, str) and message:
            return message
    return fallback


def call(
    method: str,
    admin: Admin,
    path: str,
    *,
    json_body: Any = None,
    prefix: str = "",
    timeout: float = HTTP_TIMEOUT_SECONDS,
) -> Any:
    """Call the admin API and return the decoded JSON answer; raises `AdminError`.

    A refusal with an error body (400, 404, 409) carries the API's own message,
    which says what to change, after `prefix` (e.g. the file the body came from).
    """
    import httpx

    url = admin.url + path
    headers = {"Authorization": f"Bearer {admin.key}"} if admin.key else {}
    if method.upper() not in ("GET", "HEAD"):
        # The admin API takes changes only as JSON, even with no body: a web page
        # cannot send that to it without the browser asking first.
        headers["Content-Type"] = "application/json"
    try:
        response = httpx.request(method, url, headers=headers, json=json_body, timeout=timeout)
    except httpx.InvalidURL as exc:
        raise AdminError(
            f"{admin.source} {admin.url!r} is not a usable URL: {exc}", EXIT_BAD_INPUT
        ) from exc
    except httpx.TimeoutException as exc:
        raise AdminError(
            f"the admin API at {admin.url} did not answer {method} {path} within {timeout:g} s "
            "(it may still have acted on it; look before trying again)",
            EXIT_UNREACHABLE,
        ) from exc
    except httpx.HTTPError as exc:
        raise AdminError(
            f"cannot reach the admin API at {admin.url} (from {admin.source}): "
            f"{str(exc) or type(exc).__name__}; is `llmgw server` running, and is that its admin "
            "listener? Set it with --admin, LLMGW_ADMIN_URL or admin_url in the admin "
            "config file",
            EXIT_UNREACHABLE,
        ) from exc
    return _decode(response, admin, url, prefix)


def _decode(response: Any, admin: Admin, url: str, prefix: str) -> Any:
    try:
        body = response.json()
    except ValueError:
        body = None
    status: int = response.status_code
    if status == 404:
        message = prefix + error_message(body, f"{url} was not found (HTTP 404)")
        raise AdminError(message, EXIT_BAD_INPUT, status=status)
    if status == 403 and error_code(body) in BROWSER_GUARD_CODES:
        # The server's own message says which setting to change; an admin key would not help.
        raise AdminError(
            f"the admin API refused the request: {error_message(body, 'HTTP 403')}",
            EXIT_UNREACHABLE,
            status=status,
        )
    if status == 403 and error_code(body) == "role_not_allowed":
        # The key is good; its role (which the message names) may not do this.
        raise AdminError(
            f"the admin API refused the request: {error_message(body, 'HTTP 403')}",
            EXIT_BAD_INPUT,
            status=status,
        )
    if status in (401, 403):
        raise AdminError(
            f"the admin API refused the request: {error_message(body, f'HTTP {status}')} "
            "(pass an admin key with --admin-key, LLMGW_ADMIN_KEY or admin_key in the admin "
            "config file, or use the admin listener from the server's own host)",
            EXIT_UNREACHABLE,
            status=status,
        )
    if 400 <= status < 500 and error_message(body, ""):
        raise AdminError(prefix + error_message(body, ""), EXIT_BAD_INPUT, status=status)
    if status >= 400 or body is None:
        raise AdminError(
            f"the admin API at {admin.url} answered HTTP {status}: "
            f"{error_message(body, response.text[:200] or 'no body')}",
            EXIT_UNREACHABLE if status >= 500 or body is None else EXIT_BAD_INPUT,
            status=status,
        )
    return body


def request(
    method: str,
    admin: Admin,
    path: str,
    *,
    json_body: Any = None,
    prefix: str = "",
    timeout: float = HTTP_TIMEOUT_SECONDS,
) -> Any:
    """`call`, with every failure turned into `error: ...` and its exit code."""
    try:
        return call(method, admin, path, json_body=json_body, prefix=prefix, timeout=timeout)
    except AdminError as exc:
        fail(exc.message, exc.code)
