"""`llmgw models activate` against a real admin server whose model status changes over time.

The reconciler's side is `ScriptedControl`: its `activate` walks a replica
through placing, starting, loading and ready (or failed), as the controller
would, while the CLI polls the model's status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from admin_cli_server import AdminServer, ScriptedControl, clean_env, idle, replica, serve
from test_inventory_state import VirtualClock, registration
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.control.inventory import Inventory

URL = "http://10.0.0.5:20001"


def step(state: str, replicas: list[dict[str, object]], **extra: object) -> dict[str, object]:
    ready = sum(1 for r in replicas if r["state"] == "ready")
    return {**idle(), "state": state, "desired_replicas": 1, "ready_replicas": ready,
            "replicas": replicas, **extra}  # fmt: skip


FAILURE = {
    "node": "node-a",
    "replica": "qwen-1",
    "message": "engine exited with 1",
    "exit_code": 1,
    "output_tail": ["loading weights", "torch.OutOfMemoryError: CUDA out of memory", "bye"],
    "summary": "replica qwen-1 on node node-a failed: engine exited with 1 (exit code 1)",
}


def control() -> ScriptedControl:
    scripted = ScriptedControl()
    scripted.scripts["llama-8b"] = [
        (0.05, step("starting", [replica("llama-1", "node-a", "placing", gpus=[0])])),
        (0.15, step("starting", [replica("llama-1", "node-a", "starting")])),
        (0.15, step("starting", [replica("llama-1", "node-a", "loading")])),
        (0.15, step("ready", [replica("llama-1", "node-a", "ready", endpoint_url=URL)])),
    ]
    scripted.scripts["qwen"] = [
        (0.05, step("starting", [replica("qwen-1", "node-a", "placing", gpus=[0, 1])])),
        (0.15, step("starting", [replica("qwen-1", "node-a", "loading", gpus=[0, 1])])),
        (
            0.15,
            step(
                "backoff",
                [replica("qwen-1", "node-a", "failed", message="engine exited with 1")],
                last_failure=FAILURE,
                retry_in_seconds=10.0,
            ),
        ),
    ]
    scripted.errors["qwen"] = {
        "message": "model 'qwen' failed to start: " + str(FAILURE["summary"]),
        "code": "model_failed",
        "retry_after": 10,
    }
    scripted.scripts["gemma"] = [(0.6, step("ready", [replica("g-1", "node-a", "ready")]))]
    return scripted


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AdminServer]:
    clock = VirtualClock()
    inventory = Inventory(
        clock=clock, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    inventory.register(registration("node-a"))
    with serve(tmp_path, inventory=inventory, control=control()) as running:
        yield running


def run(server: AdminServer, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    argv = ["models", "activate", *args, "--admin", server.url, "--poll-interval", "0.02"]
    result = CliRunner().invoke(app, argv, env=clean_env(tmp_path))
    return result.exit_code, result.stdout, result.stderr


def progress(err: str) -> list[str]:
    """The progress lines without their elapsed-time prefix."""
    return [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("[")]


def test_activation_shows_each_step_and_ends_ready(server: AdminServer, tmp_path: Path) -> None:
    code, out, err = run(server, tmp_path, "llama-8b")
    assert code == 0, err
    assert progress(err) == [
        "activating model llama-8b (now stopped, 0/0 ready)",
        "replica llama-1 placing on node-a (GPU 0)",
        "replica llama-1 starting on node-a",
        "replica llama-1 loading on node-a",
        f"replica llama-1 ready at {URL}",
    ]
    assert out.startswith("model llama-8b is ready (1 replica) after ")
    assert out.endswith(" s\n") and out.count("\n") == 1
    assert server.control.activated == ["llama-8b"]


def test_json_keeps_stdout_to_the_final_status(server: AdminServer, tmp_path: Path) -> None:
    code, out, err = run(server, tmp_path, "llama-8b", "--json")
    assert code == 0
    answer = json.loads(out)
    assert (answer["state"], answer["ready_replicas"], answer["error"]) == ("ready", 1, None)
    assert f"replica llama-1 ready at {URL}" in err
    assert "model llama-8b is ready (1 replica)" in err


def test_a_refused_activation_gives_the_reason_and_the_engines_last_words(
    server: AdminServer, tmp_path: Path
) -> None:
    code, out, err = run(server, tmp_path, "qwen")
    assert (code, out) == (1, "")
    assert progress(err) == [
        "activating model qwen (now stopped, 0/0 ready)",
        "replica qwen-1 placing on node-a (GPUs 0,1)",
        "replica qwen-1 loading on node-a",
        "replica qwen-1 failed on node-a: engine exited with 1",
        "replica qwen-1 on node node-a failed: engine exited with 1 (exit code 1); "
        "retrying in 10 s",
    ]
    assert err.splitlines()[-5:] == [
        "error: model 'qwen' failed to start: replica qwen-1 on node node-a failed: engine "
        "exited with 1 (exit code 1)",
        "last output of replica qwen-1:",
        "  | loading weights",
        "  | torch.OutOfMemoryError: CUDA out of memory",
        "  | bye",
    ]


def test_giving_up_after_the_timeout_says_where_the_model_is(
    server: AdminServer, tmp_path: Path
) -> None:
    code, out, err = run(server, tmp_path, "gemma", "--timeout", "0.2")
    assert (code, out) == (1, "")
    assert err.splitlines()[-1] == (
        "error: model gemma is not ready after 0.2 s (now stopped, 0/0 ready); the server goes "
        "on until its own activation timeout; follow it with `llmgw models show gemma`"
    )


def test_an_unknown_model_is_exit_2(server: AdminServer, tmp_path: Path) -> None:
    code, _, err = run(server, tmp_path, "nope")
    assert code == 2 and err.startswith("error: model 'nope' is not in the catalog")
    assert server.control.activated == []
