"""OpenAI's x-ratelimit-* response headers and their duration format.

OpenAI writes reset times like Go durations: "20ms", "1s", "1.5s", "6m0s",
"1h2m3s". We round *up* to the millisecond so a client that waits exactly the
advertised time is never refused again for the same reason. Does not emit
microsecond or nanosecond units ("us", "ns"): sub-millisecond waits show as "1ms".
"""

from __future__ import annotations

import math

LIMIT_REQUESTS = b"x-ratelimit-limit-requests"
REMAINING_REQUESTS = b"x-ratelimit-remaining-requests"
RESET_REQUESTS = b"x-ratelimit-reset-requests"
LIMIT_TOKENS = b"x-ratelimit-limit-tokens"
REMAINING_TOKENS = b"x-ratelimit-remaining-tokens"
RESET_TOKENS = b"x-ratelimit-reset-tokens"
RETRY_AFTER = b"retry-after"


def format_duration(seconds: float) -> str:
    """Format a non-negative duration the way OpenAI's reset headers do."""
    if seconds <= 0.0:
        return "0s"
    ms = math.ceil(seconds * 1000.0 - 1e-6)
    if ms < 1000:
        return f"{ms}ms" if ms > 0 else "0s"
    if ms < 60_000:
        return _seconds(ms)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    if hours:
        return f"{hours}h{minutes}m{_seconds(ms)}"
    return f"{minutes}m{_seconds(ms)}"


def _seconds(ms: int) -> str:
    # repr of ms/1000 is the shortest decimal that round-trips: "1.5", "8.64", "1.234".
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms / 1000.0!r}s"


def retry_after_seconds(wait: float) -> int:
    """Whole seconds for Retry-After: rounded up, at least 1."""
    return max(1, math.ceil(wait - 1e-9))


def rate_headers(
    rpm: int | None, rpm_level: float, tpm: int | None, tpm_level: float
) -> list[tuple[bytes, bytes]]:
    """The x-ratelimit-* headers for a key's buckets at the given levels.

    Remaining is the whole tokens left (never negative); reset is the time
    until the bucket is full again, which is what OpenAI documents.
    """
    if rpm is None:
        if tpm is None:
            return []
        return _token_headers(tpm, tpm_level)
    requests = [
        (LIMIT_REQUESTS, b"%d" % rpm),
        (REMAINING_REQUESTS, b"%d" % (rpm_level if rpm_level > 0.0 else 0)),
        (RESET_REQUESTS, format_duration((rpm - rpm_level) * 60.0 / rpm).encode()),
    ]
    if tpm is not None:
        requests += _token_headers(tpm, tpm_level)
    return requests


def _token_headers(tpm: int, tpm_level: float) -> list[tuple[bytes, bytes]]:
    return [
        (LIMIT_TOKENS, b"%d" % tpm),
        (REMAINING_TOKENS, b"%d" % (tpm_level if tpm_level > 0.0 else 0)),
        (RESET_TOKENS, format_duration((tpm - tpm_level) * 60.0 / tpm).encode()),
    ]
