"""SGLang adapter: the exact launch_server command, its validation and its metrics."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from llmgw.engines import EngineLoad, EngineSettings, EngineSpec, ProfileError, adapter_for

SETTINGS = EngineSettings(python="/opt/sglang/bin/python")


def _spec(**changes: Any) -> EngineSpec:
    spec = EngineSpec(
        shard_id="r2-s0",
        model="qwen-7b",
        engine="sglang",
        weights="/models/Qwen2.5-7B-Instruct",
        port=30001,
        gpu_indices=(1,),
    )
    return dataclasses.replace(spec, **changes)


def test_single_gpu_with_memory_fraction() -> None:
    plan = adapter_for("sglang", settings=SETTINGS).plan(_spec(gpu_memory_utilization=0.8))
    assert plan.argv == (
        "/opt/sglang/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/Qwen2.5-7B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "30001",
        "--served-model-name",
        "qwen-7b",
        "--tp-size",
        "1",
        "--mem-fraction-static",
        "0.8",
        "--enable-metrics",
    )
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert plan.unset_env == ()
    assert plan.ready_path == "/health"
    assert plan.metrics_path == "/metrics"


def test_tp2_pp2_and_engine_args_after_enable_metrics() -> None:
    plan = adapter_for("sglang", settings=SETTINGS).plan(
        _spec(
            gpu_indices=(0, 1, 2, 3),
            tensor_parallel_size=2,
            pipeline_parallel_size=2,
            engine_args=("--context-length", "32768", "--enable-torch-compile"),
        )
    )
    assert plan.argv == (
        "/opt/sglang/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/Qwen2.5-7B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "30001",
        "--served-model-name",
        "qwen-7b",
        "--tp-size",
        "2",
        "--pp-size",
        "2",
        "--enable-metrics",
        "--context-length",
        "32768",
        "--enable-torch-compile",
    )
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_repeating_enable_metrics_is_harmless() -> None:
    plan = adapter_for("sglang", settings=SETTINGS).plan(_spec(engine_args=("--enable-metrics",)))
    assert plan.argv[-2:] == ("--enable-metrics", "--enable-metrics")


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"gpu_indices": ()}, "gpu_indices", ["SGLang needs GPUs"]),
        (
            {"gpu_indices": (0,), "tensor_parallel_size": 2},
            "gpu_indices",
            ["1 GPU given", "tensor_parallel_size 2", "exactly 2"],
        ),
        ({"gpu_memory_utilization": 1.01}, "gpu_memory_utilization", ["(0, 1]"]),
        ({"weights": ""}, "weights", ["empty"]),
        ({"port": -1}, "port", ["1..65535"]),
        ({"pipeline_parallel_size": 0}, "pipeline_parallel_size", ["at least 1"]),
        ({"env": {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}}, "env", ["PCI_BUS_ID", "remove it"]),
    ],
)
def test_validation_names_the_field_and_what_to_do(
    changes: dict[str, Any], field: str, words: list[str]
) -> None:
    with pytest.raises(ProfileError) as caught:
        adapter_for("sglang", settings=SETTINGS).plan(_spec(**changes))
    assert caught.value.field == field
    for word in words:
        assert word in caught.value.message


@pytest.mark.parametrize(
    ("arg", "use"),
    [
        ("--model-path=/other", "`weights` field"),
        ("--model", "`weights` field"),
        ("--host", "`host` field"),
        ("--port", "`port` field"),
        ("--served-model-name", "`model` field"),
        ("--tp-size", "tensor_parallel_size"),
        ("--tensor-parallel-size=2", "tensor_parallel_size"),
        ("--tp", "tensor_parallel_size"),
        ("--pp-size", "pipeline_parallel_size"),
        ("--pipeline-parallel-size", "pipeline_parallel_size"),
        ("--mem-fraction-static=0.7", "gpu_memory_utilization"),
        ("--mem_fraction_static", "gpu_memory_utilization"),
        ("--dp-size", "replica count"),
        ("--dp", "replica count"),
        ("--data-parallel-size", "replica count"),
        ("--api-key", "without a key"),
    ],
)
def test_engine_args_may_not_set_what_llmgw_manages(arg: str, use: str) -> None:
    with pytest.raises(ProfileError) as caught:
        adapter_for("sglang", settings=SETTINGS).plan(_spec(engine_args=(arg, "2")))
    assert caught.value.field == "engine_args"
    assert repr(arg.split("=", maxsplit=1)[0]) in caught.value.message
    assert use in caught.value.message


# SGLang 0.4 with --enable-metrics, one scheduler (labels as the docs show them).
SGLANG_METRICS = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="qwen-7b"} 8.128902e+06
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen-7b"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen-7b"} 3.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen-7b"} 0.28
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="qwen-7b"} 0.007507552643049313
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="qwen-7b"} 1.0
sglang:time_to_first_token_seconds_sum{model_name="qwen-7b"} 2.35
"""

# Newer SGLang: per-rank labels. Both TP ranks report the same batch (metrics for
# all schedulers); two DP ranks each have their own.
SGLANG_RANKS = """\
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0",dp_rank="0"} 4.0
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="1",dp_rank="0"} 4.0
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0",dp_rank="1"} 2.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0",dp_rank="0"} 1.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0",dp_rank="1"} 0.0
sglang:token_usage{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0",dp_rank="0"} 0.5
sglang:token_usage{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0",dp_rank="1"} 0.25
"""

# Priority scheduling: one series per priority bucket plus the empty-priority total.
SGLANG_PRIORITY = """\
sglang:num_running_reqs{pp_rank="0",priority="",tp_rank="0"} 14.0
sglang:num_running_reqs{pp_rank="0",priority="-1",tp_rank="0"} 0.0
sglang:num_running_reqs{pp_rank="0",priority="0",tp_rank="0"} 14.0
sglang:num_queue_reqs{pp_rank="0",priority="",tp_rank="0"} 2.0
sglang:num_queue_reqs{pp_rank="0",priority="-1",tp_rank="0"} 2.0
sglang:token_usage{pp_rank="0",priority="",tp_rank="0"} 0.9
"""


@pytest.mark.parametrize(
    ("text", "load"),
    [
        (SGLANG_METRICS, EngineLoad(running=12, waiting=3, kv_cache_usage=0.28)),
        (SGLANG_RANKS, EngineLoad(running=6, waiting=1, kv_cache_usage=0.5)),
        (SGLANG_PRIORITY, EngineLoad(running=14, waiting=2, kv_cache_usage=0.9)),
        (
            'vllm:num_requests_running{model_name="m"} 9\n',
            EngineLoad(running=None, waiting=None, kv_cache_usage=None),
        ),
    ],
)
def test_metrics(text: str, load: EngineLoad) -> None:
    assert adapter_for("sglang", settings=SETTINGS).parse_metrics(text) == load
