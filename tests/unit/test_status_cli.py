"""`llmgw status` against a real admin server on loopback: one screen, --json, --watch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admin_cli_server import (
    AdminServer,
    ScriptedControl,
    ScriptedInventory,
    StaticLeader,
    clean_env,
    replica,
    serve,
    unused_url,
)
from test_inventory_state import VirtualClock, ready_shard, registration
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.cli.status import models_table
from llmgw.control.inventory import GpuUsage, ShardReport


def fleet() -> ScriptedInventory:
    clock = VirtualClock()
    inventory = ScriptedInventory(
        clock=clock, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    inventory.register(registration("node-a", shards=(ready_shard("llama-0", gpus=(0, 1)),)))
    inventory.shard_status(
        "node-a",
        ShardReport(
            shard_id="qwen-0",
            model="qwen",
            state="failed",
            message="engine exited with 1",
            exit_code=1,
        ),
    )
    inventory.register(registration("node-b"))
    inventory.set_draining("node-b", True)
    clock.advance(7.0)
    inventory.heartbeat(
        "node-a", [GpuUsage(0, 90.0, 60 << 30, 20 << 30), GpuUsage(1, 80.0, 60 << 30, 20 << 30)]
    )
    return inventory


def statuses() -> dict[str, dict[str, Any]]:
    return {
        "llama-8b": {
            "state": "ready",
            "desired_replicas": 1,
            "ready_replicas": 1,
            "replicas": [
                replica("llama-0", "node-a", "ready", endpoint_url="http://10.0.0.5:20001")
            ],
        },
        "gemma": {
            "state": "backoff",
            "desired_replicas": 1,
            "ready_replicas": 0,
            "replicas": [],
            "retry_in_seconds": 12.0,
            "last_failure": {
                "node": "node-a",
                "replica": "gemma-1",
                "message": "engine exited with 1",
                "exit_code": 1,
                "output_tail": ["ValueError: bad magic"],
                "summary": "replica gemma-1 on node node-a failed: engine exited with 1",
            },
        },
        "qwen": {
            "state": "unplaceable",
            "desired_replicas": 1,
            "ready_replicas": 0,
            "replicas": [],
            "unplaceable": "model 'qwen' cannot be placed: profile 'vllm': node-a: 0 of 2 "
            "GPUs free; node-b: draining",
        },
    }


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AdminServer]:
    control = ScriptedControl(canned=statuses())
    with serve(tmp_path, inventory=fleet(), control=control, leader=StaticLeader()) as running:
        yield running


def run(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["status", *args], env=clean_env(tmp_path))
    return result.exit_code, result.stdout, result.stderr


def test_one_screen_with_leader_nodes_models_and_totals(
    server: AdminServer, tmp_path: Path
) -> None:
    code, out, err = run(tmp_path, "--admin", server.url)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "server srv-a: leader (epoch 3, since 2026-03-01 12:00 UTC)",
        "servers: srv-a (leader), srv-b (standby)",
        "",
        "NODE    STATE  DRAINING  GPUS  GPU MEMORY              SHARDS         HEARTBEAT",
        "node-a  ready  -          2/2  [######--] 120/160 GiB  1 (+1 failed)  0s ago",
        "node-b  ready  yes        0/2  [--------] 2/160 GiB    0              7s ago",
        "",
        "MODEL     STATE        READY  WHERE   NOTE",
        "gemma     backoff        0/1  -       failed on node-a: engine exited with 1 (exit code "
        "1); retry in 12 s",
        "llama-8b  ready          1/1  node-a  -",
        "qwen      unplaceable    0/1  -       model 'qwen' cannot be placed: profile 'vllm': "
        "node-a: 0 of 2 GPUs free; node-b: draining",
        "",
        "2 nodes (2 ready, 1 draining), 2/4 GPUs assigned, 3 models (1 ready, 1 backoff, "
        "1 unplaceable), 1/3 replicas ready",
    ]


def test_on_a_terminal_long_notes_are_cut_to_its_width() -> None:
    models = [{"name": n, "status": s} for n, s in sorted(statuses().items())]
    lines = models_table(models, columns=80).splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[3] == (
        "qwen      unplaceable    0/1  -       model 'qwen' cannot be placed: profile..."
    )
    # A narrow terminal still shows a useful part of the reason.
    narrow = models_table(models, columns=40).splitlines()[3]
    assert narrow.endswith("   model 'qwen' cannot be plac...")


def test_json_is_the_apis_own_shapes(server: AdminServer, tmp_path: Path) -> None:
    code, out, err = run(tmp_path, "--json", "--admin", server.url)
    assert (code, err) == (0, "")
    snap = json.loads(out)
    assert set(snap) == {"leader", "servers", "nodes", "models", "queue"}
    assert snap["leader"]["role"] == "leader" and snap["leader"]["epoch"] == 3
    assert [(s["server"], s["role"], s["this"]) for s in snap["servers"]] == [
        ("srv-a", "leader", True),
        ("srv-b", "standby", False),
    ]
    assert [n["id"] for n in snap["nodes"]] == ["node-a", "node-b"]
    assert snap["nodes"][1]["draining"] is True
    assert [m["name"] for m in snap["models"]] == ["gemma", "llama-8b", "qwen"]
    assert snap["models"][2]["status"]["state"] == "unplaceable"


def test_a_standby_names_the_leader_and_a_server_without_leadership_says_so(
    tmp_path: Path,
) -> None:
    with serve(tmp_path, inventory=fleet(), leader=StaticLeader(role="standby")) as server:
        out = run(tmp_path, "--admin", server.url)[1]
        assert out.splitlines()[0] == (
            "server srv-b: standby; leader srv-a (epoch 3, since 2026-03-01 12:00 UTC)"
        )
    with serve(tmp_path, inventory=fleet(), leader=None) as server:
        code, out, _ = run(tmp_path, "--admin", server.url)
        assert code == 0
        assert out.splitlines()[0] == "leadership: not reported by this server"
        assert json.loads(run(tmp_path, "--json", "--admin", server.url)[1])["leader"] is None


def test_an_unreachable_admin_api_is_one_error_line_and_exit_1(tmp_path: Path) -> None:
    url = unused_url()
    code, out, err = run(tmp_path, "--admin", url)
    assert code == 1 and out == ""
    assert err.startswith(f"error: cannot reach the admin API at {url} (from --admin)")
    assert err.count("\n") == 1


def _watch(server: AdminServer, tmp_path: Path, *args: str) -> tuple[int, list[str], str]:
    """Run `llmgw status --watch` as a process, take two frames' worth, then Ctrl-C it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env.update({"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")})
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "status", "--admin", server.url, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # A test run started in the background inherits SIGINT ignored, and Python
        # then never raises KeyboardInterrupt: give the child Ctrl-C's default back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 20
        # A frame ends with the totals line (text) or is one line (JSON).
        while sum(1 for line in lines if line.startswith("{") or "replicas ready" in line) < 2:
            assert time.monotonic() < deadline, f"no two frames: {lines}"
            lines.append(proc.stdout.readline().rstrip("\n"))
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, lines + rest.splitlines(), err


def test_watch_redraws_until_ctrl_c_and_exits_0(server: AdminServer, tmp_path: Path) -> None:
    code, lines, err = _watch(server, tmp_path, "--watch", "0.1")
    assert (code, err) == (0, "")
    frames = [line for line in lines if line.startswith("llmgw status, every 0.1 s")]
    assert len(frames) >= 2
    assert lines.count("server srv-a: leader (epoch 3, since 2026-03-01 12:00 UTC)") >= 2


def test_watch_with_json_prints_one_object_per_line(server: AdminServer, tmp_path: Path) -> None:
    code, lines, err = _watch(server, tmp_path, "--watch", "0.1", "--json")
    assert (code, err) == (0, "")
    objects = [json.loads(line) for line in lines if line]
    assert len(objects) >= 2
    assert all(set(o) == {"leader", "servers", "nodes", "models", "queue"} for o in objects)
