"""The simulated engine's composition root: settings in, a wired ASGI app out.

The text generator, prefix cache, scheduler, engine, counters, faults and
metrics registry are built here, each handed to the next as keyword arguments.
In-process tests use `build_app` without a server. `run_rank0` and
`run_follower` run one rank of a multi-node replica (`llmgw.sim.gang`).
"""

import asyncio
import os
import random
import time
from collections.abc import Callable
from typing import NoReturn

import typer
import uvicorn
from prometheus_client import CollectorRegistry

from llmgw.sim.app import SimApp, create_app
from llmgw.sim.cache import PrefixCache
from llmgw.sim.engine import Engine
from llmgw.sim.faults import Faults, FaultSettings
from llmgw.sim.gang import GangError, GangSettings, Rendezvous, fail, follow, gate
from llmgw.sim.lora import LoraAdapters
from llmgw.sim.metrics import SimCollector
from llmgw.sim.scheduler import Clock, Scheduler, Sleep, TimingModel
from llmgw.sim.settings import SimSettings
from llmgw.sim.sleep import SleepMode, SleepTimes
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
    scheduler = Scheduler(
        timing=timing,
        max_running=max_running,
        sleep=sleep,
        prefill_slots=0 if settings.zero_delay else settings.prefill_slots,
    )
    stats = SimStats(models=settings.models)
    adapters = None
    if settings.enable_lora:
        adapters = LoraAdapters(
            parent=settings.models[0],
            served=settings.models,
            max_loras=settings.max_loras,
            max_lora_rank=settings.max_lora_rank,
            load_time=0.0 if settings.zero_delay else settings.lora_load_time,
            sleep=sleep,
            wall_clock=wall_clock,
        )
    registry.register(SimCollector(stats=stats, cache=cache, adapters=adapters, clock=wall_clock))
    return create_app(
        models=settings.models,
        adapters=adapters,
        engine=Engine(scheduler=scheduler, cache=cache, adapters=adapters),
        generator=TextGenerator(seed=settings.seed),
        stats=stats,
        faults=Faults(settings=faults, rng=random.Random(settings.seed), exit_process=exit_process),
        registry=registry,
        load_time=settings.load_time,
        output_tokens=settings.output_tokens,
        embedding_dim=settings.embedding_dim,
        native_apis=settings.native_apis,
        sequence=settings.text == "sequence",
        reasoning_words=settings.reasoning_words,
        tool_calls=settings.tool_call_parser == "hermes" and settings.text == "sequence",
        tool_call_words=settings.tool_call_words,
        clock=clock,
        wall_clock=wall_clock,
        sleep_mode=SleepMode(
            times=SleepTimes(
                sleep_time=settings.sleep_time,
                wake_time=settings.wake_time,
                reload_time=settings.load_time,
            ),
            weights_bytes=settings.weights_bytes,
            sleep=sleep,
        ),
    )


def gang_settings(
    nnodes: int, node_rank: int, master_addr: str, master_port: int
) -> GangSettings | None:
    """The rank this process plays, or None alone; bad flags end the command (exit 2)."""
    if nnodes == 1:
        return None
    if node_rank >= nnodes:
        raise typer.BadParameter(f"must be below --nnodes ({nnodes})", param_hint="--node-rank")
    if not master_addr or not master_port:
        raise typer.BadParameter(
            "a multi-node rank needs rank 0's rendezvous: give --master-addr and --master-port",
            param_hint="--master-addr",
        )
    gang = GangSettings(
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        interface=os.environ.get("GLOO_SOCKET_IFNAME", ""),
    )
    print(gang.describe(), flush=True)
    return gang


def run_follower(gang: GangSettings) -> None:
    """A rank above 0: no HTTP; joins rank 0 and ends when it goes."""
    try:
        why = asyncio.run(follow(gang, sleep=asyncio.sleep))
    except GangError as exc:
        why = str(exc)
    fail(why)


def run_rank0(app: SimApp, gang: GangSettings, config: uvicorn.Config) -> None:
    """Rank 0: the rendezvous, and HTTP that is ready once every rank has joined."""

    async def main() -> None:
        rendezvous = Rendezvous(gang)
        try:
            await rendezvous.start()
        except GangError as exc:
            fail(str(exc))
        config.app = gate(app, rendezvous)
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        broken = asyncio.create_task(rendezvous.broken.wait())
        await asyncio.wait({serving, broken}, return_when=asyncio.FIRST_COMPLETED)
        if broken.done():
            fail(rendezvous.why)
        broken.cancel()
        await rendezvous.close()

    asyncio.run(main())
