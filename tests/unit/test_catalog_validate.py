"""The catalog's validation rules: every rule accepted and refused, with the field it names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmgw.config import ConfigError, ModelConfig, load_server_config
from llmgw.control.catalog import (
    PINNED,
    CatalogModel,
    InvalidModel,
    Profile,
    model_from_config,
    model_to_dict,
    parse_model,
)

GIB = 1 << 30


def model(**fields: Any) -> dict[str, Any]:
    """A valid model body (one sim profile) with `fields` laid on top."""
    body: dict[str, Any] = {
        "name": "llama",
        "weights": "meta-llama/Meta-Llama-3-8B-Instruct",
        "profiles": [{"name": "tp1", "engine": "vllm", "gpus": 1}],
    }
    body.update(fields)
    return body


def profile(**fields: Any) -> dict[str, Any]:
    """A valid model whose single profile has `fields` laid on top of a vLLM one."""
    return model(profiles=[{"name": "tp1", "engine": "vllm", "gpus": 1, **fields}])


def refused(data: object) -> InvalidModel:
    with pytest.raises(InvalidModel) as info:
        parse_model(data)
    return info.value


# ---- a full model, its defaults, and the round trip ----


def test_a_full_model_is_read_with_every_field() -> None:
    parsed = parse_model(
        {
            "name": "meta-llama/Llama-3.1-70B:fp8",
            "aliases": ["llama-70b", "gpt-4o"],
            "weights": "/models/llama-70b",
            "profiles": [
                {
                    "name": "tp4-h100",
                    "engine": "vllm",
                    "engine_args": ["--max-model-len", "8192"],
                    "env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
                    "gpus": 4,
                    "gpu_memory": "80GB",
                    "gpu_kind": " H100 ",
                    "labels": {"zone": "eu-1"},
                    "tensor_parallel_size": 4,
                    "gpu_memory_utilization": 0.85,
                },
                {"name": "tp8-l40s", "engine": "sglang", "gpus": 8, "gpu_memory": 48 * GIB},
            ],
            "min_replicas": 1,
            "max_replicas": 3,
            "keep_alive": "1h30m",
            "activation": False,
            "target_in_flight": 8,
            "target_queue_depth": 4,
            "target_kv_use": 0.75,
            "target_queue_wait": 1.5,
            "scale_down_delay": "2m",
        },
        source="store",
    )
    assert parsed == CatalogModel(
        name="meta-llama/Llama-3.1-70B:fp8",
        weights="/models/llama-70b",
        aliases=("llama-70b", "gpt-4o"),
        profiles=(
            Profile(
                name="tp4-h100",
                engine="vllm",
                engine_args=("--max-model-len", "8192"),
                env={"VLLM_LOGGING_LEVEL": "DEBUG"},
                gpus=4,
                gpu_memory=80 * 10**9,
                gpu_kind="H100",
                labels={"zone": "eu-1"},
                tensor_parallel_size=4,
                gpu_memory_utilization=0.85,
            ),
            Profile(name="tp8-l40s", engine="sglang", gpus=8, gpu_memory=48 * GIB),
        ),
        min_replicas=1,
        max_replicas=3,
        keep_alive=5400.0,
        activation=False,
        source="store",
        target_in_flight=8,
        target_queue_depth=4,
        target_kv_use=0.75,
        target_queue_wait=1.5,
        scale_down_delay=120.0,
    )
    assert parse_model(model_to_dict(parsed)) == parsed


def test_defaults_and_the_profile_name_default() -> None:
    parsed = parse_model(
        {"name": "tiny", "weights": "/m/tiny.gguf", "profiles": [{"engine": "llamacpp"}]},
        source="config",
    )
    assert parsed.source == "config"
    assert (parsed.aliases, parsed.min_replicas, parsed.max_replicas) == ((), 0, 1)
    assert (parsed.keep_alive, parsed.activation, parsed.pinned) == (300.0, True, False)
    (only,) = parsed.profiles
    assert only == Profile(name="llamacpp", engine="llamacpp")
    assert only.tensor_parallel == 1


def test_model_to_dict_is_plain_json_that_reads_back() -> None:
    parsed = parse_model(
        model(keep_alive=-1, profiles=[{"engine": "vllm", "gpus": 2, "gpu_memory": "24GiB"}])
    )
    data = model_to_dict(parsed)
    assert data == {
        "name": "llama",
        "aliases": [],
        "weights": "meta-llama/Meta-Llama-3-8B-Instruct",
        "profiles": [
            {
                "name": "vllm",
                "engine": "vllm",
                "engine_args": [],
                "env": {},
                "gpus": 2,
                "gpu_memory": 24 * GIB,
                "gpu_kind": None,
                "labels": {},
                "tensor_parallel_size": 0,
                "gpu_memory_utilization": 0.0,
            }
        ],
        "min_replicas": 0,
        "max_replicas": 1,
        "keep_alive": -1,
        "activation": True,
        "target_in_flight": None,
        "target_queue_depth": None,
        "target_kv_use": None,
        "target_queue_wait": None,
        "scale_down_delay": 60,
    }
    assert isinstance(data["keep_alive"], int) and parsed.keep_alive == PINNED
    assert parse_model(data) == parsed
    fractional = parse_model(model(keep_alive="1.5s"))
    assert model_to_dict(fractional)["keep_alive"] == 1.5
    # A whole number of seconds reads back as it was written.
    assert model_to_dict(parse_model(model(target_queue_wait=2)))["target_queue_wait"] == 2
    assert model_to_dict(parse_model(model(target_queue_wait=0.5)))["target_queue_wait"] == 0.5


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("target_in_flight", 0, "greater than or equal to 1"),
        ("target_in_flight", "8", "valid integer"),
        ("target_queue_depth", 0, "greater than or equal to 1"),
        ("target_queue_depth", 2.5, "valid integer"),
        ("target_queue_depth", True, "valid integer"),
        ("target_kv_use", 0, "greater than 0"),
        ("target_kv_use", 1.5, "less than or equal to 1"),
        ("target_kv_use", "0.8", "valid number"),
        ("target_kv_use", float("nan"), "finite number"),
        ("target_queue_wait", 0, "greater than 0"),
        ("target_queue_wait", -2.5, "greater than 0"),
        ("target_queue_wait", "2s", "valid number"),
        ("target_queue_wait", True, "valid number"),
        ("target_queue_wait", float("inf"), "finite number"),
        ("scale_down_delay", "-5s", "'-5s' is not a delay; give zero or more seconds"),
        ("scale_down_delay", -1, "-1 is not a delay"),
        ("scale_down_delay", "soon", "'soon' is not a delay"),
    ],
)
def test_bad_scaling_fields_are_named(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidModel) as info:
        parse_model(model(**{field: value}))
    assert info.value.field == field
    assert message in str(info.value)


def test_model_from_config_applies_the_engine_checks() -> None:
    cfg = ModelConfig.model_validate(profile(engine="sglang", gpus=0))
    with pytest.raises(InvalidModel) as info:
        model_from_config(cfg, source="config")
    assert info.value.field == "profiles.0.gpus"
    good = ModelConfig.model_validate(model())
    assert model_from_config(good, source="config").source == "config"


# ---- names and aliases ----


@pytest.mark.parametrize(
    "name", ["a", "Qwen2.5-7B", "meta-llama/Llama-3:8b", "m_1", "x" * 128, "7b"]
)
def test_good_names(name: str) -> None:
    assert parse_model(model(name=name)).name == name


@pytest.mark.parametrize("name", ["", "-llama", ".x", "has space", "x" * 129, "é", "a'b"])
def test_bad_names_name_the_field(name: str) -> None:
    error = refused(model(name=name))
    assert error.field == "name"
    assert "field 'name'" in error.message and "is not a model name" in error.message


def test_a_missing_name_says_so() -> None:
    body = model()
    del body["name"]
    error = refused(body)
    assert error.field == "name"
    assert error.message == "model (no valid name), field 'name': Field required"


def test_aliases() -> None:
    assert parse_model(model(aliases=["l3", "gpt-4o"])).aliases == ("l3", "gpt-4o")
    cases = {
        "the model's own name": ["llama"],
        "listed twice": ["l3", "l3"],
        "is not a model name": ["bad alias"],
    }
    for words, aliases in cases.items():
        error = refused(model(aliases=aliases))
        assert error.field == "aliases"
        assert error.message.startswith("model 'llama', field 'aliases': alias ")
        assert words in error.message


# ---- weights ----


@pytest.mark.parametrize("weights", ["", "   ", " /m/x"])
def test_bad_weights(weights: str) -> None:
    error = refused(model(weights=weights))
    assert error.field == "weights"
    assert error.message.startswith("model 'llama', field 'weights': ")


def test_weights_that_look_like_an_option_are_refused_by_the_engine_check() -> None:
    error = refused(model(weights="--help"))
    assert error.field == "weights"
    assert error.message.startswith("model 'llama', profile 'tp1', field 'weights': ")
    assert "read it as an option" in error.message


def test_llamacpp_needs_a_gguf_file() -> None:
    error = refused(model(weights="/m/llama", profiles=[{"engine": "llamacpp"}]))
    assert error.field == "weights"
    assert "profile 'llamacpp', field 'weights'" in error.message and ".gguf" in error.message


# ---- replicas, keep_alive, activation ----


def test_replica_counts() -> None:
    assert parse_model(model(min_replicas=2, max_replicas=2)).min_replicas == 2
    error = refused(model(min_replicas=2, max_replicas=1))
    assert error.field == "max_replicas"
    assert error.message == (
        "model 'llama', field 'max_replicas': max_replicas (1) is below min_replicas (2); "
        "raise max_replicas or lower min_replicas"
    )
    assert refused(model(min_replicas=-1)).field == "min_replicas"
    assert refused(model(max_replicas=0)).field == "max_replicas"
    assert refused(model(max_replicas=True)).field == "max_replicas"
    assert refused(model(min_replicas=1.5)).field == "min_replicas"


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (300, 300.0),
        (0, 0.0),
        (2.5, 2.5),
        (-1, PINNED),
        ("-1", PINNED),
        ("600", 600.0),
        ("300s", 300.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("2d", 172800.0),
        ("500ms", 0.5),
        (" 5M ", 300.0),
    ],
)
def test_keep_alive_accepts_seconds_and_durations(given: object, seconds: float) -> None:
    assert parse_model(model(keep_alive=given)).keep_alive == seconds


@pytest.mark.parametrize("given", [-2, "-5m", "5x", "", "forever", True, None, float("inf"), [5]])
def test_keep_alive_refuses_other_values(given: object) -> None:
    error = refused(model(keep_alive=given))
    assert error.field == "keep_alive"
    assert error.message.startswith("model 'llama', field 'keep_alive': ")


def test_activation_must_be_a_boolean() -> None:
    assert parse_model(model(activation=False)).activation is False
    assert refused(model(activation="maybe")).field == "activation"


# ---- profiles ----


def test_profiles_are_required_and_their_names_unique() -> None:
    assert refused(model(profiles=[])).field == "profiles"
    body = model()
    del body["profiles"]
    assert refused(body).field == "profiles"
    error = refused(model(profiles=[{"engine": "sim"}, {"engine": "sim"}]))
    assert error.field == "profiles"
    assert error.message.startswith(
        "model 'llama', field 'profiles': profiles 0 and 1 are both named 'sim'"
    )
    two = parse_model(model(profiles=[{"engine": "sim"}, {"name": "sim-2", "engine": "sim"}]))
    assert [p.name for p in two.profiles] == ["sim", "sim-2"]


def test_a_bad_profile_name() -> None:
    error = refused(profile(name="tp 1"))
    assert error.field == "profiles.0.name"
    assert error.message.startswith("model 'llama', profile 'tp 1', field 'name': ")


def test_the_engine_must_be_known() -> None:
    error = refused(profile(engine="tgi"))
    assert error.field == "profiles.0.engine"
    assert error.message == (
        "model 'llama', profile 'tp1', field 'engine': unknown engine 'tgi'; "
        "known engines: vllm, sglang, llamacpp, sim"
    )
    assert refused(profile(engine="")).field == "profiles.0.engine"
    del_engine = model(profiles=[{"name": "x"}])
    assert refused(del_engine).field == "profiles.0.engine"


def test_sglang_needs_gpus() -> None:
    error = refused(profile(engine="sglang", gpus=0))
    assert error.field == "profiles.0.gpus"
    assert error.message.startswith(
        "model 'llama', profile 'tp1', field 'gpus': sglang needs at least 1 GPU"
    )
    assert "vllm, llamacpp or sim" in error.message


def test_vllm_runs_on_cpus_as_one_rank() -> None:
    assert parse_model(profile(engine="vllm", gpus=0)).profiles[0].gpus == 0
    error = refused(profile(engine="vllm", gpus=0, tensor_parallel_size=2))
    assert error.field == "profiles.0.tensor_parallel_size"
    assert "needs GPUs but gpus is 0" in error.message


def test_cpu_engines_run_without_gpus_and_gpus_are_whole_numbers() -> None:
    assert parse_model(model(profiles=[{"engine": "sim"}])).profiles[0].gpus == 0
    assert refused(profile(gpus=-1)).field == "profiles.0.gpus"
    assert refused(profile(gpus="2")).field == "profiles.0.gpus"
    assert refused(profile(gpus=True)).field == "profiles.0.gpus"


@pytest.mark.parametrize(
    ("given", "size"),
    [
        (0, 0),
        (1024, 1024),
        ("24GiB", 24 * GIB),
        ("80GB", 80 * 10**9),
        ("512 MiB", 512 << 20),
        ("1.5gib", int(1.5 * GIB)),
        ("1TiB", 1 << 40),
    ],
)
def test_gpu_memory_sizes(given: object, size: int) -> None:
    assert parse_model(profile(gpu_memory=given)).profiles[0].gpu_memory == size


@pytest.mark.parametrize("given", ["24", "24G", "lots", -1, 1.5, True, "-2GiB"])
def test_gpu_memory_refuses_other_values(given: object) -> None:
    error = refused(profile(gpu_memory=given))
    assert error.field == "profiles.0.gpu_memory"
    assert error.message.startswith("model 'llama', profile 'tp1', field 'gpu_memory': ")


def test_gpu_memory_and_kind_need_gpus() -> None:
    for field, value in (("gpu_memory", "24GiB"), ("gpu_kind", "H100")):
        error = refused(model(profiles=[{"name": "cpu", "engine": "sim", field: value}]))
        assert error.field == f"profiles.0.{field}"
        assert error.message.startswith(f"model 'llama', profile 'cpu', field '{field}': ")
        assert "gpus is 0" in error.message
    assert refused(profile(gpu_kind=" ")).field == "profiles.0.gpu_kind"


def test_tensor_parallel_size() -> None:
    assert parse_model(profile(gpus=4, tensor_parallel_size=4)).profiles[0].tensor_parallel == 4
    assert parse_model(profile(gpus=4)).profiles[0].tensor_parallel == 4
    too_many = refused(profile(gpus=2, tensor_parallel_size=4))
    assert too_many.field == "profiles.0.tensor_parallel_size"
    assert too_many.message == (
        "model 'llama', profile 'tp1', field 'tensor_parallel_size': tensor_parallel_size (4) "
        "is more than gpus (2); each rank runs on its own GPU, so give at most 2 (0 means one "
        "per GPU)"
    )
    no_gpus = refused(model(profiles=[{"engine": "sim", "tensor_parallel_size": 2}]))
    assert no_gpus.field == "profiles.0.tensor_parallel_size" and "needs GPUs" in no_gpus.message
    fewer = refused(profile(gpus=4, tensor_parallel_size=2))
    assert fewer.field == "profiles.0.tensor_parallel_size"
    assert "must equal gpus (4)" in fewer.message
    assert refused(profile(tensor_parallel_size=-1)).field == "profiles.0.tensor_parallel_size"


def test_llamacpp_spreads_over_several_gpus_with_one_rank() -> None:
    body = model(weights="/m/x.gguf", profiles=[{"engine": "llamacpp", "gpus": 2}])
    error = refused(body)
    assert error.field == "profiles.0.tensor_parallel_size"
    assert (
        "must be 1 for llama.cpp" in error.message and "0 means one rank per GPU" in error.message
    )
    body["profiles"][0]["tensor_parallel_size"] = 1
    assert parse_model(body).profiles[0].gpus == 2


@pytest.mark.parametrize("value", [0.0, 0.5, 1.0, 1])
def test_good_gpu_memory_utilization(value: float) -> None:
    assert (
        parse_model(profile(gpu_memory_utilization=value)).profiles[0].gpu_memory_utilization
        == value
    )


@pytest.mark.parametrize("value", [-0.1, 1.01, float("nan"), float("inf"), "lots", "0.5", True])
def test_bad_gpu_memory_utilization(value: object) -> None:
    assert (
        refused(profile(gpu_memory_utilization=value)).field == "profiles.0.gpu_memory_utilization"
    )


def test_llamacpp_has_no_memory_fraction() -> None:
    error = refused(
        model(
            weights="/m/x.gguf",
            profiles=[{"engine": "llamacpp", "gpus": 1, "gpu_memory_utilization": 0.5}],
        )
    )
    assert error.field == "profiles.0.gpu_memory_utilization"


def test_engine_args_llmgw_manages_are_refused_in_profile_terms() -> None:
    error = refused(profile(engine_args=["--port", "9000"]))
    assert error.field == "profiles.0.engine_args"
    assert error.message == (
        "model 'llama', profile 'tp1', field 'engine_args': '--port' sets --port, which "
        "llmgw manages: it picks a free port on the node; remove the argument"
    )
    tp = refused(profile(engine_args=["--tensor-parallel-size=2"]))
    assert tp.field == "profiles.0.engine_args" and "tensor_parallel_size instead" in tp.message
    assert refused(profile(engine_args=[5])).field == "profiles.0.engine_args.0"


def test_env_and_labels() -> None:
    parsed = parse_model(profile(env={"HF_HOME": "/cache"}, labels={"zone": "eu-1"}))
    assert parsed.profiles[0].env == {"HF_HOME": "/cache"}
    assert parsed.profiles[0].labels == {"zone": "eu-1"}
    reserved = refused(profile(env={"CUDA_VISIBLE_DEVICES": "0"}))
    assert reserved.field == "profiles.0.env" and "CUDA_VISIBLE_DEVICES" in reserved.message
    assert refused(profile(env={"": "x"})).field == "profiles.0.env"
    assert refused(profile(labels={" zone": "x"})).field == "profiles.0.labels"
    assert refused(profile(labels={"zone": 3})).field == "profiles.0.labels.zone"


# ---- shape of the input and of the error ----


def test_unknown_fields_are_refused_where_they_are() -> None:
    top = refused(model(replicas=2))
    assert top.field == "replicas"
    assert top.message == (
        "model 'llama', field 'replicas': unknown field (check its spelling and where it is nested)"
    )
    assert refused(profile(gpu=1)).field == "profiles.0.gpu"


def test_bodies_that_are_not_objects() -> None:
    error = refused([1, 2])
    assert error.field == ""
    assert error.message == (
        "model (no valid name): must be a JSON object (a mapping of fields), got list"
    )
    nested = refused(model(profiles=["vllm"]))
    assert nested.field == "profiles.0"
    assert nested.message.startswith("model 'llama', profile '#0': must be a JSON object")


def test_every_problem_is_listed_and_the_first_one_is_the_field() -> None:
    error = refused(model(max_replicas=0, profiles=[{"engine": "sim", "gpus": -1}]))
    assert error.field == "profiles.0.gpus"
    assert [field for field, _ in error.problems] == ["profiles.0.gpus", "max_replicas"]
    assert "and 1 more" in error.message and "field 'max_replicas'" in error.message


# ---- through the config file loader ----


def test_config_file_errors_name_the_file_the_path_and_the_model(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text(
        "models:\n"
        "  - name: llama\n"
        "    weights: /m/llama\n"
        "    min_replicas: 2\n"
        "    max_replicas: 1\n"
        "    keep_alive: soon\n"
        "    profiles:\n"
        "      - name: big\n"
        "        engine: vllm\n"
        "        gpus: 2\n"
        "        tensor_parallel_size: 4\n"
    )
    with pytest.raises(ConfigError) as info:
        load_server_config(path, {})
    lines = str(info.value).splitlines()
    assert (
        f"{path}: models[0].max_replicas: model 'llama': max_replicas (1) is below "
        "min_replicas (2); raise max_replicas or lower min_replicas"
    ) in lines
    assert any(
        line.startswith(f"{path}: models[0].profiles[0].tensor_parallel_size: profile 'big': ")
        for line in lines
    )
    assert any(
        line.startswith(f"{path}: models[0].keep_alive: 'soon' is not a duration") for line in lines
    )


def test_a_config_file_model_becomes_a_catalog_model(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text(
        "models:\n"
        "  - name: tiny\n"
        "    weights: /m/tiny.gguf\n"
        "    keep_alive: 10m\n"
        "    profiles:\n"
        "      - engine: llamacpp\n"
    )
    cfg = load_server_config(path, {})
    (entry,) = cfg.models
    built = model_from_config(entry, source="config")
    assert (built.name, built.keep_alive, built.profiles[0].name) == ("tiny", 600.0, "llamacpp")


# ---- rollout settings ----


def test_rollout_settings_default_to_one_at_a_time_and_read_back() -> None:
    assert (parse_model(model()).max_surge, parse_model(model()).max_unavailable) == (1, 0)
    assert "rollout" not in model_to_dict(parse_model(model()))
    wide = parse_model(model(rollout={"max_surge": 2, "max_unavailable": 1}))
    assert (wide.max_surge, wide.max_unavailable) == (2, 1)
    assert parse_model(model_to_dict(wide)) == wide


@pytest.mark.parametrize(
    ("value", "field", "message"),
    [
        ({"max_surge": 0, "max_unavailable": 0}, "rollout", "raise one of them"),
        ({"max_surge": -1}, "rollout.max_surge", "greater than or equal to 0"),
        ({"max_unavailable": 1.5}, "rollout.max_unavailable", "valid integer"),
        ({"surge": 1}, "rollout.surge", "unknown field (check its spelling"),
    ],
)
def test_bad_rollout_settings_are_named(value: object, field: str, message: str) -> None:
    error = refused(model(rollout=value))
    assert error.field == field
    assert message in str(error)


# ---- a canary (versions) ----

CANARY = [
    {"name": "stable", "weight": 90},
    {
        "name": "v2",
        "weight": 10,
        "profiles": [{"engine": "vllm", "gpus": 1, "engine_args": ["--x"]}],
    },
]


def test_a_canary_is_read_with_the_models_own_spec_as_its_stable_version_and_reads_back() -> None:
    parsed = parse_model(model(versions=CANARY))
    assert parsed.canary is not None
    assert (parsed.canary.name, parsed.canary.weight) == ("v2", 10)
    assert (parsed.canary.stable_name, parsed.canary.stable_weight) == ("stable", 90)
    # Unset canary weights are the model's; the canary's profile is its own.
    assert parsed.canary.weights == parsed.weights
    assert parsed.canary.profiles[0].engine_args == ("--x",)
    assert parse_model(model_to_dict(parsed)) == parsed
    assert "versions" not in model_to_dict(parse_model(model()))


@pytest.mark.parametrize(
    ("versions", "field", "message"),
    [
        (CANARY[:1], "versions", "a canary has exactly two"),
        ([*CANARY, CANARY[1]], "versions", "a canary has exactly two"),
        ([{**CANARY[0], "weights": "x"}, CANARY[1]], "versions", "is the model's own spec"),
        ([CANARY[0], {"name": "v2", "weight": 10}], "versions", "sets neither weights nor"),
        ([CANARY[0], {**CANARY[1], "name": "stable"}], "versions", "give each its own name"),
        ([CANARY[0], {**CANARY[1], "weight": 100}], "versions.1.weight", "less than or equal"),
        ([CANARY[0], {**CANARY[1], "name": "no spaces"}], "versions.1.name", "not a version"),
        (
            [CANARY[0], {**CANARY[1], "profiles": [{"engine": "vllm", "gpus": 1}]}],
            "versions.1",
            "could not be told apart",
        ),
        (
            [CANARY[0], {**CANARY[1], "profiles": [{"engine": "sglang", "gpus": 0}]}],
            "versions.1.profiles.0.gpus",
            "needs at least 1 GPU",
        ),
    ],
)
def test_bad_versions_are_named(versions: object, field: str, message: str) -> None:
    error = refused(model(versions=versions))
    assert error.field == field, error
    assert message in str(error)


def test_a_bad_canary_in_the_config_file_names_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text(
        "models:\n"
        "  - name: llama\n"
        "    weights: /m/llama\n"
        "    profiles: [{engine: vllm, gpus: 1}]\n"
        "    versions:\n"
        "      - {name: stable, weight: 90}\n"
        "      - {name: v2, weight: 0, weights: /m/llama-2}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_server_config(path, {})
    assert any(
        line.startswith(f"{path}: models[0].versions[1].weight: ")
        for line in str(info.value).splitlines()
    ), str(info.value)
