"""API keys and admin users: authenticating requests, managing keys and users, logins.

The composition root builds a `KeyAuthenticator` (or an `OpenAuthenticator` in
auth mode `open`) and runs its `run()` poll as a guarded task; the router calls
`token_from_headers(...)` then `await authenticator.authenticate(token)` per
request and gets a `Principal` or an `AuthError` (see `llmgw.auth.errors`).
`KeyService` is what `llmgw keys` and the admin API use to change keys.

For people on the admin pages: `Passwords` (argon2id, off the event loop),
`UserService` (what `llmgw users` uses), `AdminSessions` (login, session
cookies' tokens, logout) and `LoginThrottle` (slowing down password guessing).

Not guaranteed: anything shared between processes beyond the store; login
throttling counts in each process's memory.
"""

from llmgw.auth.authenticator import (
    CURSOR_OVERLAP,
    Authenticator,
    KeyAuthenticator,
    KeyLookup,
    OpenAuthenticator,
)
from llmgw.auth.errors import (
    AuthError,
    AuthUnavailable,
    ExpiredKey,
    InvalidKey,
    KeyInputError,
    LoginFailed,
    MissingKey,
    ModelNotAllowed,
    UserInputError,
)
from llmgw.auth.passwords import MIN_PASSWORD_LENGTH, Passwords, PasswordsBusy, check_password
from llmgw.auth.principal import ANONYMOUS, Principal, principal_for
from llmgw.auth.roles import ROLE_SCOPE_KEY, check_role, may, may_see, refusal, scope_role
from llmgw.auth.service import KeyService
from llmgw.auth.sessions import AdminSessions, LoggedIn, session_id
from llmgw.auth.teams import USER_SCOPE_KEY, TeamAccess, team_path, team_role_may
from llmgw.auth.throttle import LoginThrottle
from llmgw.auth.tokens import generate_secret, hash_secret, secret_prefix, token_from_headers
from llmgw.auth.users import UserService, check_user_name

__all__ = [
    "ANONYMOUS",
    "CURSOR_OVERLAP",
    "MIN_PASSWORD_LENGTH",
    "ROLE_SCOPE_KEY",
    "USER_SCOPE_KEY",
    "AdminSessions",
    "AuthError",
    "AuthUnavailable",
    "Authenticator",
    "ExpiredKey",
    "InvalidKey",
    "KeyAuthenticator",
    "KeyInputError",
    "KeyLookup",
    "KeyService",
    "LoggedIn",
    "LoginFailed",
    "LoginThrottle",
    "MissingKey",
    "ModelNotAllowed",
    "OpenAuthenticator",
    "Passwords",
    "PasswordsBusy",
    "Principal",
    "TeamAccess",
    "UserInputError",
    "UserService",
    "check_password",
    "check_role",
    "check_user_name",
    "generate_secret",
    "hash_secret",
    "may",
    "may_see",
    "principal_for",
    "refusal",
    "scope_role",
    "secret_prefix",
    "session_id",
    "team_path",
    "team_role_may",
    "token_from_headers",
]
