"""One request's life on the simulated engine: queue, prefill, decode, release.

`Engine.generate` admits the request through the scheduler, looks its prompt up in the
prefix cache, sleeps the prefill, then produces the given tokens one inter-token gap
apart (longer while other requests' prefills stall the batch), handing each to `emit`
(streaming) or just spending the time (non-streaming).
A request for a LoRA adapter (`llmgw.sim.lora`) first waits for the adapter to be
swapped into a slot if it is not resident.
An injected stall stops the token flow for good; only cancellation (the client went
away) ends such a request. An injected cut (`cut_after`) raises `GenerationCut` after
that many tokens, for the caller to break the connection or exit. The running slot
is released however the request ends.

Not guaranteed: tokens are counted in `generation_tokens` as they are produced, so a
cancelled request's partial output is counted, as in vLLM; nothing is counted for a
request still queued when it is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence

from llmgw.sim.cache import PrefixCache
from llmgw.sim.lora import LoraAdapters
from llmgw.sim.scheduler import Scheduler
from llmgw.sim.stats import ModelCounters

Emit = Callable[[int, str], Awaitable[None]]


class GenerationCut(Exception):
    """A generation was cut short on purpose after `cut_after` tokens."""


class Engine:
    """Runs requests through the scheduler and the prefix cache."""

    def __init__(
        self, *, scheduler: Scheduler, cache: PrefixCache, adapters: LoraAdapters | None = None
    ) -> None:
        self.scheduler = scheduler
        self.cache = cache
        self.adapters = adapters

    async def generate(
        self,
        *,
        model: str,
        counters: ModelCounters,
        prompt: Sequence[Hashable],
        tokens: Sequence[str],
        stall_after: int | None,
        slow_start: float,
        emit: Emit | None,
        cut_after: int | None = None,
    ) -> None:
        scheduler = self.scheduler
        await scheduler.admit(counters)
        adapters = self.adapters
        lora = adapters is not None and adapters.get(model) is not None
        began = False
        try:
            if lora:
                assert adapters is not None
                await adapters.begin(model)
                began = True
            cached = self.cache.match_and_insert(model, prompt)
            counters.prefix_cache_queries += len(prompt)
            counters.prefix_cache_hits += cached
            counters.prompt_tokens += len(prompt)
            await scheduler.prefill(len(prompt) - cached, extra_seconds=slow_start)
            if (
                emit is None
                and stall_after is None
                and cut_after is None
                and scheduler.timing.instant
            ):
                counters.generation_tokens += len(tokens)
                return
            paced = not scheduler.timing.instant
            cursor = scheduler.decoding()
            for index, token in enumerate(tokens):
                if index and paced:
                    await scheduler.inter_token(cursor)
                if stall_after is not None and index >= stall_after:
                    await _forever()
                if cut_after is not None and index >= cut_after:
                    raise GenerationCut
                counters.generation_tokens += 1
                if emit is not None:
                    await emit(index, token)
        finally:
            scheduler.release(counters)
            if began:
                assert adapters is not None
                adapters.end(model)

    async def encode(
        self, *, counters: ModelCounters, prompt_tokens: int, slow_start: float
    ) -> None:
        """An embedding request: admission and prefill time, no cache, no decode."""
        scheduler = self.scheduler
        await scheduler.admit(counters)
        try:
            counters.prompt_tokens += prompt_tokens
            await scheduler.prefill(prompt_tokens, extra_seconds=slow_start)
        finally:
            scheduler.release(counters)


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()
