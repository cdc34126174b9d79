"""llama.cpp adapter: llama-cpp-python's server command, its environment and validation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from llmgw.engines import EngineLoad, EngineSettings, EngineSpec, ProfileError, adapter_for

SETTINGS = EngineSettings(python="/opt/llama/bin/python")


def _spec(**changes: Any) -> EngineSpec:
    spec = EngineSpec(
        shard_id="r3-s0",
        model="gemma-270m",
        engine="llamacpp",
        weights="/models/gemma-3-270m-Q4_K_M.gguf",
        port=8200,
    )
    return dataclasses.replace(spec, **changes)


def test_on_the_cpu() -> None:
    adapter = adapter_for("llamacpp", settings=SETTINGS)
    assert adapter.needs_gpus is False
    plan = adapter.plan(_spec(engine_args=("--n_ctx", "2048")))
    assert plan.argv == (
        "/opt/llama/bin/python",
        "-m",
        "llama_cpp.server",
        "--model",
        "/models/gemma-3-270m-Q4_K_M.gguf",
        "--model_alias",
        "gemma-270m",
        "--host",
        "127.0.0.1",
        "--port",
        "8200",
        "--interrupt_requests",
        "False",
        "--n_ctx",
        "2048",
    )
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert plan.unset_env == (
        "PORT",
        "HOST",
        "CONFIG_FILE",
        "API_KEY",
        "SSL_KEYFILE",
        "SSL_CERTFILE",
    )
    assert plan.ready_path == "/v1/models"
    assert plan.metrics_path is None


def test_on_gpus_offloads_every_layer_and_engine_args_can_offload_fewer() -> None:
    plan = adapter_for("llamacpp", settings=SETTINGS).plan(
        _spec(gpu_indices=(3,), engine_args=("--n_gpu_layers", "20", "--n_ctx=4096"))
    )
    assert plan.argv[-7:] == (
        "--interrupt_requests",
        "False",
        "--n_gpu_layers",
        "-1",
        "--n_gpu_layers",
        "20",
        "--n_ctx=4096",
    )
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "3"


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"weights": "/models/gemma"}, "weights", [".gguf", "'/models/gemma'"]),
        ({"weights": "google/gemma-3-270m"}, "weights", [".gguf"]),
        ({"weights": ""}, "weights", ["empty"]),
        ({"tensor_parallel_size": 2}, "tensor_parallel_size", ["must be 1", "got 2"]),
        ({"pipeline_parallel_size": 2}, "pipeline_parallel_size", ["must be 1"]),
        ({"gpu_memory_utilization": 0.9}, "gpu_memory_utilization", ["--n_gpu_layers"]),
        ({"env": {"PORT": "1"}}, "env", ["override --port", "`port` field"]),
        ({"env": {"host": "0.0.0.0"}}, "env", ["override --host"]),
        ({"env": {"API_KEY": "k"}}, "env", ["without a key"]),
        ({"env": {"CONFIG_FILE": "/etc/x.json"}}, "env", ["config file"]),
    ],
)
def test_validation_names_the_field_and_what_to_do(
    changes: dict[str, Any], field: str, words: list[str]
) -> None:
    with pytest.raises(ProfileError) as caught:
        adapter_for("llamacpp", settings=SETTINGS).plan(_spec(**changes))
    assert caught.value.field == field
    for word in words:
        assert word in caught.value.message


def test_an_upper_case_gguf_suffix_is_accepted() -> None:
    plan = adapter_for("llamacpp", settings=SETTINGS).plan(_spec(weights="/m/MODEL.GGUF"))
    assert plan.argv[4] == "/m/MODEL.GGUF"


@pytest.mark.parametrize(
    ("arg", "use"),
    [
        ("--model", "`weights` field"),
        ("--model_alias", "`model` field"),
        ("--model-alias=x", "`model` field"),
        ("--host", "`host` field"),
        ("--port=1", "`port` field"),
        ("--interrupt_requests", "cuts off the stream"),
        ("--interrupt_req", "cuts off the stream"),
        ("--config_file", "config file"),
        ("--api_key", "without a key"),
        ("--ssl_certfile", "plain HTTP"),
    ],
)
def test_engine_args_may_not_set_what_llmgw_manages(arg: str, use: str) -> None:
    with pytest.raises(ProfileError) as caught:
        adapter_for("llamacpp", settings=SETTINGS).plan(_spec(engine_args=(arg, "x")))
    assert caught.value.field == "engine_args"
    assert "llmgw manages" in caught.value.message
    assert use in caught.value.message


def test_metrics_are_always_unknown() -> None:
    adapter = adapter_for("llamacpp", settings=SETTINGS)
    assert adapter.parse_metrics('vllm:num_requests_running{model_name="m"} 3\n') == EngineLoad(
        running=None, waiting=None, kv_cache_usage=None
    )
