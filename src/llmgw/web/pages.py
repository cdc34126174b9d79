"""The portal's own pages: login, single sign-on's answers and "not for your role" (the
dashboard has the rest).

Plain HTML with inline CSS and no scripts or external assets, so the login page
works with the strictest Content-Security-Policy and leaks nothing to other
hosts. Every value put into a page is HTML-escaped.

Not guaranteed: the dashboard's look; these pages stand alone, without its
stylesheet, since they are shown before (or instead of) any dashboard page.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from types import MappingProxyType

from starlette.responses import HTMLResponse

# No scripts, no frames, forms post only here; inline styles for the one <style>.
SECURITY_HEADERS: Mapping[str, str] = MappingProxyType(
    {
        "content-security-policy": (
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'"
        ),
        "x-frame-options": "DENY",
        "x-content-type-options": "nosniff",
        "referrer-policy": "same-origin",
        "cache-control": "no-store",
    }
)

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:40rem;margin:4rem auto;padding:0 1rem;color:#222}
h1{font-size:1.4rem}label{display:block;margin:.8rem 0 .2rem}
input[type=text],input[type=password]{width:100%;padding:.4rem;box-sizing:border-box}
button{margin-top:1rem;padding:.4rem 1.2rem}.error{color:#a00}code{font-size:.95em}
li{margin:.3rem 0}
"""


def _page(title: str, body: str, status: int) -> HTMLResponse:
    html = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def login_page(
    *,
    error: str | None = None,
    username: str = "",
    status: int = 200,
    local: bool = True,
    sso: bool = False,
) -> HTMLResponse:
    """The login page: the password form when `local` logins are on, the single sign-on
    link when `sso` is configured; `error` (escaped) is shown above them."""
    message = f"<p class=error role=alert>{escape(error)}</p>" if error else ""
    # A link, not a form: the CSP's form-action 'self' would stop a form's redirect
    # to the provider.
    sso_link = (
        '<p><a class=sso id=sso-login href="/admin/oidc/login">Sign in with single sign-on</a></p>'
        if sso
        else ""
    )
    form = (
        '<form method=post action="/admin/login">'
        "<label for=username>User name</label>"
        f'<input id=username name=username type=text value="{escape(username)}" '
        "autocomplete=username required autofocus>"
        "<label for=password>Password</label>"
        "<input id=password name=password type=password autocomplete=current-password required>"
        "<button type=submit>Log in</button></form>"
        if local
        else ""
    )
    body = f"<h1>llmgw admin</h1>{message}{sso_link}{form}"
    return _page("llmgw admin: log in", body, status)


def signed_in_page(user: str) -> HTMLResponse:
    """After a single sign-on: moves on to the dashboard by itself.

    A page rather than a redirect, so that the dashboard's first request starts on
    this site and carries the new SameSite=Strict session cookie.
    """
    body = (
        "<h1>llmgw admin</h1>"
        f"<p>Signed in as <strong>{escape(user)}</strong>.</p>"
        '<p><a id=continue href="/admin/">Continue to the dashboard</a></p>'
    )
    html = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta http-equiv=refresh content="0;url=/admin/">'
        f"<title>llmgw admin: signed in</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )
    return HTMLResponse(html, status_code=200, headers=SECURITY_HEADERS)


def sso_failed_page(message: str, status: int) -> HTMLResponse:
    """A single sign-on that did not work: why, and the way back to the login page."""
    body = (
        "<h1>llmgw admin</h1>"
        "<p>Single sign-on did not work.</p>"
        f"<p class=error role=alert>{escape(message)}</p>"
        '<p><a href="/admin/login">Back to the login page</a></p>'
    )
    return _page("llmgw admin: sign-in refused", body, status)


def _logout_form(csrf_token: str) -> str:
    return (
        '<form method=post action="/admin/logout">'
        f'<input type=hidden name=csrf_token value="{escape(csrf_token)}">'
        "<button type=submit>Log out</button></form>"
    )


def forbidden_page(*, user: str, csrf_token: str, message: str) -> HTMLResponse:
    """For a logged-in user whose role may not open this: the reason and a way out, nothing else."""
    body = (
        "<h1>llmgw admin</h1>"
        f"<p>Logged in as <strong>{escape(user)}</strong>.</p>"
        f"<p class=error role=alert>{escape(message)}</p>"
        f"{_logout_form(csrf_token)}"
    )
    return _page("llmgw admin: no access", body, 403)
