"""The simulated engine's composition root: settings in, a wired ASGI app out.

The text generator, prefix cache, scheduler, engine, counters, faults and
metrics registry are built here, each handed to the next as keyword arguments.
In-process tests use `build_app` without a server.
"""

import asyncio
import os
import random
import time
from collections.abc import Callable
from typing import NoReturn

from prometheus_client import CollectorRegistry

from llmgw.sim.app import SimApp, create_app
from llmgw.sim.cache import PrefixCache
from llmgw.sim.engine import Engine
from llmgw.sim.faults import Faults, FaultSettings
from llmgw.sim.metrics import SimCollector
from llmgw.sim.scheduler import Clock, Scheduler, Sleep, TimingModel
from llmgw.sim.settings import SimSettings
from llmgw.sim.stats import SimStats
from llmgw.sim.tokens import TextGenerator


def build_app(
    settings: SimSettings,
    *,
    faults: FaultSettings,
    registry: CollectorRegistry,
    clock: Clock = time.monotonic,
    wall_clock: Clock = time.time,
    sleep: Sleep = asyncio.sleep,
    exit_process: Callable[[int], NoReturn] = os._exit,
) -> SimApp:
    """Wire a sim app from settings; the caller owns `registry` (never the global one)."""
    if settings.zero_delay:
        timing = TimingModel(prefill_per_token=0.0, itl=0.0, itl_per_running=0.0)
        max_running: int | None = None
    else:
        timing = TimingModel(
            prefill_per_token=settings.prefill_per_token,
            itl=settings.itl,
            itl_per_running=settings.itl_per_running,
            prefill_interference=settings.prefill_interference,
        )
        max_running = settings.max_running
    cache = PrefixCache(block_size=settings.block_size, capacity_blocks=settings.cache_blocks)
    scheduler = Scheduler(timing=timing, max_running=max_running, sleep=sleep)
    stats = SimStats(models=settings.models)
    registry.register(SimCollector(stats=stats, cache=cache))
    return create_app(
        models=settings.models,
        engine=Engine(scheduler=scheduler, cache=cache),
        generator=TextGenerator(seed=settings.seed),
        stats=stats,
        faults=Faults(settings=faults, rng=random.Random(settings.seed), exit_process=exit_process),
        registry=registry,
        load_time=settings.load_time,
        output_tokens=settings.output_tokens,
        embedding_dim=settings.embedding_dim,
        clock=clock,
        wall_clock=wall_clock,
    )
