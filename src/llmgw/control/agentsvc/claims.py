"""Node-id claims of Registers that arrive together, written in one store transaction.

With mTLS every Register claims its node id for the certificate's key in the
store (`identity.py`). One transaction per Register made a storm of 10,000
reconnecting nodes 10,000 commits, each a round trip the Register waited on.
`ClaimBatcher` satisfies the same `NodeIdentities` protocol: a claim joins the
batch being gathered; the first claim of a batch starts its flush, which lets
the Registers of the same event-loop turn join, then writes the batch with
`claim_many` (one transaction) while the claims arriving meanwhile gather into
the next one. A quiet server pays one loop turn per claim; a storm pays one
commit per batch.

Not guaranteed: a claim's `now` is the latest of its batch's (they are a few
milliseconds apart). A store failure fails every claim of that batch (each
agent is told to retry).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from llmgw.store import Claim, InvalidValue, StoreError

log = logging.getLogger("llmgw.control.agentsvc")

# The most claims in one transaction: a batch stays a short one.
MAX_BATCH = 500


class BatchClaims(Protocol):
    """The store's `NodeIdentityRepository` satisfies it."""

    async def claim_many(
        self, requests: Sequence[tuple[str, str]], *, now: datetime
    ) -> list[Claim | InvalidValue]: ...


@dataclass(slots=True)
class _Waiting:
    node_id: str
    key_hash: str
    now: datetime
    answer: asyncio.Future[Claim]


class ClaimBatcher:
    """`claim` as the store's, batched; see the module docstring."""

    def __init__(self, *, store: BatchClaims, max_batch: int = MAX_BATCH) -> None:
        self._store = store
        self._max_batch = max_batch
        self._waiting: list[_Waiting] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0  # transactions written, for the agent service's metrics and tests

    async def claim(self, node_id: str, key_hash: str, *, now: datetime) -> Claim:
        answer: asyncio.Future[Claim] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(node_id, key_hash, now, answer))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="node id claims")
        return await answer

    async def _flush(self) -> None:
        while self._waiting:
            # The Registers handled in this loop turn join the batch.
            await asyncio.sleep(0)
            batch = self._waiting[: self._max_batch]
            del self._waiting[: self._max_batch]
            live = [w for w in batch if not w.answer.done()]  # a Register cancelled meanwhile
            if not live:
                continue
            now = max(w.now for w in live)
            try:
                answers = await self._store.claim_many(
                    [(w.node_id, w.key_hash) for w in live], now=now
                )
            except StoreError as exc:
                self._fail(live, exc)
                continue
            except BaseException as exc:
                # Not the store's: no Register may wait on it forever.
                self._fail([*live, *self._waiting], exc)
                self._waiting.clear()
                raise
            self.batches += 1
            for w, found in zip(live, answers, strict=True):
                if w.answer.done():
                    continue
                if isinstance(found, InvalidValue):
                    w.answer.set_exception(found)
                else:
                    w.answer.set_result(found)

    @staticmethod
    def _fail(waiting: Sequence[_Waiting], exc: BaseException) -> None:
        for w in waiting:
            if not w.answer.done():
                w.answer.set_exception(exc)
