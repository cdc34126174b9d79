"""Request plumbing shared by the dashboard's pages and actions.

- `is_htmx`: the request was made by htmx (`HX-Request: true`): refreshes get
  the live fragment only, and changes are accepted only from htmx (see
  `htmx_required`).
- `portal_user`: the admin the portal logged in, when the request came
  through the API port's portal (None on the admin listener).
- `read_form`: a URL-encoded form body, size-limited.

Not guaranteed: multipart forms; the dashboard only sends URL-encoded ones.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from types import MappingProxyType

from starlette.requests import Request
from starlette.responses import Response

from llmgw.web.http import (
    PORTAL_USER,
    BodyTooLarge,
    PortalUser,
    is_form,
    parse_form,
    read_body,
)

# The model editor's text is the largest field; a model fits in far less.
FORM_LIMIT = 64 * 1024
# Pages above this are gzipped: the nodes page of 100 nodes is ~370 KB of
# repetitive markup, fetched again every few seconds, and ~25 KB gzipped.
COMPRESS_ABOVE = 4096

# Scripts, styles and requests from this origin only: the pages have no inline
# script or style. Frames are refused (no clickjacking of the drain buttons).
PAGE_HEADERS: Mapping[str, str] = MappingProxyType(
    {
        "content-security-policy": (
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        ),
        "x-frame-options": "DENY",
        "x-content-type-options": "nosniff",
        "referrer-policy": "same-origin",
        "cache-control": "no-store",
        # The same URL answers a whole page or a fragment, gzipped or not.
        "vary": "HX-Request, Accept-Encoding",
    }
)


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def htmx_required(request: Request) -> str | None:
    """Why a change request is refused, or None when it may go ahead.

    On the admin listener there is no session and so no CSRF token: what stops
    another site from making an operator's browser post here is that a
    cross-site form cannot set a header at all, and a cross-site `fetch` that
    sets one (`HX-Request`) needs a CORS preflight, which the admin app never
    answers with permission; the browser then does not send the POST. Through
    the portal the session's CSRF token has been checked as well.
    """
    if is_htmx(request):
        return None
    return (
        "changes are accepted only from the dashboard's own page (the request must carry "
        "the header HX-Request: true, which htmx sends); reload the page and try again, "
        "or use the admin API (/admin/api/...)"
    )


def compressed(request: Request, response: Response) -> Response:
    """`response` gzipped when it is large and the client takes gzip.

    Level 5: about 3 ms for the largest page, most of the size gain of level 9.
    """
    body = bytes(response.body)
    accepts = request.headers.get("accept-encoding", "")
    if len(body) < COMPRESS_ABOVE or "gzip" not in accepts.lower():
        return response
    packed = gzip.compress(body, compresslevel=5, mtime=0)
    headers = {k: v for k, v in response.headers.items() if k != "content-length"}
    headers["content-encoding"] = "gzip"
    return Response(packed, status_code=response.status_code, headers=headers)


def portal_user(request: Request) -> PortalUser | None:
    user = request.scope.get(PORTAL_USER)
    return user if isinstance(user, PortalUser) else None


async def read_form(request: Request) -> dict[str, str]:
    """The URL-encoded form's fields (first value of each); `BodyTooLarge` past the limit,
    an empty dict when the body is not a form."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    if not is_form(headers):
        return {}
    body = await read_body(request.receive, FORM_LIMIT)
    return parse_form(body)


__all__ = [
    "FORM_LIMIT",
    "PAGE_HEADERS",
    "BodyTooLarge",
    "compressed",
    "htmx_required",
    "is_htmx",
    "portal_user",
    "read_form",
]
