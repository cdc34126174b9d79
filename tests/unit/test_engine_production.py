"""Engines as they behave in production: deadlines, weights directory, executables, state dir.

Profile deadlines (`load_timeout`, `unhealthy_after`, `drain_grace`) from the
catalog config to the wire ShardSpec and the engines' launch plans; HF_HOME in
the weights directory for vLLM and SGLang; `--engine KIND=PATH`,
`--state-dir` and its lock as the CLI checks them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.agent.flags import PortRange
from llmgw.agent.spec import engine_spec
from llmgw.agent.state import (
    EMPTY_CMDLINE,
    EngineStore,
    StateDirError,
    cmdline_sha256,
    prepare_state_dir,
)
from llmgw.control.agentsvc.convert import shard_spec, shard_spec_message
from llmgw.control.catalog.errors import InvalidModel
from llmgw.control.catalog.validate import model_to_dict, parse_model
from llmgw.control.inventory.model import ShardSpec
from llmgw.engines import EngineSettings, EngineSpec, ProfileError, adapter_for

SETTINGS = EngineSettings(python="/envs/engine/bin/python", weights_dir="/srv/weights")


def spec(engine: str, **changes: object) -> EngineSpec:
    fields: dict[str, object] = {
        "shard_id": "s1",
        "model": "m",
        "engine": engine,
        "weights": "org/model" if engine != "llamacpp" else "/w/m.gguf",
        "port": 20000,
        "gpu_indices": (0,) if engine in ("vllm", "sglang") else (),
    }
    fields.update(changes)
    return EngineSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("engine", "load", "unhealthy", "drain"),
    [
        ("vllm", 1800, 60, 30),
        ("sglang", 1800, 60, 30),
        ("llamacpp", 120, 120, 10),
        ("sim", 60, 30, 5),
    ],
)
def test_deadlines_default_per_engine_kind_and_the_spec_wins(
    engine: str, load: float, unhealthy: float, drain: float
) -> None:
    adapter = adapter_for(engine, settings=SETTINGS)
    timings = adapter.plan(spec(engine)).timings
    assert (timings.load_timeout, timings.unhealthy_after, timings.drain_grace) == (
        load,
        unhealthy,
        drain,
    )
    given = adapter.plan(spec(engine, load_timeout=7.0, drain_grace=0.0)).timings
    assert (given.load_timeout, given.unhealthy_after, given.drain_grace) == (7.0, unhealthy, 0.0)


def test_a_bad_deadline_names_the_field() -> None:
    with pytest.raises(ProfileError) as caught:
        adapter_for("sim", settings=SETTINGS).plan(spec("sim", unhealthy_after=0.0))
    assert caught.value.field == "unhealthy_after"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_hugging_face_downloads_go_to_the_weights_dir(engine: str) -> None:
    plan = adapter_for(engine, settings=SETTINGS).plan(spec(engine))
    assert plan.env["HF_HOME"] == "/srv/weights"
    assert plan.env["HF_HUB_CACHE"] == "/srv/weights/hub"
    # A profile that sets its own keeps it.
    own = adapter_for(engine, settings=SETTINGS).plan(spec(engine, env={"HF_HOME": "/x"}))
    assert own.env["HF_HOME"] == "/x" and own.env["HF_HUB_CACHE"] == "/srv/weights/hub"


def test_llamacpp_and_sim_get_no_hugging_face_variables() -> None:
    for engine in ("llamacpp", "sim"):
        plan = adapter_for(engine, settings=SETTINGS).plan(spec(engine))
        assert "HF_HOME" not in plan.env


def test_executables_per_engine_kind() -> None:
    settings = EngineSettings(
        python="/default/python",
        vllm_command="/opt/vllm/bin/vllm",
        sglang_python="/opt/sglang/bin/python",
        llamacpp_python="/opt/llama/bin/python",
        llmgw_command=("/opt/llmgw/bin/llmgw",),
    )
    argv0 = {
        engine: adapter_for(engine, settings=settings).plan(spec(engine)).argv[:2]
        for engine in ("vllm", "sglang", "llamacpp", "sim")
    }
    assert argv0 == {
        "vllm": ("/opt/vllm/bin/vllm", "serve"),
        "sglang": ("/opt/sglang/bin/python", "-m"),
        "llamacpp": ("/opt/llama/bin/python", "-m"),
        "sim": ("/opt/llmgw/bin/llmgw", "sim"),
    }


def model(**profile: object) -> dict[str, object]:
    return {
        "name": "m",
        "weights": "none",
        "profiles": [{"engine": "sim", **profile}],
    }


def test_profile_deadlines_parse_durations_and_round_trip() -> None:
    parsed = parse_model(model(load_timeout="20m", unhealthy_after=30, drain_grace="0s"))
    [profile] = parsed.profiles
    assert (profile.load_timeout, profile.unhealthy_after, profile.drain_grace) == (
        1200.0,
        30.0,
        0.0,
    )
    assert parse_model(model_to_dict(parsed)) == parsed
    assert parse_model(model()).profiles[0].load_timeout is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("load_timeout", "soon"), ("load_timeout", 0), ("unhealthy_after", -5), ("drain_grace", -1)],
)
def test_bad_profile_deadlines_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidModel) as caught:
        parse_model(model(**{field: value}))
    assert field in str(caught.value), str(caught.value)


def test_deadlines_travel_on_the_wire_and_reach_the_engine_spec() -> None:
    sent = ShardSpec(
        shard_id="s1",
        model="m",
        engine="sim",
        weights="",
        port=20001,
        load_timeout=90.0,
        unhealthy_after=15.0,
        drain_grace=3.0,
    )
    message = shard_spec_message(sent)
    assert shard_spec(message) == sent
    converted = engine_spec(
        message, port_range=PortRange(20000, 20010), bind_host="127.0.0.1", gpu_count=0
    )
    assert (converted.load_timeout, converted.unhealthy_after, converted.drain_grace) == (
        90.0,
        15.0,
        3.0,
    )
    # Unset (0 on the wire): the engine kind's defaults.
    unset = engine_spec(
        shard_spec_message(
            ShardSpec(shard_id="s", model="m", engine="sim", weights="", port=20001)
        ),
        port_range=PortRange(20000, 20010),
        bind_host="127.0.0.1",
        gpu_count=0,
    )
    assert unset.load_timeout is None and unset.drain_grace is None


def test_the_state_dir_is_private_and_locked_per_node(tmp_path: Path) -> None:
    loose = tmp_path / "state"
    loose.mkdir(mode=0o755)
    assert prepare_state_dir(loose) == loose
    assert loose.stat().st_mode & 0o777 == 0o700
    first = EngineStore(loose, node_id="n1")
    first.lock()
    try:
        with pytest.raises(StateDirError, match="in use by another agent with this node id"):
            EngineStore(loose, node_id="n1").lock()
        other = EngineStore(loose, node_id="n2")
        other.lock()  # another node id: its own directory
        other.unlock()
    finally:
        first.unlock()
    EngineStore(loose, node_id="n1").lock()  # released: usable again


def run_agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "agent", "--server", "127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "vllm"], "error: --engine: 'vllm' is not KIND=PATH"),
        (["--engine", "tensorflow=/bin/sh"], "error: --engine: 'tensorflow' is not an engine"),
        (["--engine", "vllm=/no/such/vllm"], "error: --engine: vllm=/no/such/vllm:"),
        (
            ["--engine", "sim=/bin/sh", "--engine", "sim=/bin/sh"],
            "error: --engine: sim is given twice",
        ),
        (["--state-dir", "/proc/llmgw"], "error: --state-dir: cannot create /proc/llmgw"),
    ],
)
def test_bad_flags_are_one_error_line(args: list[str], message: str) -> None:
    done = run_agent(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(message), done.stderr
    assert done.stderr.count("\n") == 1


def test_an_engine_path_that_is_not_executable_is_refused(tmp_path: Path) -> None:
    plain = tmp_path / "vllm"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    done = run_agent("--engine", f"vllm={plain}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: --engine: vllm={plain}: {plain} is not an executable")


def test_a_second_agent_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    store = EngineStore(prepare_state_dir(tmp_path / "state"), node_id="n1")
    store.lock()
    try:
        done = run_agent(
            "--node-id",
            "n1",
            "--state-dir",
            str(tmp_path / "state"),
            "--weights-dir",
            str(tmp_path),
        )
    finally:
        store.unlock()
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: --state-dir: ") and "in use by another agent" in (
        done.stderr
    )


def test_a_damaged_state_file_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = EngineStore(tmp_path, node_id="n1")
    store.lock()
    try:
        (store.directory / "state.json").write_text("{not json")
        assert store.load() == []
        assert (store.directory / "state.json.bad").read_text() == "{not json"
        assert "is damaged" in caplog.text and "adopting nothing" in caplog.text
        store.save([])
        assert store.load() == []
    finally:
        store.unlock()


def test_the_recorded_command_line_hash_is_the_launched_argv() -> None:
    # Computed from argv, not read from /proc (empty there while exec is under way).
    argv = ["/usr/bin/python3", "-c", "print(1)", "x y"]
    expected = hashlib.sha256(b"/usr/bin/python3\0-c\0print(1)\0x y\0").hexdigest()
    assert cmdline_sha256(argv) == expected
    assert cmdline_sha256(argv) != EMPTY_CMDLINE
    mine = Path("/proc/self/cmdline").read_bytes()
    assert cmdline_sha256([a.decode() for a in mine.split(b"\0")[:-1]]) == (
        hashlib.sha256(mine).hexdigest()
    )
