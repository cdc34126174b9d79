"""The admin pages on the API port: a login in front of the admin API.

The admin listener (loopback) serves the admin API, `/metrics` and debug
endpoints to whoever reaches it. On the client-facing port only this portal
answers under `/admin`, and only to logged-in users with an admin role, each
held to what the role may do (`llmgw.auth.roles`):

    GET  /admin/login        the login form
    POST /admin/login        username + password -> session cookie, 303 to /admin/
    POST /admin/logout       ends the session (CSRF-checked), 303 to /admin/login
    GET  /admin/api/session  who is logged in, and the CSRF token (any user)
    GET  /admin/oidc/...     single sign-on, when configured (`llmgw.web.sso`)
    *    /admin/api/...      passed unchanged to the admin app (by role, CSRF-checked)
    *    /admin/, dashboard  the dashboard's pages, actions and static files
                             (`llmgw.web.dashboard.is_dashboard_path`), likewise

Requests passed on carry the logged-in user, their role and the session's CSRF
token in the ASGI scope (`PORTAL_USER`, `ROLE_SCOPE_KEY`), so the dashboard can
show who is logged in and what their role may do, and put the token into its
pages for htmx to send back. Nothing else of the admin app (its `/metrics`,
`/healthz`, `/readyz`, debug paths) is reachable through here. A request
without a valid session gets a 303 to the login page (browsers), a 401 with
`HX-Redirect` to it (the dashboard's own refreshes, so a page whose session
ended goes to the login), or a 401 (API clients); a user without an admin role
gets 403 and no cluster data, and a user whose role may not do what is asked
gets 403 naming the role. A user without the role may still reach their own
team's keys and usage under `/admin/api/teams/T/`, and its page `/admin/teams/T`,
when their team role allows it (`llmgw.auth.teams`; `teams`), and the dashboard's
static files. POST, PUT, PATCH and DELETE need the session's CSRF
token in `X-CSRF-Token` (or a `csrf_token` form field); the cookie alone, which
a browser attaches by itself, is never enough.

With `local_login` off the password form is gone and a posted password is
refused (403): only single sign-on opens a session.

Repeated failed logins slow the answers down (`LoginThrottle`); the wait is
injected (`sleep`) so tests do not wait for real. Passwords are checked in the
logins' own small thread pool (`Passwords`); when too many wait for it, a
login is answered 503 with Retry-After.

Not guaranteed: throttling across router processes (each counts alone), or
protection for a deployment whose reverse proxy rewrites the Host header (the
login's Origin check compares against it).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from html import escape

from starlette.responses import HTMLResponse, RedirectResponse, Response

from llmgw.auth import (
    ROLE_SCOPE_KEY,
    USER_SCOPE_KEY,
    AdminSessions,
    LoggedIn,
    LoginFailed,
    LoginThrottle,
    Passwords,
    PasswordsBusy,
    TeamAccess,
    may,
    refusal,
    team_path,
)
from llmgw.auth.oidc import SingleSignOn
from llmgw.store import SessionRepository, StoreError, UserRepository
from llmgw.web.dashboard import is_dashboard_path
from llmgw.web.http import (
    NO_STORE,
    PORTAL_USER,
    SESSION_COOKIE,
    ASGIApp,
    BodyTooLarge,
    PortalUser,
    Receive,
    Scope,
    Send,
    cleared_cookie,
    cookie_value,
    error_response,
    header_map,
    is_form,
    json_response,
    parse_form,
    read_body,
    replay,
    same_origin,
    session_cookie,
    wants_html,
)
from llmgw.web.pages import forbidden_page, login_page
from llmgw.web.sso import SSO_PREFIX, SsoRoutes

log = logging.getLogger("llmgw.web")

LOGIN = "/admin/login"
LOGOUT = "/admin/logout"
HOME = "/admin/"
SESSION_API = "/admin/api/session"
API_PREFIX = "/admin/api/"
NOT_ADMIN = "your account has no admin role; ask an admin to give it one (llmgw users role)"
# Username + password, URL-encoded: far more than any real login needs.
LOGIN_BODY_LIMIT = 16 * 1024
# Seconds a login refused because the password pool is full is told to wait.
LOGIN_BUSY_RETRY_AFTER = 2
# Form posts carrying a csrf_token field are read here before being passed on.
FORM_BODY_LIMIT = 64 * 1024
# For the browser guard in front of the portal: the forms the portal checks itself
# (origin, CSRF token) and the read that answers the session's CSRF token.
FORM_PATHS = frozenset({LOGIN, LOGOUT})
STATIC_PREFIX = "/admin/static/"
SECRET_READS = frozenset({SESSION_API})
_READ = frozenset({"GET", "HEAD"})
_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True, slots=True)
class _Forward:
    """Pass the request on to the admin app, reading its body from `receive`."""

    receive: Receive
    user: PortalUser


class AdminPortal:
    """ASGI app for `/admin` on the API listener; build it with `create_admin_portal`."""

    def __init__(
        self,
        *,
        sessions: AdminSessions,
        throttle: LoginThrottle,
        admin_app: ASGIApp,
        session_max_age: int,
        secure_cookies: bool,
        sleep: Callable[[float], Awaitable[None]],
        teams: TeamAccess | None = None,
        sso: SingleSignOn | None = None,
        local_login: bool = True,
    ) -> None:
        self._teams = teams
        self._local = local_login
        self._sso = (
            SsoRoutes(
                sso=sso,
                sessions=sessions,
                session_cookie=lambda token: session_cookie(
                    token, max_age=session_max_age, secure=secure_cookies
                ),
                secure_cookies=secure_cookies,
            )
            if sso is not None
            else None
        )
        self._sessions = sessions
        self._throttle = throttle
        self._admin_app = admin_app
        self._max_age = session_max_age
        self._secure = secure_cookies
        self._sleep = sleep

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = header_map(scope)
        try:
            outcome = await self._handle(scope, receive, headers)
        except StoreError as exc:
            log.warning("admin portal: %s", exc)
            outcome = error_response(
                503,
                f"the admin pages cannot reach the store right now ({exc}); retry shortly",
                "service_unavailable",
                "store_unavailable",
            )
        except BodyTooLarge:
            outcome = error_response(
                413,
                "the request body is too large for this form",
                "invalid_request_error",
                "body_too_large",
            )
        if isinstance(outcome, _Forward):
            scope[PORTAL_USER] = outcome.user
            scope[ROLE_SCOPE_KEY] = outcome.user.role
            scope[USER_SCOPE_KEY] = outcome.user.name
            await self._admin_app(scope, outcome.receive, send)
        else:
            await outcome(scope, receive, send)

    async def _handle(
        self, scope: Scope, receive: Receive, headers: dict[str, str]
    ) -> Response | _Forward:
        path: str = scope["path"]
        method: str = scope["method"]
        if not (path == "/admin" or path.startswith("/admin/")) or _has_dot_segment(path):
            return _not_found(method, path)
        if path == "/admin":
            return RedirectResponse(HOME, status_code=303)
        if path.startswith(SSO_PREFIX):
            answer = await self._sso.handle(scope, headers) if self._sso is not None else None
            return answer if answer is not None else _not_found(method, path)
        if path == LOGIN:
            if method in _READ:
                return self._login_page()
            if method == "POST":
                return await self._login(scope, receive, headers)
            return _not_allowed(method, path, "GET, POST")
        if path == LOGOUT:
            if method != "POST":
                return _not_allowed(method, path, "POST")
            return await self._logout(receive, headers)
        token = cookie_value(headers, SESSION_COOKIE)
        logged_in = await self._sessions.resolve(token) if token else None
        if logged_in is None:
            return self._login_required(scope, headers, had_cookie=token is not None)
        if path == SESSION_API:
            if method not in _READ:
                return _not_allowed(method, path, "GET")
            return json_response(_session_view(logged_in))
        role = logged_in.user.admin_role
        # The dashboard's stylesheet and scripts hold no data: every logged-in user's pages
        # need them (a team's page, for a user without an admin role).
        static = method in _READ and path.startswith(STATIC_PREFIX)
        if not (static or may(role, method, path)) and not (
            self._teams is not None and await self._teams.allows(logged_in.user.name, method, path)
        ):
            return self._not_allowed(scope, headers, logged_in, method, path)
        if method in _UNSAFE:
            passed, receive = await _csrf_check(receive, headers, logged_in.session.csrf_token)
            if not passed:
                return _csrf_failed(headers)
        if path == HOME or path.startswith(API_PREFIX) or is_dashboard_path(path):
            user = PortalUser(logged_in.user.name, logged_in.session.csrf_token, role)
            return _Forward(receive, user)
        return _not_found(method, path)

    def _login_page(
        self, *, error: str | None = None, username: str = "", status: int = 200
    ) -> Response:
        return login_page(
            error=error,
            username=username,
            status=status,
            local=self._local,
            sso=self._sso is not None,
        )

    async def _login(self, scope: Scope, receive: Receive, headers: dict[str, str]) -> Response:
        if not self._local:
            return self._login_page(
                error="password logins are turned off on this server (auth.local_login: "
                "false); sign in with single sign-on",
                status=403,
            )
        # The login form carries no CSRF token (there is no session yet to tie one
        # to), and SameSite=Strict does not stop another site from posting a login
        # form (it limits which requests *send* cookies, not which set them). So a
        # forged login, which would quietly sign the victim in to the attacker's
        # account, is stopped by checking that the post comes from our own origin.
        if not same_origin(headers):
            return error_response(
                403,
                "this login did not come from this site's login page (Origin/Referer "
                "names another site); open /admin/login here and log in there",
                "permission_error",
                "cross_origin_login",
            )
        if not is_form(headers):
            return error_response(
                415,
                "send the login as an HTML form (application/x-www-form-urlencoded) "
                "with fields username and password",
                "invalid_request_error",
                "unsupported_media_type",
            )
        form = parse_form(await read_body(receive, LOGIN_BODY_LIMIT))
        username, password = form.get("username", ""), form.get("password", "")
        address = _client_address(scope)
        delay = self._throttle.begin(address, username)
        if delay > 0:
            log.info("admin login from %s for %r slowed by %.1f s", address, username, delay)
            await self._sleep(delay)
        try:
            token, logged_in = await self._sessions.login(username, password)
        except LoginFailed as exc:
            log.info("failed admin login from %s for %r", address, username)
            return self._login_page(error=str(exc), username=username, status=401)
        except PasswordsBusy as exc:
            log.warning("admin login from %s for %r refused: %s", address, username, exc)
            busy = self._login_page(error=str(exc), username=username, status=503)
            busy.headers["retry-after"] = str(LOGIN_BUSY_RETRY_AFTER)
            return busy
        self._throttle.succeeded(address, username)
        log.info("admin login: %s from %s", logged_in.user.name, address)
        response = RedirectResponse(HOME, status_code=303, headers=NO_STORE)
        response.headers.append(
            "set-cookie", session_cookie(token, max_age=self._max_age, secure=self._secure)
        )
        return response

    async def _logout(self, receive: Receive, headers: dict[str, str]) -> Response:
        token = cookie_value(headers, SESSION_COOKIE)
        logged_in = await self._sessions.resolve(token) if token else None
        if logged_in is not None:
            passed, _ = await _csrf_check(receive, headers, logged_in.session.csrf_token)
            if not passed:
                return _csrf_failed(headers)
            await self._sessions.logout(logged_in.session)
        response = RedirectResponse(LOGIN, status_code=303, headers=NO_STORE)
        response.headers.append("set-cookie", cleared_cookie(secure=self._secure))
        return response

    def _login_required(
        self, scope: Scope, headers: dict[str, str], *, had_cookie: bool
    ) -> Response:
        response: Response
        if headers.get("hx-request") == "true":
            # A dashboard page refreshing itself (or posting) after the session
            # ended: htmx follows HX-Redirect with a full page load.
            response = error_response(
                401,
                "your session has ended; log in again",
                "invalid_request_error",
                "login_required",
                headers={"hx-redirect": LOGIN},
            )
        elif wants_html(scope, headers):
            response = RedirectResponse(LOGIN, status_code=303, headers=NO_STORE)
        else:
            response = error_response(
                401,
                "log in first: this needs an admin session on this port (POST /admin/login "
                "with username and password), or use the admin listener with an admin key",
                "invalid_request_error",
                "login_required",
            )
        if had_cookie:
            # The cookie names no live session (expired, logged out, user disabled).
            response.headers.append("set-cookie", cleared_cookie(secure=self._secure))
        return response

    def _not_allowed(
        self,
        scope: Scope,
        headers: dict[str, str],
        logged_in: LoggedIn,
        method: str,
        path: str,
    ) -> Response:
        role = logged_in.user.admin_role
        message = NOT_ADMIN if role is None else refusal("your account", role, method, path)
        code = "admin_required" if role is None else "role_not_allowed"
        if team_path(path) is not None:
            message = (
                f"your account may not {method} {path}: a team's keys are for admins and "
                "that team's team-admins, its usage for its members too; ask an admin to "
                "add you to the team (llmgw teams members add)"
            )
            code = "team_not_allowed"
        if headers.get("hx-request") == "true":
            # Shown where the dashboard puts an action's answer.
            return HTMLResponse(
                f'<div class="notice error" role="alert">{escape(message)}</div>',
                status_code=403,
                headers=NO_STORE,
            )
        if wants_html(scope, headers):
            return forbidden_page(
                user=logged_in.user.name,
                csrf_token=logged_in.session.csrf_token,
                message=message,
            )
        return error_response(403, message, "permission_error", code)


def create_admin_portal(
    *,
    users: UserRepository,
    sessions: SessionRepository,
    admin_app: ASGIApp,
    session_ttl: float,
    slowdown_after: int,
    slowdown_max: float,
    clock: Callable[[], float],
    wall_clock: Callable[[], datetime],
    secure_cookies: bool,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    passwords: Passwords | None = None,
    teams: TeamAccess | None = None,
    sso: SingleSignOn | None = None,
    local_login: bool = True,
) -> AdminPortal:
    """The portal for the API listener's `/admin` paths.

    `admin_app` must be the admin app *without* `admin_guard`: the portal has
    already authenticated the caller, who may be on any address and holds no
    admin key. `clock` (monotonic seconds) times the login throttle,
    `wall_clock` (aware UTC) the sessions. `secure_cookies` adds `Secure` to the
    cookie: set it whenever browsers reach this port over HTTPS. `passwords`
    defaults to argon2id with argon2-cffi's default cost in asyncio's default
    executor; the server passes one with a pool of its own. `sso` adds single
    sign-on (`llmgw.web.sso`); `local_login` False refuses passwords.
    """
    return AdminPortal(
        sessions=AdminSessions(
            users=users,
            sessions=sessions,
            passwords=passwords if passwords is not None else Passwords(),
            ttl=session_ttl,
            wall_clock=wall_clock,
        ),
        throttle=LoginThrottle(after=slowdown_after, max_delay=slowdown_max, clock=clock),
        admin_app=admin_app,
        session_max_age=max(1, int(session_ttl)),
        secure_cookies=secure_cookies,
        sleep=sleep,
        teams=teams,
        sso=sso,
        local_login=local_login,
    )


async def _csrf_check(
    receive: Receive, headers: dict[str, str], expected: str
) -> tuple[bool, Receive]:
    """Whether the request carries the session's CSRF token, and the `receive` to
    read its body from afterwards (a form body is read here, then replayed)."""
    sent = headers.get("x-csrf-token")
    if sent is None and is_form(headers):
        body = await read_body(receive, FORM_BODY_LIMIT)
        sent = parse_form(body).get("csrf_token")
        receive = replay(body, receive)
    passed = sent is not None and hmac.compare_digest(sent.encode(), expected.encode())
    return passed, receive


def _session_view(logged_in: LoggedIn) -> dict[str, object]:
    session = logged_in.session
    return {
        "user": logged_in.user.name,
        "admin": logged_in.user.is_admin,
        "role": logged_in.user.admin_role,
        "csrf_token": session.csrf_token,
        "created_at": session.created_at.isoformat(),
        "expires_at": session.expires_at.isoformat(),
    }


def _client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _has_dot_segment(path: str) -> bool:
    # Never let /admin/api/../metrics reach anything but a 404, whatever the app
    # behind would make of it.
    return any(segment in (".", "..") for segment in path.split("/"))


_CSRF_FAILED = (
    "missing or wrong CSRF token: send the token from GET /admin/api/session in the "
    "X-CSRF-Token header (or a csrf_token form field); reload the page if you logged in again"
)


def _csrf_failed(headers: dict[str, str]) -> Response:
    if headers.get("hx-request") == "true":
        # Shown where the dashboard puts an action's answer.
        return HTMLResponse(
            f'<div class="notice error" role="alert">{escape(_CSRF_FAILED)}</div>',
            status_code=403,
            headers=NO_STORE,
        )
    return error_response(403, _CSRF_FAILED, "permission_error", "csrf_failed")


def _not_found(method: str, path: str) -> Response:
    return error_response(
        404,
        f"no route {method} {path} on this port; the admin API is under /admin/api/",
        "invalid_request_error",
        "not_found",
    )


def _not_allowed(method: str, path: str, allowed: str) -> Response:
    return error_response(
        405,
        f"{method} {path} is not allowed; use {allowed}",
        "invalid_request_error",
        "method_not_allowed",
        headers={"allow": allowed},
    )
