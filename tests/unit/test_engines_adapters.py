"""What every adapter shares: adapter_for, the error tree and the common checks."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

from llmgw.engines import (
    KNOWN_ENGINES,
    EngineAdapter,
    EngineError,
    EngineSettings,
    EngineSpec,
    LlamaCppAdapter,
    ProfileError,
    SglangAdapter,
    SimAdapter,
    UnknownEngine,
    VllmAdapter,
    adapter_for,
)

SETTINGS = EngineSettings(python="/opt/engines/bin/python")

VALID: dict[str, EngineSpec] = {
    "vllm": EngineSpec("s", "m", "vllm", "org/model", 8000, gpu_indices=(0,)),
    "sglang": EngineSpec("s", "m", "sglang", "org/model", 8000, gpu_indices=(0,)),
    "llamacpp": EngineSpec("s", "m", "llamacpp", "/w/model.gguf", 8000),
    "sim": EngineSpec("s", "m", "sim", "", 8000),
}


def _valid(engine: str, **changes: Any) -> EngineSpec:
    return dataclasses.replace(VALID[engine], **changes)


def test_known_engines_and_their_adapters() -> None:
    assert KNOWN_ENGINES == ("vllm", "sglang", "llamacpp", "sim")
    kinds = {name: type(adapter_for(name, settings=SETTINGS)) for name in KNOWN_ENGINES}
    assert kinds == {
        "vllm": VllmAdapter,
        "sglang": SglangAdapter,
        "llamacpp": LlamaCppAdapter,
        "sim": SimAdapter,
    }
    for name in KNOWN_ENGINES:
        adapter: EngineAdapter = adapter_for(name, settings=SETTINGS)
        assert adapter.name == name
        assert adapter.needs_gpus is (name == "sglang")
        assert adapter.gpu_ranks is (name in {"vllm", "sglang"})


def test_unknown_engine_lists_the_known_ones() -> None:
    with pytest.raises(UnknownEngine) as caught:
        adapter_for("tgi", settings=SETTINGS)
    error = caught.value
    assert error.field == "engine"
    assert error.engine == "tgi"
    assert str(error) == "engine: unknown engine 'tgi'; known engines: vllm, sglang, llamacpp, sim"
    assert isinstance(error, ProfileError)
    assert isinstance(error, EngineError)
    assert isinstance(error, ValueError)


def test_errors_survive_pickling() -> None:
    for error in (ProfileError("port", "must be in 1..65535, got 0"), UnknownEngine("tgi")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert (copy.field, copy.message, str(copy)) == (error.field, error.message, str(error))


@pytest.mark.parametrize("engine", KNOWN_ENGINES)
def test_an_adapter_refuses_a_spec_for_another_engine(engine: str) -> None:
    other = "sim" if engine != "sim" else "vllm"
    with pytest.raises(ProfileError) as caught:
        adapter_for(engine, settings=SETTINGS).validate(_valid(other))
    assert caught.value.field == "engine"
    assert "adapter_for(spec.engine)" in caught.value.message


@pytest.mark.parametrize("engine", KNOWN_ENGINES)
@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"model": ""}, "model", ["empty", "the name clients send"]),
        ({"model": "-x"}, "model", ["starts with '-'"]),
        ({"host": ""}, "host", ["empty"]),
        ({"host": "0.0.0.0 ::"}, "host", ["whitespace"]),
        ({"port": 0}, "port", ["1..65535", "got 0"]),
        ({"port": 70000}, "port", ["got 70000"]),
        ({"gpu_indices": (0, 0)}, "gpu_indices", ["twice"]),
        ({"gpu_indices": (-1,)}, "gpu_indices", [">= 0"]),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size", ["at least 1"]),
        ({"engine_args": ("--x", "a\0b")}, "engine_args", ["argument 1", "NUL"]),
        ({"env": {"": "x"}}, "env", ["not a valid variable name"]),
        ({"env": {"A=B": "x"}}, "env", ["not a valid variable name"]),
        ({"env": {"A": "x\0"}}, "env", ["NUL"]),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0,1"}}, "env", ["gpu_indices", "remove it"]),
    ],
)
def test_common_checks(engine: str, changes: dict[str, Any], field: str, words: list[str]) -> None:
    with pytest.raises(ProfileError) as caught:
        adapter_for(engine, settings=SETTINGS).plan(_valid(engine, **changes))
    assert caught.value.field == field
    for word in words:
        assert word in caught.value.message


@pytest.mark.parametrize("engine", KNOWN_ENGINES)
def test_profile_env_is_passed_and_the_gpu_variables_are_always_set(engine: str) -> None:
    env = {"HF_HOME": "/data/hf", "OMP_NUM_THREADS": "4"}
    spec = _valid(engine, env=env)
    plan = adapter_for(engine, settings=SETTINGS).plan(spec)
    assert plan.env["HF_HOME"] == "/data/hf"
    assert plan.env["OMP_NUM_THREADS"] == "4"
    assert plan.env["CUDA_VISIBLE_DEVICES"] == ",".join(str(i) for i in spec.gpu_indices)
    assert plan.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    plan.env["HF_HOME"] = "changed"
    assert env == {"HF_HOME": "/data/hf", "OMP_NUM_THREADS": "4"}


@pytest.mark.parametrize("engine", KNOWN_ENGINES)
def test_engine_args_come_last_and_in_order(engine: str) -> None:
    args = ("--zeta", "1", "--alpha=2", "positional", "--beta")
    plan = adapter_for(engine, settings=SETTINGS).plan(_valid(engine, engine_args=args))
    assert plan.argv[-len(args) :] == args


@pytest.mark.parametrize("engine", KNOWN_ENGINES)
def test_validate_accepts_the_valid_spec(engine: str) -> None:
    adapter_for(engine, settings=SETTINGS).validate(VALID[engine])
