"""What no web page may make a browser do to the admin surfaces: the browser guard.

The admin listener treats loopback clients as administrators, and `/admin` on
the API port trusts a session cookie. A page the operator opens can make the
browser send requests to either: a `text/plain`, form or body-less POST needs
no CORS preflight, and with DNS rebinding (a name the page's author controls,
re-pointed at 127.0.0.1) the page's own origin *is* the listener, so it can
read the answers as well. `BrowserGuard` wraps such an app and answers 403
with an OpenAI-shaped error naming the reason, before the app sees the request:

- **Host** (every request, except the paths in `host_exempt`): the `Host`
  header must name an IP address (127.0.0.1, [::1], 10.0.0.5), `localhost`, or
  one of `allowed_hosts` (the listener's own names and `admin.allowed_hosts`).
  A rebinding page's requests carry a name its author controls, which is none
  of these; an address cannot be rebound (a page at an address has that
  address as its origin, and the Origin rule applies).
- **Origin** (state-changing requests, POST/PUT/PATCH/DELETE, and the reads in
  `secret_reads`): `Origin`, when sent, must be the request's own origin
  (scheme, host and port; an `https` page in front of a plain-HTTP listener is
  the one allowance, for a reverse proxy that terminates TLS), and
  `Sec-Fetch-Site`, when sent, must be `same-origin` or `none` (typed by the
  user).
- **Content type** (state-changing requests, except the paths in
  `form_paths`): `Content-Type: application/json`, or the dashboard's htmx
  request (`HX-Request: true`). A page of another origin can send neither
  without a CORS preflight, which these apps never grant.

Each rule is a `Check` (request facts in, `Refusal` or None out), run in the
order above; the first refusal answers and is logged at warning with the
client's address. Requests without a browser (the CLI, curl, Prometheus) pass
as long as they name an allowed host and, for changes, send JSON.

Not guaranteed: anything against a client that is not a browser (it can set
any header; loopback or the admin key is the line there), nor behind a reverse
proxy that rewrites `Host` or `Origin` (pass the original `Host` on, and add
the public name to `admin.allowed_hosts`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any, Protocol
from urllib.parse import urlsplit

from starlette.responses import Response

from llmgw.router.errors import error_body

log = logging.getLogger("llmgw.admin")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON_TYPE = "application/json"
SAME_ORIGIN_FETCH_SITES = frozenset({"same-origin", "none"})
SETTING = "admin.allowed_hosts in the server's config file (or --admin-allowed-host NAME)"
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the checks look at, read once from the ASGI scope."""

    method: str
    path: str
    scheme: str
    headers: Mapping[str, str]
    client: str

    @classmethod
    def from_scope(cls, scope: Scope) -> RequestFacts:
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope.get("headers", ()):
            headers[raw_name.decode("latin-1").lower()] = raw_value.decode("latin-1")
        client = scope.get("client")
        return cls(
            method=str(scope.get("method", "GET")).upper(),
            path=str(scope.get("path", "")),
            scheme=str(scope.get("scheme", "http")),
            headers=headers,
            client=str(client[0]) if client else "unknown",
        )

    @property
    def changes_state(self) -> bool:
        return self.method in UNSAFE_METHODS


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: an error `code` and a message saying what to do."""

    code: str
    message: str


class Check(Protocol):
    def __call__(self, facts: RequestFacts, /) -> Refusal | None: ...


def split_host(value: str) -> tuple[str, int | None]:
    """A `Host` header (or an origin's netloc) as (lower-case name, port or None).

    IPv6 literals lose their brackets; a trailing dot is dropped (`localhost.`
    names the same host as `localhost`). ValueError when it is not host[:port].
    """
    text = value.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(value)
        name, rest = text[1:end], text[end + 1 :]
    else:
        name, sep, port_text = text.partition(":")
        rest = f":{port_text}" if sep else ""
    port: int | None = None
    if rest:
        if not rest.startswith(":") or not rest[1:].isdigit():
            raise ValueError(value)
        port = int(rest[1:])
    name = name.rstrip(".")
    if not name:
        raise ValueError(value)
    return name, port


def _needs_no_name(name: str) -> bool:
    """`localhost`, or an IP address: a rebinding page's requests always carry a
    name its author controls, never an address (its origin would be that address)."""
    if name == "localhost":
        return True
    try:
        ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class HostCheck:
    """The DNS rebinding defence: `Host` must be an address, localhost or an allowed name."""

    allowed: frozenset[str]
    surface: str
    exempt: frozenset[str]

    def __call__(self, facts: RequestFacts, /) -> Refusal | None:
        if facts.path in self.exempt:
            return None
        raw = facts.headers.get("host")
        if not raw:
            return Refusal(
                "host_required",
                f"the request has no Host header; {self.surface} needs one naming this "
                f"server (its address, localhost, or a name in {SETTING})",
            )
        try:
            name, _ = split_host(raw)
        except ValueError:
            return Refusal("host_not_allowed", f"Host {raw!r} is not a host name or address")
        if _needs_no_name(name) or name in self.allowed:
            return None
        return Refusal(
            "host_not_allowed",
            f"Host {raw!r} is not allowed on {self.surface}: add {name!r} to {SETTING} if "
            "that is this server's name. Only IP addresses, localhost, the listener's own "
            "names and configured names are accepted, so that a web page cannot reach this "
            "listener through a name of its own (DNS rebinding)",
        )


def _origin_matches(origin: str, facts: RequestFacts) -> bool:
    parts = urlsplit(origin)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.netloc:
        return False
    # A TLS-terminating proxy in front of a plain-HTTP listener: the page is
    # https, the listener sees http. The reverse (an http page driving an https
    # listener) is a downgrade and refused.
    if scheme != facts.scheme and not (scheme == "https" and facts.scheme == "http"):
        return False
    try:
        origin_name, origin_port = split_host(parts.netloc)
        own_name, own_port = split_host(facts.headers.get("host", ""))
    except ValueError:
        return False
    # A port left out is the default of the scheme the browser used, in the
    # Origin and in the Host header alike.
    default = _DEFAULT_PORTS[scheme]
    return origin_name == own_name and (origin_port or default) == (own_port or default)


@dataclass(frozen=True, slots=True)
class OriginCheck:
    """Changes and secret reads only from this origin's own pages (or from no page)."""

    surface: str
    secret_reads: frozenset[str]

    def __call__(self, facts: RequestFacts, /) -> Refusal | None:
        reads_secret = facts.method in ("GET", "HEAD") and facts.path in self.secret_reads
        if not (facts.changes_state or reads_secret):
            return None
        what = f"{facts.method} {facts.path}"
        fetch_site = facts.headers.get("sec-fetch-site")
        if fetch_site is not None and fetch_site.lower() not in SAME_ORIGIN_FETCH_SITES:
            return Refusal(
                "cross_origin_request",
                f"{what} came from another site's page (Sec-Fetch-Site: {fetch_site}): "
                f"{self.surface} takes changes only from its own dashboard or from clients "
                "that are not browsers (the llmgw CLI, curl)",
            )
        origin = facts.headers.get("origin")
        if origin is not None and not _origin_matches(origin, facts):
            own = f"{facts.scheme}://{facts.headers.get('host', '')}"
            return Refusal(
                "cross_origin_request",
                f"{what} came from a page of another origin (Origin: {origin}; this is "
                f"{own}): {self.surface} takes changes only from its own dashboard or from "
                "clients that are not browsers (the llmgw CLI, curl)",
            )
        return None


@dataclass(frozen=True, slots=True)
class ContentTypeCheck:
    """Changes only as JSON, or as the dashboard's htmx request."""

    form_paths: frozenset[str]

    def __call__(self, facts: RequestFacts, /) -> Refusal | None:
        if not facts.changes_state or facts.path in self.form_paths:
            return None
        if facts.headers.get("hx-request") == "true":
            return None
        sent = facts.headers.get("content-type")
        if sent is not None and sent.split(";")[0].strip().lower() == JSON_TYPE:
            return None
        got = f"got {sent!r}" if sent is not None else "none was sent"
        return Refusal(
            "json_required",
            f"{facts.method} {facts.path} needs Content-Type: {JSON_TYPE} ({got}), even "
            "with an empty body; the dashboard's own buttons and forms send HX-Request: "
            "true instead. Requests any web page could send without a CORS preflight are "
            "refused, so that no page can drive the admin API",
        )


class BrowserGuard:
    """ASGI middleware: runs `checks` on every HTTP request; the first refusal answers 403."""

    def __init__(self, app: ASGIApp, *, checks: Sequence[Check], surface: str) -> None:
        self._app = app
        self._checks = tuple(checks)
        self._surface = surface

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        facts = RequestFacts.from_scope(scope)
        for check in self._checks:
            refusal = check(facts)
            if refusal is not None:
                log.warning(
                    "refused %s %s from %s on %s: %s",
                    facts.method,
                    facts.path,
                    facts.client,
                    self._surface,
                    refusal.message,
                )
                response = Response(
                    error_body(refusal.message, "permission_error", refusal.code),
                    status_code=403,
                    media_type="application/json",
                    headers={"cache-control": "no-store"},
                )
                await response(scope, receive, send)
                return
        await self._app(scope, receive, send)


def browser_guard(
    app: ASGIApp,
    *,
    surface: str,
    allowed_hosts: Iterable[str],
    host_exempt: Iterable[str] = (),
    form_paths: Iterable[str] = (),
    secret_reads: Iterable[str] = (),
) -> BrowserGuard:
    """`app` behind the three rules, for `surface` ("the admin listener", ...).

    `allowed_hosts` are names (lower case, no port) accepted in `Host` besides
    IP addresses and localhost; `host_exempt` paths skip the Host rule (liveness
    probes that reveal nothing); `form_paths` skip the content-type rule (forms
    that check their origin and CSRF token themselves); `secret_reads` are GET
    paths whose answer holds a secret, held to the Origin rule like changes.
    """
    return BrowserGuard(
        app,
        checks=(
            HostCheck(
                allowed=frozenset(h.lower() for h in allowed_hosts),
                surface=surface,
                exempt=frozenset(host_exempt),
            ),
            OriginCheck(surface=surface, secret_reads=frozenset(secret_reads)),
            ContentTypeCheck(form_paths=frozenset(form_paths)),
        ),
        surface=surface,
    )
