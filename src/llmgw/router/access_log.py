"""The API's access log: one line per request, sampled, never a body.

Each line (logger `llmgw.access`, level INFO) names the method and route, status,
model, replica, key id (never the key), latency, request id and trace id; with
`--log-format json` each is a field of its own. Errors (status >= 400) are
always written; successful requests at the configured share.

Not guaranteed: a line per request under sampling below 1, or the order of lines
of concurrent requests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable


class AccessLog:
    """Writes access lines to `logger` (default `llmgw.access`)."""

    def __init__(
        self,
        *,
        sample: float,
        rng: Callable[[], float],
        logger: logging.Logger | None = None,
    ) -> None:
        """`sample`: the share (0 to 1] of successful requests written; `rng` returns
        a float in [0, 1) (random.random)."""
        self._sample = sample
        self._rng = rng
        self._log = logger or logging.getLogger("llmgw.access")

    def write(
        self,
        *,
        method: str,
        path: str,
        status: int,
        model: str | None,
        replica: str | None,
        key_id: str | None,
        request_id: str,
        latency: float,
        trace_id: str | None,
    ) -> None:
        if status < 400 and self._sample < 1.0 and self._rng() >= self._sample:
            return
        if not self._log.isEnabledFor(logging.INFO):
            return
        latency_ms = round(latency * 1000.0, 3)
        self._log.info(
            '"%s %s" %d model=%s replica=%s key=%s %.1fms request_id=%s trace_id=%s',
            method,
            path,
            status,
            model or "-",
            replica or "-",
            key_id or "-",
            latency_ms,
            request_id,
            trace_id or "-",
            extra={
                "method": method,
                "route": path,
                "status": status,
                "model": model,
                "replica": replica,
                "key_id": key_id,
                "latency_ms": latency_ms,
                "request_id": request_id,
                "trace_id": trace_id,
            },
        )
