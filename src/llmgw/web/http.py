"""HTTP pieces the admin portal needs: ASGI types, error bodies, cookies, origins, bodies.

Error bodies have the OpenAI shape (`{"error": {"message", "type", "param",
"code"}}`) like everywhere else in llmgw; this package sits beside the router
in the layers and does not borrow the router's helper.

Not guaranteed: general-purpose cookie or form handling; these helpers know the
one cookie and the few form fields the portal uses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
from starlette.responses import Response

from llmgw.store import AdminRole

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SESSION_COOKIE = "llmgw_session"
# The ASGI scope key under which the portal hands the logged-in admin to the
# admin app. Set by the server-side portal only; no header can forge it.
PORTAL_USER = "llmgw.portal_user"
COOKIE_PATH = "/admin"
FORM_TYPE = "application/x-www-form-urlencoded"
# Pages and answers that carry a session's details must not be kept by caches.
NO_STORE: Mapping[str, str] = MappingProxyType({"cache-control": "no-store"})


@dataclass(frozen=True, slots=True)
class PortalUser:
    """The user a request came through the portal for, their session's CSRF token and
    their role."""

    name: str
    csrf_token: str
    role: AdminRole | None = None


class BodyTooLarge(Exception):
    """The request body is over the portal's limit."""


def error_response(
    status: int,
    message: str,
    type_: str,
    code: str,
    *,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """An OpenAI-shaped JSON error."""
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return Response(
        orjson.dumps(body),
        status_code=status,
        media_type="application/json",
        headers={**NO_STORE, **(headers or {})},
    )


def json_response(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json", headers=NO_STORE)


def session_cookie(token: str, *, max_age: int, secure: bool) -> str:
    """The Set-Cookie value for a session.

    HttpOnly: page scripts cannot read it (an injected script cannot steal it).
    SameSite=Strict: the browser sends it only on requests that start on this
    site, so another site cannot make the browser act with it. Path=/admin: the
    /v1 API never sees it. Secure under TLS: never sent over plain HTTP.
    """
    parts = [
        f"{SESSION_COOKIE}={token}",
        "HttpOnly",
        "SameSite=Strict",
        f"Path={COOKIE_PATH}",
        f"Max-Age={max_age}",
    ]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def cleared_cookie(*, secure: bool) -> str:
    """The Set-Cookie value that makes the browser forget the session cookie."""
    return session_cookie("", max_age=0, secure=secure)


def cookie_value(headers: Mapping[str, str], name: str) -> str | None:
    """The value of cookie `name` in the request's Cookie header, if any."""
    for part in headers.get("cookie", "").split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value.strip().strip('"')
    return None


def same_origin(headers: Mapping[str, str]) -> bool:
    """Whether a state-changing request comes from a page of this site.

    Browsers send `Origin` with every cross-site POST (and `Referer` unless told
    not to). A request with neither did not come from another site's page in a
    modern browser (curl, scripts), so it is let through; a request naming
    another origin, or the opaque "null" origin, is not. Compared with `Host`:
    a reverse proxy in front must pass the original Host header on.
    """
    host = headers.get("host", "").lower()
    origin = headers.get("origin")
    if origin is not None:
        return origin != "null" and urlsplit(origin).netloc.lower() == host
    referer = headers.get("referer")
    if referer is not None:
        return urlsplit(referer).netloc.lower() == host
    return True


def wants_html(scope: Scope, headers: Mapping[str, str]) -> bool:
    """A browser navigating (GET or HEAD and Accept: text/html), not an API client."""
    return scope["method"] in ("GET", "HEAD") and "text/html" in headers.get("accept", "")


def is_form(headers: Mapping[str, str]) -> bool:
    return headers.get("content-type", "").split(";")[0].strip().lower() == FORM_TYPE


def parse_form(body: bytes) -> dict[str, str]:
    """The first value of each field of a URL-encoded form body."""
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; `BodyTooLarge` past `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands over `body` (already read) first, then the original's."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def header_map(scope: Scope) -> dict[str, str]:
    """The request headers by lower-case name: repeated Cookie headers (HTTP/2 sends
    one per cookie) are joined, otherwise the last of repeated ones wins."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        if name == "cookie" and name in headers:
            value = headers[name] + "; " + value
        headers[name] = value
    return headers
