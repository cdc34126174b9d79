"""Predicted time to first token: how a request chooses its replica by default.

For each candidate replica the prediction is the wait for a free engine slot
plus the prefill of the prompt blocks that replica does not hold:

- wait: the replica's requests (`LoadBook.load_of`: this router's in-flight count
  or the engine's running + waiting, whichever is higher) against its batch size
  (`router.routing.ttft.max_num_seqs`, else learned from the engine's metrics,
  else the replica's `max_in_flight`, else `assumed_num_seqs`, raised to the most
  the engine was seen running). Below it a slot is free: no wait. At or
  above it, the request waits for (requests - batch + 1) slots to free up, one
  every slot time / batch seconds, where slot time is how long this replica's
  requests have held a slot lately (learned from the requests it finishes).
- prefill: the blocks the prefix index says the replica lacks, times the
  replica's prefill seconds per block, learned from the first-byte times of its
  streamed answers that found a free slot (`Rates.per_block`).

A prefill also delays the sequences already running on its replica (engines
pause or slow decoding while they prefill), so each candidate's cost is its
predicted time to first token plus its prefill x `prefill_interference` x the
sequences running there: a conversation leaves its cached replica for a busy
one only when its wait is longer than what computing its prefix again costs
everyone there, and for an idle one when the wait is longer than the prefill.
Without that term, moving for a slightly shorter wait duplicates prefixes,
which evicts others and adds prefills, until the fleet falls behind
(`bench/routing.py --cells issue`).

Lowest cost wins. Costs within the tie band (`tie_seconds`, or
`tie_fraction` of the best) are equal, and go to affinity: the longest cached
prefix, then the session's replica, then the least loaded replica, then
rendezvous order on the prompt's shared head (so that routers with the same view
agree), or chance for a prompt shorter than one block. A prefix no replica
holds therefore goes to the least loaded replica, and a conversation whose
replica is full moves to one with room when the wait there is longer than the
prefill it costs elsewhere (with the delay above): its prefix is then cached in
two places, as an ideal placement under load does.

Until a replica has its own observations, the model's (every replica of it
this router has seen) stand in, and before those the configured defaults.

Not guaranteed: accuracy. The prefix index is the router's own guess of the
engines' caches, the engine's queue is as old as its last metrics read (this
router's own counts are current), and other routers' requests appear only
through those reads. The prediction ranks replicas; it is not a promise of a
latency.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from llmgw.config.routing import TtftConfig
from llmgw.metrics.routing import RoutingMetrics
from llmgw.router.endpoints import Endpoint
from llmgw.router.scoring import RouteRequest
from llmgw.router.scoring.load import LoadBook
from llmgw.router.scoring.rendezvous import rendezvous_weight

# Observations a replica needs before its own rates replace the model's.
_OWN_AFTER = 3
# Uncached blocks from which a first byte is mostly the request's own prefill.
_BIG = 8


@dataclass(slots=True)
class Rates:
    """Exponentially weighted statistics of one replica's (or model's) requests."""

    # First-byte seconds per uncached block, of requests with at least _BIG of them.
    bigs: int = 0
    big_per_block: float = 0.0
    # Weighted means of uncached blocks and first-byte seconds, of every request.
    fits: int = 0
    mean_u: float = 0.0
    mean_t: float = 0.0
    # Seconds a request held an engine slot.
    slots: int = 0
    slot_seconds: float = 0.0

    def add_prefill(self, uncached: int, seconds: float, weight: float) -> None:
        # Early samples weigh 1/n so that the first few are a plain mean, not a
        # blend with the zeros the averages start from.
        w = max(weight, 1.0 / (self.fits + 1))
        self.mean_u = (1.0 - w) * self.mean_u + w * uncached
        self.mean_t = (1.0 - w) * self.mean_t + w * seconds
        self.fits += 1
        if uncached >= _BIG:
            w = max(weight, 1.0 / (self.bigs + 1))
            self.big_per_block = (1.0 - w) * self.big_per_block + w * seconds / uncached
            self.bigs += 1

    def add_slot(self, seconds: float, weight: float) -> None:
        w = max(weight, 1.0 / (self.slots + 1))
        self.slot_seconds = (1.0 - w) * self.slot_seconds + w * seconds
        self.slots += 1

    def per_block(self) -> float | None:
        """Prefill seconds per uncached block (None: not enough observations).

        First-byte time over uncached blocks, of the requests with many: the fixed
        part (network, the first decode step, other requests' prefills stalling
        it) is then a small share, and what is left over-estimates a little,
        which only makes moving a conversation look dearer. A least-squares slope
        over every request was tried: under load, a cached request's first byte
        waits for other prefills as long as an uncached one's, the slope falls
        toward 0, and conversations were moved as if prefill were free.
        """
        if self.bigs >= _OWN_AFTER:
            return self.big_per_block
        if self.fits >= _OWN_AFTER and self.mean_u > 0 and self.mean_t > 0:
            return self.mean_t / self.mean_u
        return None

    def slot(self) -> float | None:
        return self.slot_seconds if self.slots >= _OWN_AFTER else None


@dataclass(frozen=True, slots=True)
class Prediction:
    """One candidate's predicted time to first token, in parts (seconds), and the
    delay its prefill would add to the sequences running there (`delay`)."""

    wait: float
    prefill: float
    matched: int
    delay: float = 0.0

    @property
    def ttft(self) -> float:
        return self.wait + self.prefill

    @property
    def total(self) -> float:
        """What the choice weighs: the time to first token and the delay to others."""
        return self.wait + self.prefill + self.delay


class TtftPredictor:
    """Predicts each candidate's time to first token and learns from what it sees."""

    def __init__(
        self,
        *,
        config: TtftConfig,
        book: LoadBook,
        key_blocks: int,
        limit: Callable[[Endpoint, str], int | None] | None = None,
        metrics: RoutingMetrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """`limit(endpoint, model)` is the replica's max_in_flight (None: none), the
        batch size of last resort; `key_blocks` as `rendezvous_blocks`; `metrics`
        shows what was learned per endpoint (`refresh`); `rng` breaks the ties of
        prompts without a block."""
        self._metrics = metrics
        self._rng = rng or random.Random()
        self._config = config
        self._book = book
        self._key_blocks = key_blocks
        self._limit = limit
        self._rates: dict[str, Rates] = {}
        self._model_rates: dict[str, Rates] = {}

    def batch_size(self, endpoint: Endpoint, model: str) -> int:
        """Sequences the replica runs at once: configured, else learned, else its
        max_in_flight, else assumed (`assumed_num_seqs`, or more once seen running)."""
        if self._config.max_num_seqs is not None:
            return self._config.max_num_seqs
        learned = self._book.batch_size(endpoint.id)
        if learned is not None:
            return learned
        limit = self._limit(endpoint, model) if self._limit is not None else None
        if limit is not None:
            return limit
        return max(self._config.assumed_num_seqs, self._book.most_running(endpoint.id))

    def _per_block(self, endpoint_id: str, model: str) -> float:
        own = self._rates.get(endpoint_id)
        value = own.per_block() if own is not None else None
        if value is None:
            shared = self._model_rates.get(model)
            value = shared.per_block() if shared is not None else None
        return self._config.prefill_seconds_per_block if value is None else value

    def _slot(self, endpoint_id: str, model: str) -> float:
        own = self._rates.get(endpoint_id)
        value = own.slot() if own is not None else None
        if value is None:
            shared = self._model_rates.get(model)
            value = shared.slot() if shared is not None else None
        return self._config.service_seconds if value is None else value

    def predict(
        self, route: RouteRequest, candidates: Sequence[Endpoint], matched: Sequence[int]
    ) -> tuple[list[Prediction], list[int]]:
        """Each candidate's prediction, and its requests (`LoadBook.load_of`)."""
        total = len(route.blocks)
        model = route.model
        interference = self._config.prefill_interference
        predictions: list[Prediction] = []
        loads: list[int] = []
        for endpoint, held in zip(candidates, matched, strict=True):
            load = self._book.load_of(endpoint)
            loads.append(load)
            batch = self.batch_size(endpoint, model)
            wait = 0.0
            if load >= batch:
                wait = (load - batch + 1) * self._slot(endpoint.id, model) / batch
            prefill = (total - held) * self._per_block(endpoint.id, model)
            # The sequences running there are delayed by the prefill too.
            delay = prefill * interference * min(load, batch)
            predictions.append(Prediction(wait, prefill, held, delay))
        return predictions, loads

    def choose(
        self,
        route: RouteRequest,
        candidates: Sequence[Endpoint],
        matched: Sequence[int],
        session_endpoint: str | None = None,
    ) -> tuple[int, Prediction]:
        """The index of the candidate to send `route` to, and its prediction."""
        predictions, loads = self.predict(route, candidates, matched)
        best = min(p.total for p in predictions)
        band = max(self._config.tie_seconds, self._config.tie_fraction * best)
        near = [i for i, p in enumerate(predictions) if p.total <= best + band]
        if len(near) > 1:
            # Ties go to affinity: the longest cached prefix, the session's replica,
            # the least loaded; rendezvous order last (every router computes the same).
            def rank(i: int) -> tuple[int, bool, int]:
                return (-matched[i], candidates[i].id != session_endpoint, loads[i])

            top = min(rank(i) for i in near)
            near = [i for i in near if rank(i) == top]
        if len(near) == 1:
            index = near[0]
        elif route.blocks:
            key = self.head_key(route)
            index = max(near, key=lambda i: rendezvous_weight(key, candidates[i].id))
        else:
            # Nothing to agree on (a prompt shorter than a block): by chance, so that
            # short prompts one after another do not all land on one replica.
            index = near[self._rng.randrange(len(near))]
        return index, predictions[index]

    def head_key(self, route: RouteRequest) -> int:
        """The hash naming the prompt's shared head (rendezvous key); 0 without blocks."""
        chain = route.blocks
        if not chain:
            return 0
        head = route.head_blocks or self._key_blocks
        return chain[min(len(chain), head, self._key_blocks) - 1]

    def observe(
        self,
        endpoint_id: str,
        model: str,
        *,
        uncached: int,
        waited: bool,
        first_byte: float | None,
        total: float,
    ) -> None:
        """A request sent to `endpoint_id` finished: `first_byte` seconds to its first
        streamed event (None: not streamed), `total` to its end. `waited`: it was
        predicted to wait for a slot (its first byte then says nothing of prefill)."""
        weight = self._config.learn_weight
        own = self._rates.get(endpoint_id)
        if own is None:
            own = self._rates[endpoint_id] = Rates()
        shared = self._model_rates.get(model)
        if shared is None:
            shared = self._model_rates[model] = Rates()
        slot: float | None = total
        if not waited:
            if first_byte is not None and uncached > 0:
                own.add_prefill(uncached, first_byte, weight)
                shared.add_prefill(uncached, first_byte, weight)
        elif first_byte is not None:
            # The time in the engine's queue is not slot time: count the answer and
            # the prefill the prediction expected.
            slot = total - first_byte + uncached * self._per_block(endpoint_id, model)
        else:
            slot = None
        if slot is not None and slot > 0:
            own.add_slot(slot, weight)
            shared.add_slot(slot, weight)

    def refresh(self, endpoint_ids: Collection[str]) -> None:
        """Forget replicas that left the pool (`endpoint_ids`: those in it), and show
        what was learned of the others in `metrics` (off the request path)."""
        for endpoint_id in [i for i in self._rates if i not in endpoint_ids]:
            del self._rates[endpoint_id]
        if self._metrics is None:
            return
        for endpoint_id in endpoint_ids:
            own = self._rates.get(endpoint_id)
            self._metrics.learned(
                endpoint_id,
                self._book.batch_size(endpoint_id),
                own.per_block() if own is not None else None,
                own.slot() if own is not None else None,
            )
