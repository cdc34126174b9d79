"""`sleep_after` in the catalog and the engine adapters: who can sleep, and how they start."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_catalog_validate import model, refused

from llmgw.config import ConfigError, load_server_config
from llmgw.control.catalog import model_to_dict, parse_model
from llmgw.engines import EngineSettings, EngineSpec, ProfileError, adapter_for

SETTINGS = EngineSettings(python="/opt/engines/bin/python", vllm_command="/opt/vllm/bin/vllm")


def spec(engine: str, **changes: object) -> EngineSpec:
    fields: dict[str, object] = {
        "shard_id": "s1",
        "model": "m",
        "engine": engine,
        "weights": "/models/m.gguf" if engine == "llamacpp" else "/models/m",
        "port": 8000,
        "gpu_indices": (0,),
        "sleep_mode": True,
    }
    fields.update(changes)
    return EngineSpec(**fields)  # type: ignore[arg-type]


def test_sleep_after_is_read_in_seconds_and_round_trips() -> None:
    parsed = parse_model(model(sleep_after="2m", keep_alive="10m"))
    assert parsed.sleep_after == 120.0
    assert model_to_dict(parsed)["sleep_after"] == 120
    assert parse_model(model_to_dict(parsed)) == parsed
    assert parse_model(model()).sleep_after is None
    assert "sleep_after" not in model_to_dict(parse_model(model()))
    # A pinned model may sleep when idle; it is never stopped.
    assert parse_model(model(sleep_after=60, keep_alive=-1)).sleep_after == 60.0


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"sleep_after": 300}, "must be shorter than keep_alive"),
        ({"sleep_after": "10m", "keep_alive": "5m"}, "must be shorter than keep_alive"),
        ({"sleep_after": "soon"}, "is not an idle time"),
        ({"sleep_after": 0}, "is not an idle time"),
        ({"sleep_after": -1}, "is not an idle time"),
    ],
)
def test_a_bad_sleep_after_is_refused_naming_the_field(
    fields: dict[str, object], says: str
) -> None:
    error = refused(model(**fields))
    assert error.field == "sleep_after"
    assert "sleep_after" in str(error) and says in str(error)


def test_an_engine_that_cannot_sleep_is_refused_with_sleep_after() -> None:
    error = refused(
        model(
            weights="/models/m.gguf",
            sleep_after=60,
            profiles=[{"name": "cpu", "engine": "llamacpp"}],
        )
    )
    assert error.field == "sleep_after"
    assert "llama.cpp cannot sleep" in str(error)
    cpu = refused(model(sleep_after=60, profiles=[{"name": "cpu", "engine": "vllm"}]))
    assert cpu.field == "sleep_after"
    assert "refused on CPU" in str(cpu)


def test_the_config_file_error_names_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text(
        "models:\n  - name: m\n    weights: none\n    keep_alive: 60\n    sleep_after: 90\n"
        "    profiles: [{name: sim, engine: sim}]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_server_config(path, {})
    assert str(path) in str(info.value)
    assert "sleep_after" in str(info.value)


def test_vllm_in_sleep_mode_gets_its_flag_dev_mode_and_sleep_endpoints() -> None:
    plan = adapter_for("vllm", settings=SETTINGS).plan(spec("vllm"))
    assert "--enable-sleep-mode" in plan.argv
    assert plan.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert plan.sleep is not None
    assert plan.sleep.sleep_target(1) == "/sleep?level=1"
    assert plan.sleep.wake_path == "/wake_up"
    plain = adapter_for("vllm", settings=SETTINGS).plan(spec("vllm", sleep_mode=False))
    assert "--enable-sleep-mode" not in plain.argv
    assert "VLLM_SERVER_DEV_MODE" not in plain.env
    assert plain.sleep is None


def test_sglang_sleeps_with_its_memory_saver_and_the_sim_with_vllms_endpoints() -> None:
    sglang = adapter_for("sglang", settings=SETTINGS).plan(spec("sglang"))
    assert "--enable-memory-saver" in sglang.argv
    assert sglang.sleep is not None
    assert sglang.sleep.sleep_target(1) == "/release_memory_occupation"
    sim = adapter_for("sim", settings=SETTINGS).plan(spec("sim", gpu_indices=()))
    assert sim.sleep is not None and sim.sleep.wake_path == "/wake_up"


@pytest.mark.parametrize(("engine", "sleeps"), [("vllm", True), ("sglang", True), ("sim", True)])
def test_which_engines_can_sleep(engine: str, sleeps: bool) -> None:
    assert adapter_for(engine, settings=SETTINGS).sleeps is sleeps


def test_llamacpp_cannot_sleep() -> None:
    adapter = adapter_for("llamacpp", settings=SETTINGS)
    assert adapter.sleeps is False
    with pytest.raises(ProfileError) as info:
        adapter.validate(spec("llamacpp"))
    assert info.value.field == "sleep_after"
