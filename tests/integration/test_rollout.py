"""Rolling a model to changed engine arguments under steady load, a failing rollout, undo.

A real `llmgw server`, a real agent with four declared GPUs and `llmgw sim`
engines (zero delays). The model is added through the admin API with three
pinned replicas whose sims answer 3 tokens (`--output-tokens 3`) when a request
sets no `max_tokens`, so the arguments each reply came from are visible in its
usage. Chat requests flow one after another throughout while a thread watches
the router's healthy endpoints for the model. In order:

1. an in-place change (an alias, keep-alive) restarts nothing;
2. a change of arguments (`--output-tokens 5`) rolls the replicas: no request
   fails, the router never has fewer than 3 healthy endpoints for the model,
   every replica ends with the new arguments and replies have 5 tokens;
3. a spec whose engine exits at once (`--max-running 0` is refused by the
   sim) stops the rollout after its first replica, the three replicas of the
   previous spec serve on, and `models show`, `models rollout status`, the
   dashboard's model page and the events say why;
   A restarted server (same store) adopts them and keeps the rollout stopped;
4. `llmgw models rollout undo` puts the previous spec back: the stop is over
   and the replicas that served all along are current again, so nothing restarts.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for
from rolling import Load, Watch

CONFIG = (
    "control: {heartbeat_interval: 0.3, unreachable_after: 15, lost_after: 30, "
    "reconcile_interval: 0.5, retry_base: 1, retry_max: 4, activation_timeout: 60, "
    "stop_grace: 5}\n"
    "router: {health: {interval: 0.5}}\n"
    # A server serves only with a catalog; the model under test is added through the API.
    "models:\n  - name: fixed\n    weights: none\n"
    "    profiles: [{name: sim, engine: sim, engine_args: [--zero-delay]}]\n"
)


def spec(*args: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": "roll",
        "weights": "none",
        "min_replicas": 3,
        "max_replicas": 3,
        "keep_alive": -1,
        "profiles": [
            {"name": "sim", "engine": "sim", "gpus": 1, "engine_args": ["--zero-delay", *args]}
        ],
        **fields,
    }


def status(server: Server) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(server.admin + "/admin/api/models/roll", timeout=10).json()[
        "status"
    ]
    return answer


def replicas(server: Server) -> list[dict[str, Any]]:
    return [r for r in status(server)["replicas"] if r["state"] != "placing"]


def events(server: Server) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.get(
        f"{server.admin}/admin/api/events", params={"model": "roll"}, timeout=10
    ).json()["events"]
    return found


def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw(*args, "--admin", server.admin),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def all_on(server: Server, args: list[str]) -> bool:
    """Three Ready replicas, every one with `args`, and no rollout under way."""
    now = status(server)
    ready = [r for r in now["replicas"] if r["state"] == "ready"]
    return (
        len(now["replicas"]) == 3
        and len(ready) == 3
        and all(r["engine_args"] == args for r in ready)
        and now["rollout"] is None
    )


def test_a_rollout_under_load_fails_no_request_and_a_failing_one_stops_and_undoes(
    tmp_path: Path,
) -> None:
    config = tmp_path / "llmgw.yaml"
    config.write_text(CONFIG)
    agent_port = free_port()
    low = free_port_block(8)
    server_args = ("--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(config))
    server = Server(*server_args, data_dir=tmp_path / "data")
    servers = [server]
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-r",
            "--gpus", "4x24GiB", "--weights-dir", str(tmp_path / "weights"),
            "--port-range", f"{low}-{low + 7}",
        )
    )  # fmt: skip
    old_args = ["--zero-delay", "--output-tokens", "3"]
    new_args = ["--zero-delay", "--output-tokens", "5"]
    try:
        added = httpx.post(
            server.admin + "/admin/api/models", json=spec("--output-tokens", "3"), timeout=10
        )
        assert added.status_code == 201, added.text
        wait_for(lambda: all_on(server, old_args), "three replicas of the first spec", 90)
        first = {r["id"] for r in replicas(server)}

        # 1. In place: an alias and another keep-alive restart nothing.
        changed = httpx.put(
            server.admin + "/admin/api/models/roll",
            json=spec("--output-tokens", "3", aliases=["roll-alias"], keep_alive="1h"),
            timeout=10,
        )
        assert changed.status_code == 200, changed.text
        with Load(server.url, model="roll-alias") as by_alias:
            wait_for(lambda: len(by_alias.tokens) >= 5, "requests by the new alias")
        assert by_alias.failures == [], by_alias.failures[:3]
        assert {r["id"] for r in replicas(server)} == first
        assert status(server)["rollout"] is None
        assert len([e for e in events(server) if e["kind"] == "start"]) == 3

        # 2. New arguments (`llmgw models add --replace`): rolled under load, surge first.
        changed_file = tmp_path / "roll.json"
        changed_file.write_text(
            json.dumps(spec("--output-tokens", "5", aliases=["roll-alias"], keep_alive="1h"))
        )
        with Load(server.url) as load, Watch(server) as watch:
            wait_for(lambda: len(load.tokens) >= 20, "requests to flow")
            replaced = cli(server, "models", "add", "--replace", "--file", str(changed_file))
            assert replaced.returncode == 0, replaced.stderr
            wait_for(
                lambda: (status(server)["rollout"] or {}).get("state") == "rolling",
                "the rollout to begin",
            )
            wait_for(lambda: all_on(server, new_args), "every replica on the new spec", 120)
            sent = len(load.tokens)
            wait_for(lambda: len(load.tokens) >= sent + 20, "requests after the rollout")
        assert load.failures == [], load.failures[:5]
        assert watch.looks > 0 and watch.fewest >= 3, watch.fewest
        assert load.tokens[0] == 3 and load.tokens[-20:] == [5] * 20
        second = {r["id"] for r in replicas(server)}
        assert not second & first
        kinds = [e["message"] for e in events(server) if e["kind"] == "rollout"]
        assert any(m.startswith("rolling out a new spec") for m in kinds), kinds
        assert any(m.startswith("rollout done") for m in kinds), kinds
        stops = [e["message"] for e in events(server) if e["kind"] == "stop"]
        assert len(stops) == 3 and all("previous spec" in m for m in stops), stops

        # 3. A spec whose engine exits at once: the rollout stops after one replica.
        with Load(server.url) as load:
            wait_for(lambda: len(load.tokens) >= 5, "requests to flow")
            changed = httpx.put(
                server.admin + "/admin/api/models/roll",
                json=spec("--max-running", "0", aliases=["roll-alias"], keep_alive="1h"),
                timeout=10,
            )
            assert changed.status_code == 200, changed.text
            halted = wait_for(
                lambda: (
                    (status(server)["rollout"] or {}).get("state") == "halted"
                    and status(server)["rollout"]
                ),
                "the rollout to stop",
            )
            sent = len(load.tokens)
            wait_for(lambda: len(load.tokens) >= sent + 10, "requests after the stop")
        assert load.failures == [], load.failures[:5]
        assert "of the new spec failed" in halted["reason"], halted
        assert "llmgw models rollout undo roll" in halted["reason"], halted
        serving = [r for r in replicas(server) if r["state"] == "ready"]
        assert {r["id"] for r in serving} == second
        assert all(r["spec"] == "old" for r in serving), serving
        starts = [e for e in events(server) if e["kind"] == "start"]
        assert len(starts) == 3 + 3 + 1, starts  # one replica of the failing spec, no more
        shown = cli(server, "models", "show", "roll")
        assert shown.returncode == 0, shown.stderr
        assert "rollout stopped: replica" in shown.stdout, shown.stdout
        told = cli(server, "models", "rollout", "status", "roll")
        assert told.returncode == 0, told.stderr
        assert "rollout:  stopped:" in told.stdout, told.stdout
        assert told.stdout.count("\nold ") == 3, told.stdout
        assert "undo goes back to: weights none; sim: sim --zero-delay --output-tokens 5" in (
            told.stdout
        ), told.stdout
        assert any(
            e["kind"] == "rollout" and e["message"].startswith("rollout stopped")
            for e in events(server)
        )
        page = httpx.get(server.admin + "/admin/models/roll", timeout=10)
        assert page.status_code == 200, page.text
        assert "Rollout stopped: replica" in page.text, page.text
        assert page.text.count(">old spec<") == 3, page.text

        # The stop is kept in the store: a restarted control plane keeps it stopped.
        server.proc.stop()
        server = Server(*server_args, data_dir=tmp_path / "data")
        servers.append(server)
        wait_for(
            lambda: {r["id"] for r in replicas(server) if r["state"] == "ready"} == second,
            "the restarted server to adopt the replicas of the previous spec",
        )
        assert (status(server)["rollout"] or {}).get("state") == "halted", status(server)
        with Load(server.url) as load:
            wait_for(lambda: len(load.tokens) >= 10, "requests through the restarted server")
        assert load.failures == [], load.failures[:5]
        assert [e for e in events(server) if e["kind"] == "start"] == []

        # 4. Undo: the previous spec is back, and the replicas that served are current.
        undone = cli(server, "models", "rollout", "undo", "roll")
        assert undone.returncode == 0, undone.stderr
        assert "back on its previous spec" in undone.stdout, undone.stdout
        wait_for(lambda: all_on(server, new_args), "the replicas to be current again")
        assert {r["id"] for r in replicas(server)} == second
        model = httpx.get(server.admin + "/admin/api/models/roll", timeout=10).json()
        assert model["profiles"][0]["engine_args"] == new_args
        assert model["aliases"] == ["roll-alias"]
        again = cli(server, "models", "rollout", "status", "roll")
        assert "rollout:  none" in again.stdout, again.stdout
    except BaseException:
        for each in servers:
            print(each.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_rollout_commands_refuse_what_they_cannot_do(tmp_path: Path) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    server = Server("--config", str(tmp_path / "llmgw.yaml"), data_dir=tmp_path / "data")
    try:
        added = httpx.post(server.admin + "/admin/api/models", json=spec(), timeout=10)
        assert added.status_code == 201, added.text
        never = httpx.post(
            server.admin + "/admin/api/models/roll/rollout/undo", json={}, timeout=10
        )
        assert never.status_code == 409, never.text
        assert never.json()["error"]["code"] == "nothing_to_undo"
        assert "no earlier spec to go back to" in never.json()["error"]["message"]
        config = httpx.post(
            server.admin + "/admin/api/models/fixed/rollout/undo", json={}, timeout=10
        )
        assert config.status_code == 409, config.text
        assert config.json()["error"]["code"] == "model_read_only"
        missing = cli(server, "models", "rollout", "status", "nope")
        assert missing.returncode == 2, missing.stdout
        assert "nope" in missing.stderr and "Traceback" not in missing.stderr
        bad = httpx.post(
            server.admin + "/admin/api/models",
            json={**spec(), "name": "bad", "rollout": {"max_surge": 0, "max_unavailable": 0}},
            timeout=10,
        )
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["param"] == "rollout", bad.text
        assert "raise one of them" in bad.json()["error"]["message"]
    except BaseException:
        print(server.proc.output())
        raise
    finally:
        server.proc.stop()


def config_with(args: str) -> str:
    return (
        CONFIG
        + "  - name: cfg\n    weights: none\n    min_replicas: 2\n    max_replicas: 2\n"
        + "    keep_alive: -1\n"
        + f"    profiles: [{{name: sim, engine: sim, gpus: 1, engine_args: [--zero-delay, {args}]}}]\n"
    )


def test_a_config_file_change_rolls_the_adopted_replicas_after_a_restart(tmp_path: Path) -> None:
    # The config file is read at start-up: the restarted server adopts the replicas of
    # the old arguments (their engines outlive the agent's stream) and rolls them.
    config = tmp_path / "llmgw.yaml"
    config.write_text(config_with("--output-tokens, '3'"))
    agent_port = free_port()
    low = free_port_block(6)
    args = ("--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(config))
    server = Server(*args, data_dir=tmp_path / "data")
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-c",
            "--gpus", "3x24GiB", "--weights-dir", str(tmp_path / "weights"),
            "--port-range", f"{low}-{low + 5}",
        )
    )  # fmt: skip
    servers = [server]

    def cfg_status() -> dict[str, Any]:
        answer: dict[str, Any] = httpx.get(
            server.admin + "/admin/api/models/cfg", timeout=10
        ).json()["status"]
        return answer

    def all_ready(args: list[str]) -> bool:
        now = cfg_status()
        ready = [r for r in now["replicas"] if r["state"] == "ready"]
        return (
            len(now["replicas"]) == 2
            and len(ready) == 2
            and all(r["engine_args"] == args for r in ready)
            and now["rollout"] is None
        )

    try:
        wait_for(lambda: all_ready(["--zero-delay", "--output-tokens", "3"]), "two replicas", 90)
        first = {r["id"] for r in cfg_status()["replicas"]}
        server.proc.stop()
        config.write_text(config_with("--output-tokens, '5'"))
        server = Server(*args, data_dir=tmp_path / "data")
        servers.append(server)
        wait_for(
            lambda: {r["id"] for r in cfg_status()["replicas"] if r["state"] == "ready"} >= first,
            "the restarted server to adopt the replicas",
        )
        with Load(server.url, model="cfg") as load:
            wait_for(lambda: all_ready(["--zero-delay", "--output-tokens", "5"]), "the roll", 120)
            sent = len(load.tokens)
            wait_for(lambda: len(load.tokens) >= sent + 10, "requests after the roll")
        assert load.failures == [], load.failures[:5]
        assert load.tokens[-10:] == [5] * 10
        assert not {r["id"] for r in cfg_status()["replicas"]} & first
        stops = [
            e["message"]
            for e in httpx.get(
                f"{server.admin}/admin/api/events", params={"model": "cfg"}, timeout=10
            ).json()["events"]
            if e["kind"] == "stop"
        ]
        assert len(stops) == 2 and all("previous spec" in m for m in stops), stops
    except BaseException:
        for each in servers:
            print(each.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()
