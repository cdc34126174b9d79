"""The exceptions of `llmgw.auth`: what a client or an operator is told when a key fails.

```
AuthError              a request cannot be authenticated; `status`, `type`, `code` for the body
├── MissingKey         401 missing_api_key: no Authorization: Bearer / x-api-key header
├── InvalidKey         401 invalid_api_key: unknown, revoked or unusable (never says which)
├── ExpiredKey         401 expired_api_key: the key passed its expiry time
├── ModelNotAllowed    403 model_not_allowed: the key may not use the requested model
└── AuthUnavailable    503 auth_unavailable: the key store did not answer on a cache miss

KeyInputError          (ValueError) a `KeyService` argument is invalid; names the field
UserInputError         (ValueError) a user name or password is not acceptable; says why
LoginFailed            wrong user name or password (never says which, nor that a user is disabled)
```

The router maps an `AuthError` to an OpenAI-style body with `status`, `type` and
`code`; `message` is safe to show to the client. Messages never contain the
secret, its hash, or (for `InvalidKey`) whether the key ever existed.

`KeyService` also lets the store's own errors through unchanged: `NotFound`
(no key matches a reference), `Ambiguous` (several do), `Conflict` (an active
key has that name; rotating or changing a revoked key), `InvalidValue` (an
update that changes nothing) and `StoreUnavailable`.

Not guaranteed: a stable message text; match on the class or `code`.
"""

from __future__ import annotations

from collections.abc import Mapping


class AuthError(Exception):
    """Base of every reason a request is refused by authentication."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MissingKey(AuthError):
    """The request carried no API key at all."""

    code = "missing_api_key"

    def __init__(self) -> None:
        super().__init__("no API key: send Authorization: Bearer <key> or x-api-key")


class InvalidKey(AuthError):
    """Unknown, revoked or unusable key; deliberately does not say which."""

    code = "invalid_api_key"

    def __init__(self) -> None:
        super().__init__(
            "invalid API key: check the key you sent, or ask an administrator for a new one"
        )


class ExpiredKey(AuthError):
    """The key exists but its expiry time has passed."""

    code = "expired_api_key"


class ModelNotAllowed(AuthError):
    """The key is valid but not for this model."""

    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class AuthUnavailable(AuthError):
    """A key not in the cache could not be checked because the store did not answer."""

    status = 503
    type = "service_unavailable"
    code = "auth_unavailable"

    def __init__(self) -> None:
        super().__init__("cannot check the API key right now: the key store is unavailable; retry")


class _FieldNames(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return key


class KeyInputError(ValueError):
    """An argument of `KeyService` is invalid; `field` names it.

    `problem` may refer to other fields as `{field}` placeholders, so each caller
    names fields its own way: `str(exc)` uses the parameter names
    ("budget_tokens needs period day|month"), the CLI renders its flags with
    `exc.render({"budget_tokens": "--budget-tokens", "period": "--period"})`.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(self.render({}))

    def render(self, names: Mapping[str, str]) -> str:
        """The message with every field called by its name in `names` (or its own)."""
        lookup = _FieldNames(names)
        return f"{lookup[self.field]} {self.problem.format_map(lookup)}"


def escape(value: object) -> str:
    """A value quoted for a `KeyInputError` problem text (braces doubled)."""
    return repr(value).replace("{", "{{").replace("}", "}}")


class UserInputError(ValueError):
    """A user name or password given to `UserService` is not acceptable; the message says why."""


class LoginFailed(Exception):
    """A login was refused. The message is the same for an unknown user, a wrong
    password and a disabled user, so it tells a guesser nothing."""

    def __init__(self) -> None:
        super().__init__("wrong user name or password")
