"""Load signals: the router's in-flight counts and the engines' own reports.

`EndpointLoad` is one endpoint's load as its engine last reported it (queue,
running, KV-cache use; None where the engine reports nothing) with when it was
read. `LoadBook` holds them by endpoint id; the metrics scraper writes it off
the request path, and anything in the router may read it: the balancer's
scorers here, and the queue's saturation detector through `load()` (its
`LoadSource`).

The book also learns each engine's batch size (how many sequences it runs at
once): the most requests it reported running at a time when some were waiting.
An engine queues only when its batch is full, so that is its `max_num_seqs`
(or less, when its KV cache filled first, which is the same limit in effect).

The load of an endpoint is the larger of the router's own in-flight count
(fresh, but blind to other routers) and the engine's running + waiting (every
router's requests, but as old as the last scrape).

Not guaranteed: freshness. A report older than `stale_after` is ignored, and
the router's own counts stand alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from llmgw.engines.spec import EngineLoad
from llmgw.router.endpoints import Endpoint
from llmgw.router.saturation import EngineLoad as QueueLoad
from llmgw.router.scoring import RouteRequest


@dataclass(slots=True)
class EndpointLoad:
    """One endpoint's load as its engine reported it at `read_at` (router clock)."""

    endpoint_id: str
    running: int | None
    waiting: int | None
    kv_cache_usage: float | None
    read_at: float


class LoadBook:
    """The engines' last load reports, by endpoint id."""

    def __init__(self, *, clock: Callable[[], float], stale_after: float) -> None:
        self._clock = clock
        self._stale_after = stale_after
        self._loads: dict[str, EndpointLoad] = {}
        # Per endpoint: the most requests seen running, and whether any were waiting
        # then or since (only then is that count the engine's batch size).
        self._batch: dict[str, tuple[int, bool]] = {}

    def record(self, endpoint_id: str, load: EngineLoad) -> None:
        self._loads[endpoint_id] = EndpointLoad(
            endpoint_id, load.running, load.waiting, load.kv_cache_usage, self._clock()
        )
        if load.running is not None:
            most, queued = self._batch.get(endpoint_id, (0, False))
            self._batch[endpoint_id] = (
                max(most, load.running),
                queued or (load.waiting is not None and load.waiting > 0 and load.running > 0),
            )

    def batch_size(self, endpoint_id: str) -> int | None:
        """Sequences the engine runs at once, as learned from its reports (None: it
        has never been seen with requests waiting, so its limit is not known)."""
        entry = self._batch.get(endpoint_id)
        if entry is None or not entry[1]:
            return None
        return entry[0]

    def most_running(self, endpoint_id: str) -> int:
        """The most requests the engine has reported running at once (0: none seen)."""
        entry = self._batch.get(endpoint_id)
        return 0 if entry is None else entry[0]

    def get(self, endpoint_id: str) -> EndpointLoad | None:
        """The endpoint's last report, or None when there is none or it is stale."""
        load = self._loads.get(endpoint_id)
        if load is None or self._clock() - load.read_at > self._stale_after:
            return None
        return load

    def load(self, endpoint_id: str) -> QueueLoad | None:
        """The report as the queue's saturation detector reads it (`LoadSource`)."""
        report = self.get(endpoint_id)
        if report is None:
            return None
        return QueueLoad(waiting=report.waiting, kv_cache=report.kv_cache_usage)

    def snapshot(self) -> dict[str, EndpointLoad]:
        """Every fresh report, by endpoint id (a copy)."""
        now = self._clock()
        return {
            i: load for i, load in self._loads.items() if now - load.read_at <= self._stale_after
        }

    def keep_only(self, endpoint_ids: Collection[str]) -> None:
        for endpoint_id in [i for i in self._loads if i not in endpoint_ids]:
            del self._loads[endpoint_id]
        for endpoint_id in [i for i in self._batch if i not in endpoint_ids]:
            del self._batch[endpoint_id]

    def load_of(self, endpoint: Endpoint) -> int:
        """Requests on the endpoint: the router's count, or the engine's if higher."""
        report = self.get(endpoint.id)
        if report is None:
            return endpoint.in_flight
        engine = (report.running or 0) + (report.waiting or 0)
        return max(endpoint.in_flight, engine)


class RecentPicks:
    """Events per endpoint lately (the balancer counts new prefixes placed), decayed
    with time constant `window` (an exponentially weighted count).

    Routers behind a client-side round robin each see a similar share of the
    traffic, so the ratios between endpoints agree from router to router even
    though the counts differ: a steadier signal for placing new prefixes than
    requests in flight, which are few and jump.
    """

    def __init__(self, *, window: float, clock: Callable[[], float]) -> None:
        self._window = window
        self._clock = clock
        self._counts: dict[str, tuple[float, float]] = {}

    def _decayed(self, endpoint_id: str, now: float) -> float:
        entry = self._counts.get(endpoint_id)
        if entry is None:
            return 0.0
        count, at = entry
        return count * math.exp(-(now - at) / self._window)

    def count(self, endpoint_id: str) -> float:
        return self._decayed(endpoint_id, self._clock())

    def add(self, endpoint_id: str) -> None:
        now = self._clock()
        self._counts[endpoint_id] = (self._decayed(endpoint_id, now) + 1.0, now)

    def keep_only(self, endpoint_ids: Collection[str]) -> None:
        for endpoint_id in [i for i in self._counts if i not in endpoint_ids]:
            del self._counts[endpoint_id]


class LoadScorer:
    """Score: 1 for the least loaded endpoint, lower by the excess over it.

    The excess is divided by the highest load + 1, so that one more request
    counts for much on an idle fleet and little on a busy one.
    """

    name = "load"

    def __init__(self, *, book: LoadBook) -> None:
        self._book = book

    def score(self, request: RouteRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        loads = [self._book.load_of(ep) for ep in endpoints]
        low, high = min(loads), max(loads)
        return [1.0 - (load - low) / (high + 1) for load in loads]

    def chosen(self, request: RouteRequest, endpoint: Endpoint) -> None:
        return None


class KVScorer:
    """Score: the free fraction of the engine's KV cache; 0.5 when it reports none."""

    name = "kv"

    def __init__(self, *, book: LoadBook) -> None:
        self._book = book

    def score(self, request: RouteRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        scores = []
        for ep in endpoints:
            report = self._book.get(ep.id)
            usage = report.kv_cache_usage if report is not None else None
            scores.append(0.5 if usage is None else 1.0 - min(1.0, max(0.0, usage)))
        return scores

    def chosen(self, request: RouteRequest, endpoint: Endpoint) -> None:
        return None
