"""Choosing the replica for a request: predicted time to first token, or weighted scorers.

By default (`router.routing.scorers` unset, and no `routing` on a catalog model)
each healthy candidate gets a predicted time to first token: the wait for a free
engine slot plus the prefill of the prompt blocks it does not cache, plus the
delay that prefill adds to the sequences running there
(`llmgw.router.scoring.ttft`); the lowest wins and near ties go to affinity
(cached prefix, session, least loaded, rendezvous order). The capacity tiers
below (`capacity`) still apply first; the balance guard does not (the
prediction weighs load against the cache itself).

With scorers (`router.routing.scorers` set, or a catalog model's `routing`),
each healthy candidate gets the weighted sum of the scorers' values (prefix affinity, load,
KV-cache use, session, rendezvous; see `llmgw.router.scoring`) and the best sum
wins; ties go to a random one of the best. A prefix no candidate holds (cold)
goes to the first endpoint in rendezvous order whose share of the new prefixes
placed lately is within `cold_balance` times the mean (consistent hashing with
bounded loads): every router replica agrees on it without talking, and each
replica gets its share of conversations. Before scoring, the balance guard
passes over every endpoint whose load exceeds the least loaded one's by more
than `balance_abs` requests and `balance_rel` times, so affinity never piles a
hot prefix onto one replica (the thresholds follow SGLang's router). The guard
also knows each replica's capacity (`capacity`: the model's `target_in_flight`
as a soft limit and the replica's `max_in_flight` as a hard one): a replica
whose load has reached a limit is passed over while another is below it, so
one hot prompt spreads over the replicas the autoscaler added for it instead of
waiting for a spread of `balance_abs`.

Each placement the prefix scorer learns is also handed to `publish` (the shared
index, when configured), and `learn` applies another router's placement here:
to the prefix index, and a new prefix to the counts `cold_balance` bounds, so
routers sharing an index also count the same new prefixes.

Without scorers (or when every weight is 0), it is least-outstanding-requests
by the power of two random choices: two random healthy candidates are drawn and
the one with fewer requests in flight wins, close to the best choice at O(1)
cost and without the herd that "always the least loaded" causes when many
routers share stale counts.

Not guaranteed: fairness between models; each model's endpoints are balanced on
their own. Scores are estimates: the index of what each engine caches is the
router's own guess, not the engine's word.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence

from llmgw.config.routing import RoutingConfig, ScorerWeights
from llmgw.engines.routes import EMBEDDINGS, ENGINE_ROUTES
from llmgw.metrics.routing import RoutingMetrics
from llmgw.router.endpoints import Endpoint
from llmgw.router.requests import ParsedRequest
from llmgw.router.scoring import RouteRequest, Scorer
from llmgw.router.scoring.blocks import prompt_blocks
from llmgw.router.scoring.load import KVScorer, LoadBook, LoadScorer, RecentPicks
from llmgw.router.scoring.prefix import PrefixIndex, PrefixScorer
from llmgw.router.scoring.rendezvous import RendezvousScorer
from llmgw.router.scoring.session import SessionScorer
from llmgw.router.scoring.ttft import TtftPredictor
from llmgw.router.versions import choose_version, conversation_key, narrow, versions_of

# Requests that leave nothing in an engine's prefix cache: their prompts are not
# hashed, so a tokenizer call never makes a replica look warm for that prompt.
_UNCACHED = frozenset({EMBEDDINGS, *ENGINE_ROUTES})


def build_scorers(
    routing: RoutingConfig,
    *,
    book: LoadBook,
    clock: Callable[[], float],
    index: PrefixIndex | None = None,
) -> list[Scorer]:
    """Every scorer, configured from `routing` (weights are applied per model by the
    balancer); `index` is the prefix index to score with (a new one by default)."""
    if index is None:
        index = PrefixIndex(capacity=routing.index_blocks, ttl=routing.index_ttl, clock=clock)
    return [
        PrefixScorer(index=index),
        LoadScorer(book=book),
        KVScorer(book=book),
        SessionScorer(capacity=routing.sessions, ttl=routing.index_ttl, clock=clock),
        RendezvousScorer(key_blocks=routing.rendezvous_blocks),
    ]


class Balancer:
    def __init__(
        self,
        *,
        clock: Callable[[], float],
        rng: random.Random,
        routing: RoutingConfig | None = None,
        scorers: Sequence[Scorer] = (),
        book: LoadBook | None = None,
        model_weights: Callable[[str], ScorerWeights | None] | None = None,
        metrics: RoutingMetrics | None = None,
        capacity: Callable[[Endpoint, str], tuple[int | None, int | None]] | None = None,
        index: PrefixIndex | None = None,
        publish: Callable[[str, Sequence[int], bool], None] | None = None,
        predictor: TtftPredictor | None = None,
    ) -> None:
        """`model_weights(model)` (asked at each pick; None: no override) replaces
        `routing.scorers` for a model (a catalog model's own `routing`).
        `capacity(endpoint, model)` is (soft, hard): the requests in flight the
        model is scaled for per replica, and the most the replica takes (None: no
        such limit). `publish(endpoint id, chain, new prefix)` is told every
        placement the prefix scorer learns (other routers apply it through `learn`
        to `index`, the prefix scorer's). `predictor` chooses when a model has no
        scorer weights (a new one over `book` by default)."""
        self._clock = clock
        self._rng = rng
        self._routing = routing or RoutingConfig()
        self._scorers = list(scorers)
        self._book = book or LoadBook(clock=clock, stale_after=5.0)
        self._recent = RecentPicks(window=self._routing.cold_window, clock=clock)
        self._model_weights = model_weights
        self._metrics = metrics
        self._capacity = capacity
        self._index = index
        self._publish = publish
        self._session_header = self._routing.session_header.lower().encode()
        self._by_name = {scorer.name: scorer for scorer in self._scorers}
        if predictor is None:
            predictor = TtftPredictor(
                config=self._routing.ttft,
                book=self._book,
                key_blocks=self._routing.rendezvous_blocks,
                limit=None if capacity is None else (lambda ep, model: capacity(ep, model)[1]),
                rng=rng,
            )
        self._predictor = predictor

    @property
    def book(self) -> LoadBook:
        return self._book

    @property
    def predictor(self) -> TtftPredictor:
        return self._predictor

    def weights(self, model: str) -> ScorerWeights | None:
        """The scorer weights `model` is routed with (None: by predicted TTFT)."""
        if self._model_weights is not None:
            own = self._model_weights(model)
            if own is not None:
                return own
        return self._routing.scorers

    def route(
        self,
        req: ParsedRequest,
        headers: Sequence[tuple[bytes, bytes]] = (),
        key_id: str | None = None,
    ) -> RouteRequest:
        """What the scorers need of `req`, computed once per request."""
        session: str | None = None
        explain = False
        for name, value in headers:
            if name == self._session_header and value:
                session = value.decode("latin-1")
            elif name == b"x-llmgw-route":
                # Scores tell whether any key sent this prompt lately: explained only
                # to keys that may debug; the header is ignored for the others.
                explain = req.may_debug
        if session is None:
            user = req.body.get("user")
            if isinstance(user, str) and user:
                session = "user:" + user
        named = session
        if session is None and key_id is not None and self._routing.session_from_key:
            session = "key:" + key_id
        blocks: list[int] = []
        head = 0
        if req.path not in _UNCACHED and self._scorers:
            blocks, head = prompt_blocks(
                req.body,
                block_bytes=self._routing.block_bytes,
                max_bytes=self._routing.max_prompt_bytes,
            )
        return RouteRequest(
            model=req.model,
            blocks=blocks,
            head_blocks=head,
            session=session,
            explain=explain,
            body=req.body,
            named_session=named,
        )

    def pick(
        self,
        endpoints: Sequence[Endpoint],
        exclude: Collection[Endpoint],
        route: RouteRequest | None = None,
    ) -> Endpoint | None:
        now = self._clock()
        candidates = [ep for ep in endpoints if ep not in exclude and ep.available(now)]
        if route is not None and candidates:
            candidates = self._version(route, endpoints, candidates)
        count = len(candidates)
        if count == 0:
            return None
        if route is None or not self._scorers:
            return candidates[0] if count == 1 else self._two_choices(candidates)
        weights = self.weights(route.model)
        if weights is None:
            if count > 1 and self._capacity is not None:
                loads = [self._book.load_of(ep) for ep in candidates]
                candidates, _ = self._roomy(candidates, loads, route.model)
            return self._predicted(route, candidates)
        if count > 1:
            candidates = self._guard(candidates, route.model)
        active = [(s, w) for s in self._scorers if (w := getattr(weights, s.name, 0.0)) > 0]
        if not active:
            return candidates[0] if len(candidates) == 1 else self._two_choices(candidates)
        return self._best(route, candidates, active)

    def _version(
        self, route: RouteRequest, endpoints: Sequence[Endpoint], candidates: list[Endpoint]
    ) -> list[Endpoint]:
        """A model with a canary: the candidates of the version the request's
        conversation goes to (`router.versions`), chosen once per request."""
        if not route.version:
            weights = versions_of(endpoints)
            if len(weights) < 2:
                return candidates
            key = conversation_key(route.body, route.named_session)
            if key is None:
                # Nothing names a conversation: a fresh one each time, by weight.
                key = f"random:{self._rng.random()}"
            route.version = choose_version(key, weights)
        return narrow(candidates, route.version)

    def _best(
        self,
        route: RouteRequest,
        candidates: list[Endpoint],
        active: list[tuple[Scorer, float]],
    ) -> Endpoint:
        totals = [0.0] * len(candidates)
        per_scorer: list[list[float]] = []
        for scorer, weight in active:
            scores = scorer.score(route, candidates)
            per_scorer.append(scores)
            for i, value in enumerate(scores):
                totals[i] += weight * value
        by_name = {
            scorer.name: scores for (scorer, _), scores in zip(active, per_scorer, strict=True)
        }
        prefix_scores = by_name.get("prefix")
        rendezvous = by_name.get("rendezvous")
        new = prefix_scores is not None and max(prefix_scores) == 0
        if new and rendezvous is not None:
            index = self._cold(candidates, rendezvous)
        else:
            top = max(totals)
            best = [i for i, total in enumerate(totals) if total >= top - 1e-9]
            index = best[0] if len(best) == 1 else best[self._rng.randrange(len(best))]
        chosen = candidates[index]
        route.chosen_scores = {
            scorer.name: scores[index]
            for (scorer, _), scores in zip(active, per_scorer, strict=True)
        }
        prefix = route.chosen_scores.get("prefix")
        if prefix is not None and self._metrics is not None and route.blocks:
            total = len(route.blocks)
            self._metrics.expected(route.model, total, round(prefix * total))
        if route.explain:
            parts = " ".join(f"{name}={value:.2f}" for name, value in route.chosen_scores.items())
            route.explanation = f"{parts} -> {chosen.id}"
        for scorer, _ in active:
            scorer.chosen(route, chosen)
        if self._publish is not None and prefix_scores is not None and route.blocks:
            self._publish(chosen.id, route.blocks, new and rendezvous is not None)
        return chosen

    def _predicted(self, route: RouteRequest, candidates: list[Endpoint]) -> Endpoint:
        """The candidate with the lowest predicted time to first token (and delay to
        the others there)."""
        total = len(route.blocks)
        prefix = self._by_name.get("prefix")
        if prefix is not None and total:
            matched = [round(f * total) for f in prefix.score(route, candidates)]
        else:
            matched = [0] * len(candidates)
        session = self._by_name.get("session")
        own = None
        if isinstance(session, SessionScorer) and route.session is not None:
            own = session.endpoint_of(route.session)
        if len(candidates) == 1:
            index = 0
            prediction = self._predictor.predict(route, candidates, matched)[0][0]
        else:
            index, prediction = self._predictor.choose(route, candidates, matched, own)
        chosen = candidates[index]
        route.uncached = total - prediction.matched
        route.waits = prediction.wait > 0
        # What the choice rested on, for the route span (seconds, and the cached share).
        route.chosen_scores = {
            "predicted_ttft_s": prediction.ttft,
            "wait_s": prediction.wait,
            "prefill_s": prediction.prefill,
            "delay_s": prediction.delay,
        }
        if prefix is not None and total:
            route.chosen_scores["prefix"] = prediction.matched / total
            if self._metrics is not None:
                self._metrics.expected(route.model, total, prediction.matched)
        if route.explain:
            route.explanation = (
                f"ttft={prediction.ttft * 1000:.1f}ms wait={prediction.wait * 1000:.1f}ms "
                f"prefill={prediction.prefill * 1000:.1f}ms "
                f"delay={prediction.delay * 1000:.1f}ms "
                f"cached={prediction.matched}/{total} -> {chosen.id}"
            )
        if prefix is not None:
            prefix.chosen(route, chosen)
        if session is not None:
            session.chosen(route, chosen)
        if self._publish is not None and prefix is not None and total:
            self._publish(chosen.id, route.blocks, max(matched) == 0)
        return chosen

    def served(
        self, route: RouteRequest, endpoint: Endpoint, first_byte: float | None, total: float
    ) -> None:
        """`route`'s request to `endpoint` ended: `first_byte` seconds to its first
        streamed event (None: not streamed), `total` to its end. Teaches the
        predictor the replica's prefill and slot times."""
        self._predictor.observe(
            endpoint.id,
            route.model,
            uncached=route.uncached,
            waited=route.waits,
            first_byte=first_byte,
            total=total,
        )

    def learn(self, endpoint_id: str, chain: Sequence[int], new: bool) -> None:
        """Another router sent a prompt with block chain `chain` to `endpoint_id`
        (`new`: a prefix it placed cold, which counts toward `cold_balance` here too)."""
        if self._index is not None and chain:
            self._index.add(endpoint_id, chain)
        if new:
            self._recent.add(endpoint_id)

    def _cold(self, candidates: list[Endpoint], rendezvous: list[float]) -> int:
        """A prefix no candidate holds: the first endpoint in rendezvous order whose
        share of the new prefixes placed lately is within `cold_balance` times the
        mean (consistent hashing with bounded loads), so that independent routers
        agree and no replica collects more than its share of conversations."""
        recent = [self._recent.count(ep.id) for ep in candidates]
        bound = self._routing.cold_balance * (sum(recent) + 1) / len(recent)
        order = sorted(range(len(candidates)), key=rendezvous.__getitem__, reverse=True)
        # Counted with this placement: the endpoint would stay within the bound.
        index = next((i for i in order if recent[i] + 1 <= bound), order[0])
        self._recent.add(candidates[index].id)
        return index

    def _guard(self, candidates: list[Endpoint], model: str) -> list[Endpoint]:
        """The candidates the balance guard lets affinity choose among."""
        loads = [self._book.load_of(ep) for ep in candidates]
        if self._capacity is not None:
            candidates, loads = self._roomy(candidates, loads, model)
        low = min(loads)
        spread = self._routing.balance_abs
        ratio = self._routing.balance_rel
        kept = [
            ep
            for ep, load in zip(candidates, loads, strict=True)
            if load - low <= spread or load <= ratio * low
        ]
        return kept

    def _roomy(
        self, candidates: list[Endpoint], loads: list[int], model: str
    ) -> tuple[list[Endpoint], list[int]]:
        """The candidates in the best capacity tier: below the soft limit, else below
        the hard one, else all (the queue holds requests back before that, when
        configured; without it a full fleet still serves)."""
        assert self._capacity is not None
        tiers = []
        for ep, load in zip(candidates, loads, strict=True):
            soft, hard = self._capacity(ep, model)
            if hard is not None and load >= hard:
                tiers.append(2)
            elif soft is not None and load >= soft:
                tiers.append(1)
            else:
                tiers.append(0)
        best = min(tiers)
        if best == max(tiers):
            return candidates, loads
        kept = [i for i, tier in enumerate(tiers) if tier == best]
        return [candidates[i] for i in kept], [loads[i] for i in kept]

    def _two_choices(self, candidates: list[Endpoint]) -> Endpoint:
        count = len(candidates)
        randrange = self._rng.randrange
        i = randrange(count)
        j = randrange(count - 1)
        if j >= i:
            j += 1
        first, second = candidates[i], candidates[j]
        return first if first.in_flight <= second.in_flight else second
