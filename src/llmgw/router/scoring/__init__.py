"""Routing scorers: the signals the balancer weighs to choose a replica.

A scorer is an object behind one small Protocol, `Scorer`: `score(request,
endpoints)` gives each candidate endpoint a value in 0..1 (higher: better), and
`chosen(request, endpoint)` tells it where the request went, for scorers that
learn (prefix index, sessions). The balancer multiplies each score by the
scorer's weight (`router.routing.scorers`) and takes the best sum. One module per
scorer: `prefix`, `rendezvous`, `session`, `load` (with `kv`).

`RouteRequest` is what scorers see of a request, computed once per request
before the first pick: the chained hashes of its prompt blocks, its session key
and whether the client asked for an explanation.

Not guaranteed: that scores are comparable across scorers beyond their 0..1
range; weights are the operator's way to say which signal counts more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llmgw.router.endpoints import Endpoint


@dataclass(slots=True)
class RouteRequest:
    """What the scorers see of one request (computed once, used on every attempt)."""

    model: str
    blocks: list[int]
    # Whole blocks before the first user turn (tools, system prompt); 0: none.
    head_blocks: int = 0
    session: str | None = None
    explain: bool = False
    # The request body, read only for a canary's split (`router.versions`): the key of
    # its conversation is computed then, so models without a canary never pay for it.
    body: Mapping[str, object] = field(default_factory=dict)
    # The session a client named (header or `user`), never one taken from its API key:
    # a whole key's traffic on one version would be no split.
    named_session: str | None = None
    # The model version chosen at the first pick ("" until then, or without a canary).
    version: str = ""
    # Filled in by the balancer at each pick: "prefix=0.82 load=0.30 -> ep-3".
    explanation: str = ""
    # Per scorer name, the chosen endpoint's score at the last pick.
    chosen_scores: dict[str, float] = field(default_factory=dict)
    # Predicted-TTFT routing, at the last pick: blocks the chosen endpoint was
    # believed not to hold, and whether the request was predicted to wait for a slot.
    uncached: int = 0
    waits: bool = False


class Scorer(Protocol):
    """One routing signal."""

    name: str

    def score(self, request: RouteRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        """One value in 0..1 per endpoint, in order; higher is better."""
        ...

    def chosen(self, request: RouteRequest, endpoint: Endpoint) -> None:
        """`request` goes to `endpoint` (learning scorers remember it)."""
        ...
