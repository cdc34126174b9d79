"""Routing settings: the predicted-TTFT chooser, the scorers' weights, cache-aware knobs.

`RoutingConfig` is `router.routing` in the server config, the default for every
model (static endpoints included); `ModelRouting` is `routing` on a catalog
model, whose scorer weights replace the server's for that model. By default a
request goes to the replica with the lowest predicted time to first token
(`ttft`); setting `scorers` (on the server, or `routing` on a catalog model)
chooses by the weighted scorers instead. Each default says why it is what it is.

Not guaranteed: that a weight set suits a workload; `bench/routing.py` compares
them on the sim.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScorerWeights(_Strict):
    """How much each routing signal counts; 0 turns a scorer off."""

    prefix: float = Field(
        default=3.0,
        ge=0,
        description=(
            "Prefix affinity: an engine that holds a prompt's prefix skips its prefill, "
            "an order of magnitude off time to first token; the strongest signal."
        ),
    )
    load: float = Field(
        default=2.0,
        ge=0,
        description=(
            "Requests in flight (the router's own counts plus the engine's queue): "
            "strong enough to spread cold traffic, weaker than a cache hit."
        ),
    )
    kv: float = Field(
        default=1.0,
        ge=0,
        description=(
            "Free KV cache the engine reports: a nearly full cache evicts what the next "
            "request would reuse. Neutral for engines whose metrics are not read."
        ),
    )
    session: float = Field(
        default=1.0,
        ge=0,
        description=(
            "Back to the replica that served the session last; one signal among the "
            "others, since pinning alone spreads shared system prompts over every replica."
        ),
    )
    rendezvous: float = Field(
        default=1.0,
        ge=0,
        description=(
            "Highest-random-weight hashing of the prompt's first blocks: a prefix no "
            "replica has seen goes where every other router sends it too."
        ),
    )


class TtftConfig(_Strict):
    """The predicted-TTFT chooser: what it assumes until it has learned better."""

    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Sequences each engine runs at once (vLLM's --max-num-seqs, SGLang's "
            "--max-running-requests); beyond it requests wait inside the engine. Unset "
            "by default: learned per replica from its metrics (the requests running while "
            "some wait), else the replica's max_in_flight with this router's own counts."
        ),
    )
    assumed_num_seqs: int = Field(
        default=16,
        ge=1,
        description=(
            "Batch size assumed for a replica whose own is neither set (max_num_seqs), "
            "learned, nor bounded by a max_in_flight, and not below the most requests "
            "its engine has been seen running: beyond it the router counts requests as "
            "waiting, so one hot prompt cannot pile every request onto one engine that "
            "reports nothing (llama.cpp without metrics). 16: a small GPU batch."
        ),
    )
    prefill_seconds_per_block: float = Field(
        default=0.005,
        gt=0,
        le=60,
        description=(
            "Prefill time of one uncached routing block (block_bytes of prompt, about 64 "
            "tokens) until a replica's own is learned from the first-byte times of its "
            "streamed answers: 5 ms is a mid-size model on one current GPU."
        ),
    )
    prefill_interference: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description=(
            "How much a prefill delays the sequences already running on its replica, as "
            "a fraction of its own time (engines pause or slow decoding while they "
            "prefill): each uncached block costs its prefill time x (1 + this x "
            "sequences running there). 1: decoding stalls for the whole prefill, which "
            "keeps a conversation off a busy replica that would have to compute its "
            "prefix again (measured with bench/routing.py --cells issue: at 0, moving "
            "for a shorter wait duplicated prefixes until the fleet fell behind). 0: "
            "only the request's own time to first token counts."
        ),
    )
    service_seconds: float = Field(
        default=2.0,
        gt=0,
        le=3600,
        description=(
            "How long a request holds an engine slot until a replica's own is learned "
            "from the requests it finishes: a chat answer of a few hundred tokens."
        ),
    )
    learn_weight: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description=(
            "Weight of each new observation in the learned rates (an exponential "
            "average over about the last 1/learn_weight requests): follows a change in "
            "traffic within tens of requests, not swayed by one slow answer."
        ),
    )
    tie_seconds: float = Field(
        default=0.005,
        ge=0,
        le=60,
        description=(
            "Predictions within this many seconds of the best (or tie_fraction of it) "
            "count as equal and go to affinity (longest cached prefix, the session's "
            "replica, then the least loaded): a prediction is an estimate, and "
            "affinity keeps conversations together when the estimate cannot tell."
        ),
    )
    tie_fraction: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Relative tie band, with tie_seconds (the larger of the two applies).",
    )


class RoutingConfig(_Strict):
    """How a request chooses among the replicas of its model."""

    scorers: ScorerWeights | None = Field(
        default=None,
        description=(
            "Weights of the routing signals. Unset by default: a request goes to the "
            "replica with the lowest predicted time to first token (`ttft`). Setting "
            "it (even to `{}`, every default weight) chooses by the weighted sum instead."
        ),
    )
    ttft: TtftConfig = Field(
        default_factory=TtftConfig,
        description=(
            "The default chooser: per replica, the predicted wait for a free engine slot "
            "plus the prefill of the prompt blocks it does not cache; lowest wins."
        ),
    )
    block_bytes: int = Field(
        default=256,
        ge=16,
        le=65536,
        description=(
            "Bytes of prompt text per hashed block (about 64 tokens): fine enough that "
            "a conversation's growing history matches up to its last turn."
        ),
    )
    max_prompt_bytes: int = Field(
        default=262144,
        ge=1024,
        description=(
            "Prompt bytes hashed per request, from the start; caps the router's "
            "work (a 256 KiB prefix already identifies a conversation)."
        ),
    )
    index_blocks: int = Field(
        default=65536,
        ge=16,
        description=(
            "Blocks remembered per endpoint (LRU): about what an engine's prefix cache "
            "holds; a larger index only predicts hits the engine already evicted."
        ),
    )
    index_ttl: float = Field(
        default=600.0,
        gt=0,
        description=(
            "Seconds a block sent to an endpoint is still believed cached there; "
            "engines evict by pressure, and ten idle minutes usually mean evicted."
        ),
    )
    rendezvous_blocks: int = Field(
        default=8,
        ge=1,
        description=(
            "Leading blocks that name a prefix for rendezvous hashing (about 500 "
            "tokens): the shared system prompt, not the user's own turns."
        ),
    )
    session_header: str = Field(
        default="x-session-id",
        pattern=r"^[A-Za-z0-9-]{1,64}$",
        description=(
            "Request header naming a conversation, for clients that know one; the "
            "OpenAI `user` field and then the API key are used without it."
        ),
    )
    session_from_key: bool = Field(
        default=False,
        description=(
            "Treat the API key as the session when a request names none. Off by "
            "default: one key often carries many users' conversations."
        ),
    )
    sessions: int = Field(
        default=100000,
        ge=1,
        description="Sessions remembered (LRU); a forgotten one is routed by its prompt.",
    )
    balance_abs: int = Field(
        default=32,
        ge=0,
        description=(
            "Balance guard (weighted scorers only; predicted TTFT weighs load itself): "
            "an endpoint with this many more requests in flight than the "
            "least loaded one (and balance_rel times as many) is passed over, so a hot "
            "prefix cannot melt one replica. 32: moving a warm conversation costs a "
            "whole prefill, which also stalls the other replica's decoding, so only a "
            "clear overload is worth it (measured with bench/routing.py; 4 lost a "
            "tenth of the cache hits to ordinary bursts). Capacity is checked before it: "
            "a replica at its model's target_in_flight or its max_in_flight loses to one "
            "below them."
        ),
    )
    balance_rel: float = Field(
        default=1.5,
        ge=1.0,
        description="Balance guard's relative threshold (see balance_abs).",
    )
    cold_balance: float = Field(
        default=1.1,
        ge=1.0,
        description=(
            "Weighted scorers only (predicted TTFT sends a new prefix to the least "
            "loaded replica): a new prefix goes to the first replica in rendezvous "
            "order whose share of the new prefixes placed lately is within this factor of the mean "
            "(consistent hashing with bounded loads): 1.1 keeps every replica near its "
            "share of conversations while every router still agrees on where one lives."
        ),
    )
    cold_window: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds over which new prefixes are counted for cold_balance: long "
            "enough to smooth bursts, short enough to follow a shift in traffic."
        ),
    )
    redis_url: str | None = Field(
        default=None,
        description=(
            "redis://HOST:PORT/DB through which router replicas share their prefix "
            "indexes: each publishes where it sent which prompt blocks, in batches off "
            "the request path, and applies the others', so routers agree on where a "
            "conversation lives (may be the same Redis as limits.redis_url). Unset by "
            "default: each router learns alone, and rendezvous hashing makes them "
            "agree on most new prefixes; a Redis outage falls back to that."
        ),
    )
    share_channel: str = Field(
        default="llmgw:routing:prefix",
        min_length=1,
        description=(
            "Redis pub/sub channel of the shared index; routers that should share one "
            "fleet's index use the same channel, another fleet on the same Redis another."
        ),
    )
    share_interval: float = Field(
        default=0.05,
        gt=0,
        le=10,
        description=(
            "Seconds between batches sent to Redis: 50 ms is well below the gap "
            "between a conversation's turns, and one message per interval costs "
            "Redis little however busy the router is."
        ),
    )
    metrics_interval: float = Field(
        default=1.0,
        gt=0,
        description=(
            "Seconds between reads of each engine's /metrics (queue, KV use); the "
            "router's own in-flight counts fill the gaps between reads."
        ),
    )

    @property
    def weighted(self) -> bool:
        """True when `scorers` was set: choose by weighted scorers, not predicted TTFT."""
        return self.scorers is not None

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"{value!r} is not a redis://, rediss:// or unix:// URL")
        return value


class ModelRouting(_Strict):
    """A catalog model's own routing: its scorer weights replace the server's."""

    scorers: ScorerWeights = Field(
        default_factory=ScorerWeights,
        description=(
            "Weights of the routing signals for this model; a weight left out takes "
            "its default (not the server's), so the model's set is complete on its own."
        ),
    )
