"""Canary splits: which version of a model a new conversation goes to.

A model with a canary has replicas of two versions, each endpoint carrying its
version's name and weight (from the control plane). A request's conversation
key (its session when it has one, else a digest of how its conversation
began: the messages up to the first user turn, or the prompt's start) is
hashed onto the weights, so every turn of a conversation and every request of
a session lands on the same version, and independent routers agree. The
balancer's scorers (prefix affinity, load) then choose within that version.

Not guaranteed: the split is by conversations, not by requests or tokens; with
few conversations it lands only near the weights. When the chosen version has
no endpoint available now (none Ready yet, all ejected or already tried), the
request goes to the other version rather than fail. A continued stream (see
`continuation`) may resume on either version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw.router.endpoints import Endpoint

# Bytes of a completion prompt that name its conversation: enough to tell
# conversations apart, short enough that a growing prompt keeps its key.
_PROMPT_HEAD = 1024


def conversation_key(body: Mapping[str, object], session: str | None) -> str | None:
    """What names the request's conversation: the session, else how it began; None
    when the body shows neither (no messages, no prompt)."""
    if session is not None:
        return "session:" + session
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        opening: list[object] = []
        for message in messages:
            opening.append(message)
            if isinstance(message, Mapping) and message.get("role") == "user":
                break
        text = json.dumps(opening, sort_keys=True, ensure_ascii=False, default=str)
        return "messages:" + hashlib.sha256(text.encode()).hexdigest()
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt:
        return "prompt:" + hashlib.sha256(prompt.encode()[:_PROMPT_HEAD]).hexdigest()
    return None


def choose_version(key: str, weights: Mapping[str, int]) -> str:
    """The version `key` goes to: a stable point of the key's hash on the weights,
    versions in name order (so every router maps a key alike)."""
    total = sum(weights.values())
    point = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % total
    for name in sorted(weights):
        point -= weights[name]
        if point < 0:
            return name
    raise AssertionError("unreachable: the point lies below the total weight")


def versions_of(endpoints: Sequence[Endpoint]) -> dict[str, int]:
    """The versions among `endpoints` with their weights ({} for a model without one)."""
    return {ep.version: ep.weight for ep in endpoints if ep.version and ep.weight > 0}


def narrow(candidates: list[Endpoint], version: str) -> list[Endpoint]:
    """The candidates of `version`, or all of them when none runs it."""
    chosen = [ep for ep in candidates if ep.version == version]
    return chosen or candidates
