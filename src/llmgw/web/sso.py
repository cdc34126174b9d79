"""The portal's single sign-on routes: off to the identity provider and back.

    GET /admin/oidc/login     starts a sign-in: 303 to the provider, with a cookie
                              binding the sign-in's state to this browser
    GET /admin/oidc/callback  the provider sends the browser back here with a code
                              and the state; on success a session cookie and a page
                              that continues to /admin/, else a page saying why

The binding cookie is SameSite=Lax, not Strict: the provider's redirect back
is a navigation that starts on another site, and a Strict cookie would not be
sent with it. The callback checks it against the `state` in the URL, so a
sign-in started in one browser cannot be finished in another (an attacker's
code pasted into a victim's browser). For the same reason the session cookie
(Strict, as for password logins) is set on a page that moves on to /admin/ by
itself: a redirect would still count as started by the provider's site, and
the browser would leave the new cookie out of that first request.

Not guaranteed: anything at the provider on logout (see `llmgw.auth.oidc`).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from urllib.parse import parse_qs

from starlette.responses import HTMLResponse, RedirectResponse, Response

from llmgw.auth import AdminSessions
from llmgw.auth.oidc import SingleSignOn, SsoError
from llmgw.web.http import NO_STORE, Scope, cookie_value
from llmgw.web.pages import signed_in_page, sso_failed_page

log = logging.getLogger("llmgw.web")

SSO_LOGIN = "/admin/oidc/login"
SSO_CALLBACK = "/admin/oidc/callback"
SSO_PREFIX = "/admin/oidc/"
FLOW_COOKIE = "llmgw_oidc"
FLOW_COOKIE_PATH = "/admin/oidc"
# Seconds a sign-in may take at the provider (typing a password, a second factor).
FLOW_MAX_AGE = 600
_MAX_PARAM = 4096


def _flow_cookie(value: str, *, max_age: int, secure: bool) -> str:
    parts = [
        f"{FLOW_COOKIE}={value}",
        "HttpOnly",
        "SameSite=Lax",
        f"Path={FLOW_COOKIE_PATH}",
        f"Max-Age={max_age}",
    ]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


class SsoRoutes:
    """The two routes above; the portal hands them every request under `SSO_PREFIX`."""

    def __init__(
        self,
        *,
        sso: SingleSignOn,
        sessions: AdminSessions,
        session_cookie: Callable[[str], str],
        secure_cookies: bool,
    ) -> None:
        self._sso = sso
        self._sessions = sessions
        self._session_cookie = session_cookie
        self._secure = secure_cookies

    async def handle(self, scope: Scope, headers: dict[str, str]) -> Response | None:
        """The answer for `scope`, or None when the path is not one of these routes."""
        path = scope["path"]
        if path not in (SSO_LOGIN, SSO_CALLBACK):
            return None
        if scope["method"] not in ("GET", "HEAD"):
            return sso_failed_page(f"{scope['method']} {path} is not allowed; use GET", 405)
        if path == SSO_LOGIN:
            return await self._begin(scope, headers)
        return await self._callback(scope, headers)

    def _redirect_uri(self, scope: Scope, headers: dict[str, str]) -> str:
        configured = self._sso.redirect_uri
        if configured is not None:
            return configured
        # The Host header has passed the browser guard (an allowed name or address).
        return f"{scope.get('scheme', 'http')}://{headers.get('host', '')}{SSO_CALLBACK}"

    async def _begin(self, scope: Scope, headers: dict[str, str]) -> Response:
        try:
            started = await self._sso.begin(self._redirect_uri(scope, headers))
        except SsoError as exc:
            log.warning("single sign-on cannot start: %s", exc.message)
            return sso_failed_page(exc.message, exc.status)
        response = RedirectResponse(started.url, status_code=303, headers=NO_STORE)
        response.headers.append(
            "set-cookie", _flow_cookie(started.state, max_age=FLOW_MAX_AGE, secure=self._secure)
        )
        return response

    async def _callback(self, scope: Scope, headers: dict[str, str]) -> Response:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        params = {name: values[0][:_MAX_PARAM] for name, values in query.items()}
        error = params.get("error")
        if error is not None:
            detail = params.get("error_description") or "no description"
            return self._refused(
                f"the identity provider did not sign you in ({error}: {detail})", 403
            )
        state, code = params.get("state"), params.get("code")
        if not state or not code:
            return self._refused(
                "this sign-in answer has no state or code; start again from the login page", 400
            )
        bound = cookie_value(headers, FLOW_COOKIE)
        if bound is None or not hmac.compare_digest(bound.encode(), state.encode()):
            return self._refused(
                "this sign-in was not started in this browser (its state does not match this "
                "browser's sign-in cookie); start again from the login page",
                400,
            )
        try:
            user = await self._sso.finish(state=state, code=code)
        except SsoError as exc:
            log.warning("single sign-on refused: %s", exc.message)
            return self._refused(exc.message, exc.status)
        token, logged_in = await self._sessions.start(user)
        log.info("single sign-on: %s logged in as %s", user.name, user.admin_role)
        response = signed_in_page(logged_in.user.name)
        response.headers.append("set-cookie", self._session_cookie(token))
        response.headers.append("set-cookie", _flow_cookie("", max_age=0, secure=self._secure))
        return response

    def _refused(self, message: str, status: int) -> HTMLResponse:
        response = sso_failed_page(message, status)
        response.headers.append("set-cookie", _flow_cookie("", max_age=0, secure=self._secure))
        return response
