"""A profile's `adapters` (room for LoRA adapters loaded at run time): each engine's flags
and environment, the round trip through stored JSON, and the profiles that are refused."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.control.catalog import InvalidModel, launch_key, model_to_dict, parse_model


def body(engine: str, **fields: Any) -> dict[str, Any]:
    gpus = 1 if engine in {"vllm", "sglang"} else 0
    return {
        "name": "base",
        "weights": "/models/base",
        "profiles": [{"name": engine, "engine": engine, "gpus": gpus, **fields}],
    }


def refused(data: object) -> InvalidModel:
    with pytest.raises(InvalidModel) as info:
        parse_model(data)
    return info.value


def test_vllm_gets_its_lora_flags_and_the_runtime_api_variable() -> None:
    raw = body(
        "vllm",
        engine_args=["--max-model-len", "4096"],
        env={"A": "1"},
        adapters={"max_loaded": 4, "max_rank": 32},
    )
    [p] = parse_model(raw).profiles
    assert p.engine_args == (
        "--max-model-len", "4096",
        "--enable-lora", "--max-loras", "4", "--max-lora-rank", "32",
    )  # fmt: skip
    assert p.env == {"A": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    # Stored and shown as the operator wrote it; read back to the same model.
    [shown] = model_to_dict(parse_model(raw))["profiles"]
    assert shown["engine_args"] == ["--max-model-len", "4096"]
    assert shown["env"] == {"A": "1"}
    assert shown["adapters"] == {"max_loaded": 4, "max_rank": 32}
    assert parse_model(model_to_dict(parse_model(raw))) == parse_model(raw)


def test_sglang_and_sim_get_theirs_and_the_rank_defaults_to_16() -> None:
    [sglang] = parse_model(body("sglang", adapters={"max_loaded": 2})).profiles
    assert sglang.engine_args == (
        "--enable-lora", "--max-loras-per-batch", "2", "--max-loaded-loras", "2",
        "--max-lora-rank", "16", "--lora-target-modules", "all",
    )  # fmt: skip
    [sim] = parse_model(body("sim", adapters={"max_loaded": 3, "max_rank": 8})).profiles
    assert sim.engine_args == ("--enable-lora", "--max-loras", "3", "--max-lora-rank", "8")
    assert sim.env == {}


def test_changing_the_slots_changes_what_replicas_run() -> None:
    two = parse_model(body("sim", adapters={"max_loaded": 2}))
    four = parse_model(body("sim", adapters={"max_loaded": 4}))
    assert launch_key(two) != launch_key(four)


def test_llamacpp_is_refused_with_what_to_do() -> None:
    error = refused(body("llamacpp", adapters={"max_loaded": 2}))
    assert error.field == "profiles.0.adapters"
    assert str(error).startswith("model 'base', profile 'llamacpp', field 'adapters': ")
    assert "cannot load LoRA adapters at run time" in str(error)
    assert "vllm, sglang or sim" in str(error)


def test_a_flag_set_twice_is_refused() -> None:
    error = refused(body("vllm", engine_args=["--max-loras=2"], adapters={"max_loaded": 4}))
    assert error.field == "profiles.0.adapters"
    assert "remove --max-loras from engine_args" in str(error)
    clash = refused(
        body(
            "vllm",
            env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "False"},
            adapters={"max_loaded": 1},
        )
    )
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING='False'" in str(clash)


@pytest.mark.parametrize(
    ("slots", "field"),
    [
        ({"max_loaded": 0}, "profiles.0.adapters.max_loaded"),
        ({"max_rank": 8}, "profiles.0.adapters.max_loaded"),
        ({"max_loaded": 1, "max_rank": "8"}, "profiles.0.adapters.max_rank"),
        ({"max_loaded": 1, "slots": 2}, "profiles.0.adapters.slots"),
    ],
)
def test_bad_slots_name_the_field(slots: dict[str, Any], field: str) -> None:
    assert refused(body("sim", adapters=slots)).field == field
