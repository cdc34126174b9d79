"""`llmgw nodes` against the real nodes admin routes served by uvicorn on loopback."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from test_inventory_state import VirtualClock, ready_shard, registration
from typer.testing import CliRunner

from llmgw.cli.nodes import nodes_app
from llmgw.control.adminapi import node_routes
from llmgw.control.inventory import Inventory, ShardReport


@pytest.fixture
def inventory() -> Inventory:
    clock = VirtualClock()
    inventory = Inventory(
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
            output_tail=("CUDA error: out of memory",),
            exit_code=1,
        ),
    )
    inventory.register(registration("node-b"))
    clock.advance(7.0)
    return inventory


@pytest.fixture
def admin_url(inventory: Inventory) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(
            Starlette(routes=node_routes(inventory=inventory)), log_level="warning", lifespan="off"
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "admin server did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        nodes_app, list(args), env={"LLMGW_ADMIN_URL": None, "LLMGW_ADMIN_KEY": None}
    )
    return result.exit_code, result.stdout, result.stderr


def test_list_shows_a_table_and_json(admin_url: str) -> None:
    code, out, _ = run("list", "--admin", admin_url)
    assert code == 0
    header, first, second = out.splitlines()
    assert header.split()[:4] == ["NODE", "STATE", "HOST", "GPUS"]
    assert (
        first.startswith("node-a")
        and "2/2" in first
        and "1 failed, 1 ready" in first
        and "7s ago" in first
    )
    assert "2x NVIDIA H100 80GB HBM3" in first
    assert second.startswith("node-b") and "0/2" in second

    code, out, _ = run("list", "--json", "--admin", admin_url)
    assert code == 0
    assert [n["id"] for n in json.loads(out)] == ["node-a", "node-b"]


def test_show_drain_and_undrain(admin_url: str, inventory: Inventory) -> None:
    code, out, _ = run("show", "node-a", "--admin", admin_url)
    assert code == 0
    assert "node:       node-a (node-a.lab)" in out
    assert "fabric:     ib-domain=pod3" in out
    assert "llama-0" in out and "http://10.0.0.5:20001" in out
    assert "CUDA error: out of memory" in out

    code, out, _ = run("drain", "node-a", "--admin", admin_url)
    assert (code, out.strip()) == (
        0,
        "node node-a is draining: no new work is placed on it, and its replicas move "
        "elsewhere (`llmgw nodes drain node-a --wait` follows that)",
    )
    code, out, _ = run("show", "node-a", "--json", "--admin", admin_url)
    assert json.loads(out)["draining"] is True
    assert "ready, draining" in run("list", "--admin", admin_url)[1]
    code, out, _ = run("undrain", "node-a", "--admin", admin_url)
    assert code == 0 and "no longer draining" in out


def test_unknown_nodes_and_bad_input_exit_2(admin_url: str) -> None:
    code, _, err = run("show", "ghost", "--admin", admin_url)
    assert code == 2
    assert err.startswith("error: no node 'ghost' is known")
    code, _, err = run("drain", "ghost", "--admin", admin_url)
    assert code == 2 and "ghost" in err
    code, _, err = run("list", "--admin", "ftp://127.0.0.1:9090")
    assert code == 2 and "--admin must be an http:// or https:// URL" in err


def test_an_unreachable_admin_api_exits_1() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, out, err = run("list", "--admin", f"http://127.0.0.1:{port}")
    assert code == 1 and out == ""
    assert err.startswith(f"error: cannot reach the admin API at http://127.0.0.1:{port}")
    assert err.count("\n") == 1


def test_list_walks_the_servers_pages_and_stops_at_a_limit(
    admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One node per request: the two nodes take two pages.
    monkeypatch.setattr("llmgw.cli.nodes.LIST_PAGE", 1)
    code, out, _ = run("list", "--json", "--admin", admin_url)
    assert code == 0
    assert [n["id"] for n in json.loads(out)] == ["node-a", "node-b"]

    code, out, _ = run("list", "--limit", "1", "--admin", admin_url)
    assert code == 0
    assert out.splitlines()[1].startswith("node-a")
    assert "1 of 2 nodes shown; the next ones: llmgw nodes list --limit 1 --after node-a" in out
    code, out, _ = run("list", "--limit", "1", "--after", "node-a", "--admin", admin_url)
    assert code == 0 and out.splitlines()[1].startswith("node-b")
    assert "shown" not in out


def test_list_filters_on_the_server_and_names_a_bad_filter(admin_url: str) -> None:
    code, out, _ = run("list", "--state", "lost", "--admin", admin_url)
    assert (code, out.strip()) == (0, "no node matches (try without --state / --filter / --after)")
    code, out, _ = run("list", "--filter", "node-b", "--json", "--admin", admin_url)
    assert [n["id"] for n in json.loads(out)] == ["node-b"]
    code, _, err = run("list", "--state", "sleepy", "--admin", admin_url)
    assert code != 0
    assert "state must be one of draining, lost, ready, unreachable, got 'sleepy'" in err
    code, _, err = run("list", "--limit", "0", "--admin", admin_url)
    assert code != 0 and "--limit" in err
