"""The limiter's exception tree: what a client sees when a key is over a limit.

```
LimitExceeded            429, carries Retry-After and the x-ratelimit-* headers
├── RateLimited          code "rate_limit_exceeded": RPM or TPM; waiting helps within seconds
└── BudgetExhausted      code "insufficient_quota": the key's day/month token budget is used up
```

The router maps these to an OpenAI-style error body with status 429, code
`code`, and the headers in `headers`. Nothing else raised by the limiter is a
limit: errors of the budget source (the store) propagate unchanged from
`Limiter.admit`, and Redis failures never leave the limiter at all (it falls
back to per-process limits).
"""

from __future__ import annotations

from typing import Literal

Reason = Literal["rpm", "tpm", "budget"]


class LimitExceeded(Exception):
    """Base of the limits a request can be refused for (HTTP 429).

    `retry_after` is whole seconds (>= 1), also present as the `retry-after`
    header. `headers` holds lower-case header names and values ready for ASGI.
    `reason` says which limit refused the request: "rpm", "tpm" or "budget".
    """

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(
        self,
        message: str,
        *,
        retry_after: int,
        headers: list[tuple[bytes, bytes]],
        reason: Reason,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.headers = headers
        self.reason: Reason = reason


class RateLimited(LimitExceeded):
    """Over the key's requests or tokens per minute; retry after `retry_after` s."""

    code = "rate_limit_exceeded"


class BudgetExhausted(LimitExceeded):
    """The key's token budget for the current UTC day or month is used up.

    `retry_after` is the time until the period ends (up to a month).
    """

    type = "insufficient_quota"
    code = "insufficient_quota"
