"""Sim adapter: the `llmgw sim` command, and reading the sim's real metrics page."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llmgw.engines import EngineLoad, EngineSettings, EngineSpec, ProfileError, adapter_for
from llmgw.sim.cache import PrefixCache
from llmgw.sim.metrics import SimCollector
from llmgw.sim.stats import SimStats

SETTINGS = EngineSettings(python="python3", llmgw_command=("/venv/bin/llmgw",))


def _spec(**changes: Any) -> EngineSpec:
    spec = EngineSpec(shard_id="r4-s0", model="sim-a", engine="sim", weights="", port=9001)
    return dataclasses.replace(spec, **changes)


def test_command_without_gpus_or_weights() -> None:
    adapter = adapter_for("sim", settings=SETTINGS)
    assert adapter.needs_gpus is False
    plan = adapter.plan(_spec(engine_args=("--load-time", "1", "--itl=0.001")))
    assert plan.argv == (
        "/venv/bin/llmgw",
        "sim",
        "--host",
        "127.0.0.1",
        "--port",
        "9001",
        "--model",
        "sim-a",
        "--load-time",
        "1",
        "--itl=0.001",
    )
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert plan.unset_env == ()
    assert plan.ready_path == "/health"
    assert plan.metrics_path == "/metrics"


def test_default_command_is_this_interpreter_and_gpus_are_pinned() -> None:
    plan = adapter_for("sim", settings=EngineSettings(python="python3")).plan(
        _spec(gpu_indices=(0, 1), tensor_parallel_size=4, weights="ignored/at-all")
    )
    assert plan.argv[:4] == (sys.executable, "-m", "llmgw", "sim")
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"


@pytest.mark.parametrize(
    ("args", "use"),
    [
        (("--model", "other"), "`model` field"),
        (("--port=1",), "`port` field"),
        (("--host", "::"), "`host` field"),
    ],
)
def test_engine_args_may_not_set_what_llmgw_manages(args: tuple[str, ...], use: str) -> None:
    with pytest.raises(ProfileError) as caught:
        adapter_for("sim", settings=SETTINGS).plan(_spec(engine_args=args))
    assert caught.value.field == "engine_args"
    assert use in caught.value.message


def test_abbreviations_are_not_options_of_the_sim() -> None:
    # click expands no prefixes, so "--mod" is the sim's business (it refuses it).
    plan = adapter_for("sim", settings=SETTINGS).plan(_spec(engine_args=("--mod", "x")))
    assert plan.argv[-2:] == ("--mod", "x")


def test_reads_the_metrics_page_the_sim_serves() -> None:
    stats = SimStats(models=["sim-a", "sim-b"])
    stats.models["sim-a"].running = 3
    stats.models["sim-a"].waiting = 1
    stats.models["sim-b"].running = 2
    registry = CollectorRegistry()
    registry.register(
        SimCollector(stats=stats, cache=PrefixCache(block_size=16, capacity_blocks=8))
    )
    text = generate_latest(registry).decode()
    load = adapter_for("sim", settings=SETTINGS).parse_metrics(text)
    assert load == EngineLoad(running=5, waiting=1, kv_cache_usage=0.0)
