"""`llmgw nodes drain --wait` and `llmgw nodes remove-weights` against a real admin server.

The inventory is real; once a node is drained it plays what agents would
report as the reconciler moves replicas: a replacement loading then ready on
another node, the old shard draining then stopped (or forgotten).
"""

from __future__ import annotations

import json
from pathlib import Path

from admin_cli_server import AdminServer, ScriptedControl, ScriptedInventory, clean_env, serve
from test_inventory_state import VirtualClock, registration
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.control.agentsvc import CommandFailed, NodeNotConnected
from llmgw.control.inventory import Inventory, ShardReport, ShardSpec, ShardState

NEW_URL = "http://10.0.0.6:20001"


def shard(
    sid: str, model: str, state: ShardState, gpus: tuple[int, ...] = (0,), url: str = ""
) -> ShardReport:
    spec = ShardSpec(shard_id=sid, model=model, engine="vllm", weights=f"/srv/weights/{model}",
                     gpu_indices=gpus, port=20001)  # fmt: skip
    return ShardReport(shard_id=sid, model=model, state=state, endpoint_url=url, spec=spec)


def fleet(*old: ShardReport) -> ScriptedInventory:
    clock = VirtualClock()
    inventory = ScriptedInventory(
        clock=clock, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    inventory.register(registration("node-a", shards=old))
    inventory.register(registration("node-b"))
    return inventory


def report(node: str, update: ShardReport) -> object:
    return lambda inv: inv.shard_status(node, update)


def moving_fleet() -> ScriptedInventory:
    """node-a runs llama-8b and gemma; draining it moves llama-8b to node-b, stops gemma."""
    inventory = fleet(
        shard("llama-0", "llama-8b", "ready", gpus=(0, 1), url="http://10.0.0.5:20001"),
        shard("gemma-0", "gemma", "ready", gpus=()),
    )
    inventory.on_drain["node-a"] = [
        (0.1, report("node-b", shard("llama-1", "llama-8b", "loading"))),
        (0.3, report("node-b", shard("llama-1", "llama-8b", "ready", url=NEW_URL))),
        (0.5, report("node-a", shard("llama-0", "llama-8b", "draining", gpus=(0, 1)))),
        (0.5, lambda inv: inv.forget_shard("node-a", "gemma-0")),
        (0.7, report("node-a", shard("llama-0", "llama-8b", "stopped", gpus=(0, 1)))),
    ]
    return inventory


def run(server: AdminServer, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    poll = ["--poll-interval", "0.02"] if args[0] == "drain" else []
    argv = ["nodes", *args, "--admin", server.url, *poll]
    result = CliRunner().invoke(app, argv, env=clean_env(tmp_path))
    return result.exit_code, result.stdout, result.stderr


def progress(err: str) -> list[str]:
    return [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("[")]


def test_drain_wait_shows_replicas_moving_and_ends_drained(tmp_path: Path) -> None:
    with serve(tmp_path, inventory=moving_fleet()) as server:
        code, out, err = run(server, tmp_path, "drain", "node-a", "--wait")
    assert code == 0, err
    assert progress(err) == [
        "node node-a is draining; waiting for 2 replicas to move off it: "
        "gemma-0 (gemma), llama-0 (llama-8b)",
        "llama-8b: replica llama-1 loading on node-b",
        f"llama-8b: replica llama-1 ready at {NEW_URL}",
        "llama-8b: replica llama-0 draining on node-a (finishing its requests)",
        "gemma: replica gemma-0 is gone from node-a",
        "llama-8b: replica llama-0 stopped on node-a",
    ]
    assert out.startswith(
        "node node-a is drained: 1 replica moved (to node-b), 1 stopped without a replacement "
        "after "
    )


def test_drain_wait_json_says_what_moved_where(tmp_path: Path) -> None:
    with serve(tmp_path, inventory=moving_fleet()) as server:
        code, out, err = run(server, tmp_path, "drain", "node-a", "--wait", "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert (answer["drained"], answer["remaining"]) == (True, [])
    assert answer["moved"] == [{"model": "llama-8b", "replica": "llama-1", "to": "node-b"}]
    assert answer["node"]["id"] == "node-a" and answer["node"]["draining"] is True
    assert "node node-a is drained" in err


def test_a_replacement_started_at_once_counts_as_moved(tmp_path: Path) -> None:
    inventory = fleet(shard("qwen-0", "qwen", "ready", gpus=()))
    inventory.on_drain["node-a"] = [
        (-1, report("node-b", shard("qwen-1", "qwen", "loading"))),  # before the first poll
        (0.1, report("node-b", shard("qwen-1", "qwen", "ready", url=NEW_URL))),
        (0.2, report("node-a", shard("qwen-0", "qwen", "stopped", gpus=()))),
    ]
    with serve(tmp_path, inventory=inventory) as server:
        code, out, err = run(server, tmp_path, "drain", "node-a", "--wait")
    assert code == 0, err
    assert out.startswith("node node-a is drained: 1 replica moved (to node-b) after "), out


def test_drain_wait_times_out_saying_what_is_left_and_why(tmp_path: Path) -> None:
    inventory = fleet(
        shard("llama-0", "llama-8b", "ready", gpus=(0, 1)),
        shard("old-0", "retired", "ready", gpus=()),
        shard("qwen-0", "qwen", "ready", gpus=()),
    )
    inventory.on_drain["node-a"] = [
        (0.05, report("node-b", shard("qwen-1", "qwen", "loading"))),
    ]
    control = ScriptedControl()
    control.explanations["llama-8b"] = {
        "model": "llama-8b",
        "placeable": False,
        "summary": "model 'llama-8b' cannot be placed: profile 'vllm': node-b: 1 of 2 GPUs free",
    }
    with serve(tmp_path, inventory=inventory, control=control) as server:
        code, out, err = run(server, tmp_path, "drain", "node-a", "--wait", "--timeout", "0.3")
    assert (code, out) == (1, "")
    assert err.splitlines()[-5:] == [
        "error: node node-a is not drained after 0.3 s; still on it:",
        "  llama-0 (llama-8b, ready): no replacement can be placed: model 'llama-8b' cannot be "
        "placed: profile 'vllm': node-b: 1 of 2 GPUs free",
        "  old-0 (retired, ready): model retired is not in the catalog; it is stopped, not moved",
        "  qwen-0 (qwen, ready): waiting for its replacement qwen-1 on node-b (loading)",
        "the node stays draining: no new work goes to it (`llmgw nodes undrain node-a` undoes "
        "that)",
    ]


def test_drain_without_wait_and_an_empty_node(tmp_path: Path) -> None:
    with serve(tmp_path, inventory=fleet(shard("llama-0", "llama-8b", "ready"))) as server:
        code, out, _ = run(server, tmp_path, "drain", "node-a")
        assert code == 0 and out.startswith("node node-a is draining: no new work is placed")
        code, out, err = run(server, tmp_path, "drain", "node-b", "--wait")
        assert (code, out) == (0, "node node-b is drained: nothing was running on it\n")
        assert err == ""
        code, out, _ = run(server, tmp_path, "drain", "node-b", "--json")
        assert json.loads(out)["draining"] is True
        code, _, err = run(server, tmp_path, "drain", "ghost", "--wait")
        assert code == 2 and err.startswith("error: no node 'ghost' is known")


# ---- remove-weights ----


class Weights:
    """The agent service's `remove_weights`, as the node would answer."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, node_id: str, path: str) -> None:
        self.calls.append((node_id, path))
        if node_id == "node-b":
            raise NodeNotConnected(
                f"cannot remove weights {path!r} on node {node_id!r}: it has no open agent "
                "stream (not registered, or its agent is down or reconnecting)",
                node_id=node_id,
            )
        if path.startswith("/etc"):
            error = (
                f"refusing to remove {path!r}: it resolves to {path}, which is not inside the "
                "weights directory /srv/weights; only paths inside it may be removed"
            )
            raise CommandFailed(
                f"node {node_id!r} refused to remove weights {path!r}: {error}",
                node_id=node_id,
                error=error,
            )


def test_remove_weights_reports_progress_and_the_outcome(tmp_path: Path) -> None:
    clock = VirtualClock()
    inventory = Inventory(
        clock=clock, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    inventory.register(registration("node-a"))
    inventory.register(registration("node-b"))
    weights = Weights()
    with serve(tmp_path, inventory=inventory, remove_weights=weights) as server:
        code, out, err = run(server, tmp_path, "remove-weights", "node-a", "llama")
        assert code == 0, err
        assert progress(err) == ["asking node node-a to remove llama ..."]
        assert out.startswith("node node-a removed llama (or it was already gone) after ")

        code, out, err = run(server, tmp_path, "remove-weights", "node-a", "qwen", "--json")
        assert (code, json.loads(out)) == (0, {"node": "node-a", "path": "qwen", "removed": True})
        assert "node node-a removed qwen" in err

        code, out, err = run(server, tmp_path, "remove-weights", "node-a", "/etc/passwd")
        assert (code, out) == (2, "")
        assert err.splitlines()[-1] == (
            "error: node 'node-a' refused to remove weights '/etc/passwd': refusing to remove "
            "'/etc/passwd': it resolves to /etc/passwd, which is not inside the weights "
            "directory /srv/weights; only paths inside it may be removed"
        )
        code, _, err = run(server, tmp_path, "remove-weights", "node-b", "llama")
        assert code == 2 and "it has no open agent stream" in err
        code, _, err = run(server, tmp_path, "remove-weights", "ghost", "llama")
        assert code == 2 and err.splitlines()[-1].startswith("error: no node 'ghost' is known")
    assert weights.calls == [
        ("node-a", "llama"),
        ("node-a", "qwen"),
        ("node-a", "/etc/passwd"),
        ("node-b", "llama"),
    ]


def test_remove_weights_on_a_server_without_agents_is_not_available(tmp_path: Path) -> None:
    with serve(tmp_path, inventory=fleet()) as server:
        code, _, err = run(server, tmp_path, "remove-weights", "node-a", "llama")
    assert code == 1
    assert err.splitlines()[-1].startswith(
        "error: the admin API at http://127.0.0.1:"
    ) and err.splitlines()[-1].endswith(
        "answered HTTP 503: removing weights is not available: this server runs no agent service"
    )
