"""Counters of the simulated engine, read by `/sim/stats` and `/metrics`.

Plain integers on plain objects, bumped inline on the request path: the hot path of a
zero-delay benchmark pays one attribute increment per counter and nothing else.

Not guaranteed: consistency between counters read in one snapshot while requests are
in flight (they are read one after another), or any persistence across restarts.
`requests_total` counts inference requests (chat, completions, embeddings) that
arrived, including those answered with an error; health, model list, metrics and
`/sim/*` requests are not counted anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class ModelCounters:
    """Per served model name, what `/metrics` reports with `model_name="..."`."""

    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    request_success: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


@dataclass(slots=True, eq=False)
class LastRequest:
    """The last inference request: its path, parsed JSON body and raw ASGI headers.

    Headers are decoded only when read, so recording them costs nothing per request.
    """

    path: str
    body: object
    raw_headers: Iterable[tuple[bytes, bytes]]

    def as_json(self) -> dict[str, object]:
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in self.raw_headers
        }
        # The W3C trace context the engine was sent: tests of tracing read it here.
        return {
            "path": self.path,
            "body": self.body,
            "headers": headers,
            "traceparent": headers.get("traceparent"),
        }


class SimStats:
    """Request outcome counters plus one `ModelCounters` per served model name."""

    def __init__(self, *, models: Sequence[str]) -> None:
        if not models:
            raise ValueError("the simulated engine needs at least one model name")
        self.models: dict[str, ModelCounters] = {name: ModelCounters() for name in models}
        self.requests_total = 0
        self.requests_completed = 0
        self.requests_cancelled = 0
        self.requests_failed = 0
        self.last_request: LastRequest | None = None

    def snapshot(self, *, running: int, waiting: int) -> dict[str, object]:
        """The `/sim/stats` body; `running`/`waiting` come from the scheduler."""
        queries = sum(counters.prefix_cache_queries for counters in self.models.values())
        hits = sum(counters.prefix_cache_hits for counters in self.models.values())
        last = self.last_request
        return {
            "requests_total": self.requests_total,
            "requests_completed": self.requests_completed,
            "requests_cancelled": self.requests_cancelled,
            "requests_failed": self.requests_failed,
            "running": running,
            "waiting": waiting,
            "prefix_cache_queries": queries,
            "prefix_cache_hits": hits,
            "last_request": None if last is None else last.as_json(),
        }
