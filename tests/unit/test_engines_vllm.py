"""vLLM adapter: the exact `vllm serve` command, its validation and its metrics."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from llmgw.engines import EngineLoad, EngineSettings, EngineSpec, ProfileError, adapter_for

SETTINGS = EngineSettings(python="/opt/engines/bin/python", vllm_command="/opt/vllm/bin/vllm")


def _spec(**changes: Any) -> EngineSpec:
    spec = EngineSpec(
        shard_id="r1-s0",
        model="llama-8b",
        engine="vllm",
        weights="meta-llama/Llama-3.1-8B-Instruct",
        port=8101,
        gpu_indices=(0,),
    )
    return dataclasses.replace(spec, **changes)


def test_tp2_on_gpus_2_and_3() -> None:
    adapter = adapter_for("vllm", settings=SETTINGS)
    plan = adapter.plan(
        _spec(
            gpu_indices=(2, 3),
            tensor_parallel_size=2,
            gpu_memory_utilization=0.85,
            host="0.0.0.0",
            env={"HF_HOME": "/data/hf"},
        )
    )
    assert plan.argv == (
        "/opt/vllm/bin/vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "0.0.0.0",
        "--port",
        "8101",
        "--served-model-name",
        "llama-8b",
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "1",
        "--gpu-memory-utilization",
        "0.85",
        "--shutdown-timeout",
        "30",
    )
    assert plan.env == {
        "HF_HOME": "/data/hf",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert plan.unset_env == ("VLLM_API_KEY",)
    assert plan.ready_path == "/health"
    assert plan.metrics_path == "/metrics"


def test_pipeline_parallel_without_memory_fraction_and_engine_args_appended_in_order() -> None:
    adapter = adapter_for("vllm", settings=EngineSettings(python="python3"))
    plan = adapter.plan(
        _spec(
            gpu_indices=(4, 5, 6, 7),
            tensor_parallel_size=2,
            pipeline_parallel_size=2,
            engine_args=("--max-model-len", "8192", "--enable-prefix-caching", "--dtype=bfloat16"),
        )
    )
    assert plan.argv == (
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "8101",
        "--served-model-name",
        "llama-8b",
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "2",
        "--shutdown-timeout",
        "30",
        "--max-model-len",
        "8192",
        "--enable-prefix-caching",
        "--dtype=bfloat16",
    )
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        (
            {"gpu_indices": (), "tensor_parallel_size": 2},
            "gpu_indices",
            ["vLLM without GPUs runs on the node's CPUs as one rank", "tensor_parallel_size 2"],
        ),
        (
            {
                "gpu_indices": (),
                "nodes": 2,
                "node_rank": 0,
                "master_addr": "10.0.0.1",
                "master_port": 9000,
            },
            "gpu_indices",
            ["on 2 node(s)", "give it GPUs"],
        ),
        (
            {"gpu_indices": (0, 1, 2), "tensor_parallel_size": 2},
            "gpu_indices",
            ["3 GPUs given", "tensor_parallel_size 2", "pipeline_parallel_size 1", "exactly 2"],
        ),
        (
            {"gpu_indices": (0, 1), "tensor_parallel_size": 2, "pipeline_parallel_size": 2},
            "gpu_indices",
            ["2 GPUs given", "tensor_parallel_size 2", "pipeline_parallel_size 2", "= 4"],
        ),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization", ["(0, 1]", "0.9"]),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization", ["(0, 1]", "1.5"]),
        ({"gpu_memory_utilization": -0.2}, "gpu_memory_utilization", ["(0, 1]"]),
        ({"gpu_memory_utilization": float("nan")}, "gpu_memory_utilization", ["(0, 1]"]),
        ({"weights": ""}, "weights", ["empty", "hub id"]),
        ({"weights": "   "}, "weights", ["empty"]),
        ({"weights": "--model"}, "weights", ["option"]),
        ({"port": 0}, "port", ["1..65535", "got 0"]),
        ({"port": 65536}, "port", ["1..65535", "got 65536"]),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size", ["at least 1"]),
        ({"env": {"VLLM_API_KEY": "k"}}, "env", ["VLLM_API_KEY", "without a key"]),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env", ["gpu_indices", "remove it"]),
    ],
)
def test_validation_names_the_field_and_what_to_do(
    changes: dict[str, object], field: str, words: list[str]
) -> None:
    adapter = adapter_for("vllm", settings=SETTINGS)
    with pytest.raises(ProfileError) as caught:
        adapter.plan(_spec(**changes))
    assert caught.value.field == field
    assert str(caught.value) == f"{field}: {caught.value.message}"
    for word in words:
        assert word in caught.value.message


def test_a_shard_without_gpus_runs_on_the_cpu_backend() -> None:
    """vLLM's CPU backend: no GPUs, one rank, and nothing CPU-specific on the line
    (the profile's engine_args and env carry the CPU settings)."""
    plan = adapter_for("vllm", settings=SETTINGS).plan(
        _spec(
            gpu_indices=(), engine_args=("--dtype", "float32"), env={"VLLM_CPU_KVCACHE_SPACE": "1"}
        )
    )
    assert plan.argv[1:3] == ("serve", "meta-llama/Llama-3.1-8B-Instruct")
    assert plan.argv[-2:] == ("--dtype", "float32")
    assert "--gpu-memory-utilization" not in plan.argv
    assert plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_a_full_memory_fraction_of_one_is_allowed() -> None:
    plan = adapter_for("vllm", settings=SETTINGS).plan(_spec(gpu_memory_utilization=1))
    assert plan.argv[-4:-2] == ("--gpu-memory-utilization", "1.0")


@pytest.mark.parametrize(("grace", "seconds"), [(None, "30"), (12.9, "12"), (0.5, "0")])
def test_a_stop_drains_for_the_profiles_drain_grace(grace: float | None, seconds: str) -> None:
    """vLLM aborts what is in flight on SIGTERM unless told to drain (--shutdown-timeout);
    llmgw tells it the drain grace, in whole seconds, never past the agent's own."""
    plan = adapter_for("vllm", settings=SETTINGS).plan(_spec(drain_grace=grace))
    at = plan.argv.index("--shutdown-timeout")
    assert plan.argv[at + 1] == seconds
    assert plan.timings.drain_grace == (30.0 if grace is None else grace)


@pytest.mark.parametrize(
    ("args", "shown", "use"),
    [
        (("--host", "0.0.0.0"), "'--host' sets --host", "`host` field"),
        (("--port=9000",), "'--port' sets --port", "`port` field"),
        (("--served-model-name", "x"), "sets --served-model-name", "`model` field"),
        (("--served_model_name", "x"), "'--served_model_name' sets", "`model` field"),
        (("--model", "w"), "sets --model", "`weights` field"),
        (("--tensor-parallel-size", "2"), "sets --tensor-parallel-size", "tensor_parallel_size"),
        (("-tp", "2"), "'-tp' sets -tp", "tensor_parallel_size"),
        (("-tp=2",), "'-tp' sets -tp", "tensor_parallel_size"),
        (("--tensor-parallel", "2"), "abbreviates --tensor-parallel-size", "tensor_parallel_size"),
        (
            ("--pipeline-parallel-size=2",),
            "sets --pipeline-parallel-size",
            "pipeline_parallel_size",
        ),
        (("-pp", "2"), "'-pp' sets -pp", "pipeline_parallel_size"),
        (
            ("--gpu-memory-utilization=0.5",),
            "sets --gpu-memory-utilization",
            "gpu_memory_utilization",
        ),
        (("--gpu_memory", "0.5"), "abbreviates --gpu-memory-utilization", "gpu_memory_utilization"),
        (("--data-parallel-size", "2"), "sets --data-parallel-size", "replica count"),
        (("-dp", "2"), "'-dp' sets -dp", "replica count"),
        (("--api-key", "secret"), "sets --api-key", "without a key"),
        (("--ssl-keyfile", "k.pem"), "sets --ssl-keyfile", "plain HTTP"),
    ],
)
def test_engine_args_may_not_set_what_llmgw_manages(
    args: tuple[str, ...], shown: str, use: str
) -> None:
    adapter = adapter_for("vllm", settings=SETTINGS)
    with pytest.raises(ProfileError) as caught:
        adapter.plan(_spec(engine_args=("--max-model-len", "4096", *args)))
    assert caught.value.field == "engine_args"
    assert shown in caught.value.message
    assert "llmgw manages" in caught.value.message
    assert use in caught.value.message


def test_values_that_look_like_options_but_are_not_managed_pass() -> None:
    args = (
        "--max-model-len",
        "4096",
        "--seed",
        "-1",
        "--model-impl",
        "vllm",
        "--port-range-ignored-by-llmgw",
        "x",
        "--hf-overrides",
        '{"port": 1}',
    )
    plan = adapter_for("vllm", settings=SETTINGS).plan(_spec(engine_args=args))
    assert plan.argv[-len(args) :] == args


# What vLLM 0.9 (V1 engine) serves, trimmed: HELP/TYPE lines, histograms and
# process metrics around the three gauges, labelled by engine and model name.
VLLM_V1_METRICS = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12116.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama-8b"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama-8b"} 2.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="llama-8b"} 0.30
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama-8b"} 0.4213483146067416
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="llama-8b"} 58021.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama-8b"} 13.04
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="llama-8b"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama-8b"} 163.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama-8b"} 163.0
"""

# vLLM 0.6 (V0): the older KV-cache name only, and a swapped-requests gauge.
VLLM_V0_METRICS = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0546875
"""

# Data parallelism inside one vLLM: one series per engine core.
VLLM_TWO_ENGINES = """\
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
"""


@pytest.mark.parametrize(
    ("text", "load"),
    [
        (VLLM_V1_METRICS, EngineLoad(running=7, waiting=2, kv_cache_usage=0.4213483146067416)),
        (VLLM_V0_METRICS, EngineLoad(running=1, waiting=0, kv_cache_usage=0.0546875)),
        (VLLM_TWO_ENGINES, EngineLoad(running=7, waiting=5, kv_cache_usage=0.75)),
        ("", EngineLoad(running=None, waiting=None, kv_cache_usage=None)),
        (
            "<html>502 Bad Gateway</html>\nvllm:num_requests_running{oops 3\n",
            EngineLoad(running=None, waiting=None, kv_cache_usage=None),
        ),
        (
            'vllm:num_requests_running{model_name="m"} 2\n',
            EngineLoad(running=2, waiting=None, kv_cache_usage=None),
        ),
    ],
)
def test_metrics(text: str, load: EngineLoad) -> None:
    assert adapter_for("vllm", settings=SETTINGS).parse_metrics(text) == load
