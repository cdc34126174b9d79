"""Reloading the config file's models without a restart: in place, refused, rolled.

A real `llmgw server` started with a config file declaring model `cfg` (three
pinned replicas of `llmgw sim`, `--output-tokens 3`, zero delays), a real agent
with four declared GPUs (room for one surge replica). In order:

1. `llmgw models reload` after adding an alias and changing the keep-alive and a
   router setting: the model changes in place (the same replicas serve, the alias
   answers), and the answer says the router setting needs a restart;
2. files with a mistake (a bad engine argument type, a YAML error, two models
   sharing a name) are refused whole, naming the file and the field, through the
   admin API, the CLI (exit 2) and SIGHUP (the server's log): nothing changes;
3. SIGHUP after changing the engine arguments (`--output-tokens 5`) under steady
   load: the replicas roll as `llmgw models add --replace` rolls them: 0 failed
   requests, never fewer than three routed replicas, every replica ends with the
   new arguments;
4. a model the file no longer declares is removed and its replicas drain.

A server started without a config file answers the reload with 409.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for
from rolling import Load, Watch

CONTROL = (
    "control: {heartbeat_interval: 0.3, unreachable_after: 15, lost_after: 30, "
    "reconcile_interval: 0.5, retry_base: 1, retry_max: 4, activation_timeout: 60, "
    "stop_grace: 5}\n"
)


def config(tokens: str, *, extra: str = "", interval: str = "0.5", other: bool = True) -> str:
    """The config file: model `cfg` with `--output-tokens TOKENS`, and model `other`."""
    text = (
        CONTROL
        + f"router: {{health: {{interval: {interval}}}}}\n"
        + "models:\n"
        + "  - name: cfg\n    weights: none\n    min_replicas: 3\n    max_replicas: 3\n"
        + f"    profiles: [{{name: sim, engine: sim, gpus: 1, engine_args: [--zero-delay, --output-tokens, '{tokens}']}}]\n"
        + extra
    )
    if other:
        text += (
            "  - name: other\n    weights: none\n"
            "    profiles: [{name: sim, engine: sim, engine_args: [--zero-delay]}]\n"
        )
    return text


def status(server: Server, name: str = "cfg") -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(
        f"{server.admin}/admin/api/models/{name}", timeout=10
    ).json()["status"]
    return answer


def on(server: Server, tokens: str) -> set[str]:
    """The ids of the three Ready replicas when every one runs `--output-tokens TOKENS`
    and the router routes to all of them with no rollout under way; empty otherwise."""
    now = status(server)
    ready = [r for r in now["replicas"] if r["state"] == "ready"]
    healthy = [e for e in server.endpoints() if "cfg" in e["models"] and e["healthy"]]  # type: ignore[operator]
    if (
        len(now["replicas"]) != 3
        or len(ready) != 3
        or len(healthy) != 3
        or now["rollout"] is not None
        or any(r["engine_args"][-1] != tokens for r in ready)
    ):
        return set()
    return {r["id"] for r in ready}


def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw(*args, "--admin", server.admin),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def reload(server: Server) -> httpx.Response:
    return httpx.post(server.admin + "/admin/api/config/reload", json={}, timeout=30)


def test_a_reloaded_config_file_changes_models_in_place_refuses_mistakes_and_rolls(
    tmp_path: Path,
) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text(config("3"))
    agent_port = free_port()
    low = free_port_block(8)
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(path),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-r",
            "--gpus", "4x24GiB", "--weights-dir", str(tmp_path / "weights"),
            "--port-range", f"{low}-{low + 7}",
        )
    )  # fmt: skip
    try:
        first = wait_for(lambda: on(server, "3"), "three replicas", 90)

        # 1. In place: an alias, the keep-alive; a router setting is only reported.
        path.write_text(
            config("3", extra="    aliases: [cfg-alias]\n    keep_alive: -1\n", interval="0.6")
        )
        told = cli(server, "models", "reload")
        assert told.returncode == 0, told.stderr
        assert f"reloaded the models of {path}" in told.stdout, told.stdout
        assert "changed in place:  cfg" in told.stdout, told.stdout
        assert "rolling out:       none" in told.stdout, told.stdout
        assert "unchanged:         1" in told.stdout, told.stdout
        assert "not applied until the server restarts" in told.stdout, told.stdout
        assert "router" in told.stdout.splitlines()[-1], told.stdout
        model = httpx.get(server.admin + "/admin/api/models/cfg", timeout=10).json()
        assert model["aliases"] == ["cfg-alias"] and model["source"] == "config", model
        answer = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "cfg-alias", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert on(server, "3") == first

        # 2. Mistakes are refused whole: nothing changes.
        good = path.read_text()
        for text, words in (
            (
                good.replace("gpus: 1", "gpus: many"),
                f"{path}: models[0].profiles[0].gpus:",
            ),
            (good + "  - {name: [\n", f"{path}: not valid YAML"),
            (
                good + "  - {name: cfg-alias, weights: none, profiles: [{name: s, engine: sim}]}\n",
                "cfg-alias",
            ),
            (
                good.replace("'3'", "'5'").replace(
                    "engine: sim, engine_args: [--zero-delay]}", "engine: nope}"
                ),
                f"{path}: models[1].profiles[0].engine",
            ),
        ):
            path.write_text(text)
            refused = reload(server)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["code"] == "invalid_config", error
            assert words in error["message"] and "nothing was reloaded" in error["message"], error
            by_cli = cli(server, "models", "reload")
            assert by_cli.returncode == 2, by_cli.stdout
            assert words in by_cli.stderr and "Traceback" not in by_cli.stderr, by_cli.stderr
        server.proc.signal(signal.SIGHUP)
        wait_for(
            lambda: "SIGHUP: the config file was not reloaded" in server.proc.output(),
            "the refused SIGHUP in the log",
        )
        assert f"{path}: models[1].profiles[0].engine" in server.proc.output()
        assert httpx.get(server.admin + "/admin/api/models/cfg").json()["aliases"] == ["cfg-alias"]
        assert on(server, "3") == first

        # 3. SIGHUP after changing the engine arguments: the replicas roll under load.
        path.write_text(good.replace("'3'", "'5'"))
        with Load(server.url, model="cfg") as load, Watch(server, model="cfg") as watch:
            wait_for(lambda: len(load.tokens) >= 10, "requests to flow")
            server.proc.signal(signal.SIGHUP)
            second = wait_for(lambda: on(server, "5"), "the replicas to roll", 120)
            sent = len(load.tokens)
            wait_for(lambda: len(load.tokens) >= sent + 20, "requests after the roll")
        assert load.failures == [], load.failures[:5]
        assert watch.looks > 0 and watch.fewest >= 3, watch.fewest
        assert load.tokens[0] == 3 and load.tokens[-20:] == [5] * 20
        assert not second & first
        assert "SIGHUP: reloaded the models of" in server.proc.output()
        events = httpx.get(
            f"{server.admin}/admin/api/events", params={"model": "cfg"}, timeout=10
        ).json()["events"]
        stops = [e["message"] for e in events if e["kind"] == "stop"]
        assert len(stops) == 3 and all("previous spec" in m for m in stops), stops

        # 4. A model the file no longer declares is removed.
        path.write_text(
            config("5", other=False, extra="    aliases: [cfg-alias]\n    keep_alive: -1\n")
        )
        removed = reload(server)
        assert removed.status_code == 200, removed.text
        assert removed.json()["removed"] == ["other"], removed.json()
        gone = httpx.get(server.admin + "/admin/api/models/other", timeout=10)
        assert gone.status_code == 404, gone.text
        assert on(server, "5") == second
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_a_server_without_a_config_file_has_nothing_to_reload(tmp_path: Path) -> None:
    server = Server(
        "--endpoint", "e1=http://127.0.0.1:9=m", data_dir=tmp_path / "data", wait_ready=False
    )  # fmt: skip
    try:
        refused = reload(server)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "no_config_file"
        assert "started without --config" in refused.json()["error"]["message"]
        told = cli(server, "models", "reload")
        assert told.returncode == 2 and "started without --config" in told.stderr, told.stderr
    finally:
        server.proc.stop()
