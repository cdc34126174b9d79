"""This router's load signals per model, for the control plane's load targets.

`LoadReport.models()` gathers, off the request path, what the router already
knows: each endpoint's last engine read from the `LoadBook` (requests waiting
and running, KV-cache use; by endpoint id, which for control-plane replicas is
the replica id) under the endpoint's model, and the requests waiting in this
router's own queue with the longest wait, under the name clients sent. The
server's demand sync sends it to the leader with the router's demand.

Not guaranteed: freshness beyond the book's. A read the book holds as stale is
left out, so an endpoint whose scrapes fail stops being reported; an engine that
exports no metrics (llama.cpp by default) is never reported.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from llmgw.router.endpoints import EndpointPool
from llmgw.router.queue import RequestQueue
from llmgw.router.scoring.load import LoadBook
from llmgw.store import ModelLoad, ReplicaLoad


class LoadReport:
    """Reads the router's engine reads and queue into `ModelLoad`s by model name."""

    def __init__(
        self,
        *,
        pool: EndpointPool,
        book: LoadBook,
        queue: RequestQueue | None,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
    ) -> None:
        self._pool = pool
        self._book = book
        self._queue = queue
        self._clock = clock
        self._wall_clock = wall_clock

    def models(self) -> dict[str, ModelLoad]:
        """Every model with an engine read or a request waiting in this router."""
        now, wall = self._clock(), self._wall_clock()
        reads = self._book.snapshot()
        replicas: dict[str, list[ReplicaLoad]] = {}
        for endpoint in self._pool.endpoints():
            read = reads.get(endpoint.id)
            if read is None or not endpoint.models:
                continue
            # The first name is the model's own; the others are aliases.
            replicas.setdefault(endpoint.models[0], []).append(
                ReplicaLoad(
                    replica=endpoint.id,
                    waiting=read.waiting,
                    running=read.running,
                    kv_cache_usage=read.kv_cache_usage,
                    read_at=wall - timedelta(seconds=max(0.0, now - read.read_at)),
                )
            )
        queued: dict[str, int] = {}
        if self._queue is not None:
            for model, _, depth in self._queue.depths():
                queued[model] = queued.get(model, 0) + depth
        loads: dict[str, ModelLoad] = {}
        for model in sorted({*replicas, *queued}):
            waited = 0.0
            if model in queued and self._queue is not None:
                waited = _longest_wait(self._queue.describe(model))
            loads[model] = ModelLoad(
                queued=queued.get(model, 0),
                queue_wait=waited,
                replicas=tuple(sorted(replicas.get(model, ()), key=lambda r: r.replica)),
            )
        return loads


def _longest_wait(described: dict[str, object]) -> float:
    """The longest wait over the priority classes of `RequestQueue.describe`."""
    classes = described.get("classes")
    if not isinstance(classes, dict):
        return 0.0
    waits = [
        float(c["oldest_wait_seconds"])
        for c in classes.values()
        if isinstance(c, dict) and isinstance(c.get("oldest_wait_seconds"), int | float)
    ]
    return max(waits, default=0.0)
