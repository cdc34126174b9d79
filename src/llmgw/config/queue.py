"""Settings of the router's saturation detector and request queue.

These models only validate shape and ranges; see `llmgw.router.queue` for what
the queue does with them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class QueueConfig(BaseModel):
    """How requests wait in the router while their model is saturated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_size: int = Field(
        default=1000,
        ge=1,
        description=(
            "Requests that may wait per model; the next one gets 429 at once. 1000 holds "
            "minutes of a busy model's traffic without letting memory grow unbounded."
        ),
    )
    max_wait: float = Field(
        default=30.0,
        ge=0,
        description=(
            "Seconds a request may wait when neither its key (--max-queue-wait) nor the "
            "request (x-llmgw-max-queue-wait, the OpenAI SDK's x-stainless-timeout) says "
            "less: long enough to ride out a burst, short enough that a client retrying "
            "after the 429 is not worse off."
        ),
    )
    aging: float = Field(
        default=10.0,
        ge=0,
        description=(
            "Seconds of waiting after which a class's next request counts one priority "
            "class higher (batch as default, then as interactive), so that no class is "
            "starved forever; 0 turns ageing off."
        ),
    )
    recheck: float = Field(
        default=0.5,
        gt=0,
        description=(
            "Seconds between looks for room that appears without a request ending (a new "
            "replica, an engine's load report); requests ending let waiters out at once."
        ),
    )
    share: Literal["requests", "tokens"] = Field(
        default="requests",
        description=(
            "What fair share between keys counts: requests (each costs 1), or tokens (each "
            "costs its estimated prompt tokens + max_tokens, so a key sending long prompts "
            "gets fewer requests through). Requests by default: estimates are rough, and "
            "request counts are what clients see in their latency."
        ),
    )
    share_window: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds of recent work that fair share between keys counts when routers "
            "share it through Redis (limits.redis_url), and for which a key counts as "
            "active on a model after its last request (the reserve's fair shares): long "
            "enough that a key's burst is remembered while it is still queueing, short "
            "enough that yesterday's heavy user is not held back today."
        ),
    )
    reserve: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description=(
            "The most of a model's places (the sum of its replicas' max_in_flight, rounded "
            "to the nearest place, never all of them) kept for keys holding less than their "
            "fair share of the model (its places split by weight between the keys active "
            "on it; with limits.redis_url, a key's requests and the active keys on every "
            "router count): a key over its share waits rather than take them, so a light "
            "user's request finds a free place instead of waiting for one to end while another "
            "key floods. How many are kept follows how often such requests came lately per "
            "request that ended: the fewest with which fewer than 1 in 20 of them find every "
            "kept place taken, none once none came for share_window seconds. A key "
            "alone is never over its share and still fills every place. A kept place is "
            "idle until such a request comes, so while several keys compete it costs up to "
            "this fraction of the model's places; 0.1 keeps up to one place from 5 places "
            "up, two from 15; 0 turns it off."
        ),
    )
    max_waiting: int | None = Field(
        default=None,
        ge=0,
        description=(
            "A replica whose engine reports more waiting requests than this counts as "
            "saturated (engines whose metrics are read). Unset by default: in-flight "
            "limits alone decide."
        ),
    )
    max_kv_cache: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "A replica whose engine reports KV-cache use over this fraction counts as "
            "saturated (engines whose metrics are read). Unset by default."
        ),
    )
