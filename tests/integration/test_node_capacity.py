"""Placement knows each node's disk and host memory; config-file hub weights are pinned.

A real `llmgw server` (with `HF_ENDPOINT` on the hub stand-in, so it resolves
config models' revisions and sizes), real agents each with their own weights and
state directories, and `llmgw sim` engines:

- a node whose disk cannot take a download (here its `--weights-max-use` leaves
  less room than the snapshot's size) is ruled out, and `models explain` says so;
- a replica whose node cannot hold it asleep in host memory (`--sleep-memory-max`)
  stays awake and serves, while one on a node that can sleeps, and the node's
  view counts the host memory it holds;
- config-file hub weights are pinned to the hub's commit when the config is read,
  and a repo the hub refuses stops the server (or a reload) naming file and field.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from hub_fleet import WEIGHT_BYTES, models_show, node_view, shards, start_agent, tiny_repo
from hub_standin import HubStandin
from procs import Proc, Server, free_port, llmgw, wait_for

CONTROL = (
    "control: {heartbeat_interval: 0.3, reconcile_interval: 0.3, retry_base: 0.5, "
    "retry_max: 2, activation_timeout: 120, activation_keepalive: 0.5}\n"
)


def model(name: str, weights: str = "org/tiny", *, role: str | None = None, **extra: Any) -> str:
    fields = "".join(f"    {k}: {v}\n" for k, v in extra.items())
    labels = f", labels: {{role: {role}}}" if role else ""
    return (
        f"  - name: {name}\n    weights: {weights}\n{fields}"
        f"    profiles: [{{name: sim, engine: sim, engine_args: [--zero-delay]{labels}}}]\n"
    )


def start(tmp: Path, body: str) -> tuple[Server, int]:
    (tmp / "llmgw.yaml").write_text(CONTROL + "models:\n" + body)
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp / "llmgw.yaml"),
        data_dir=tmp / "data",
    )  # fmt: skip
    return server, agent_port


def cli(server: Server, *args: str) -> str:
    done = subprocess.run(
        llmgw(*args, "--admin", server.admin),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def chat(server: Server, name: str) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": name, "messages": [{"role": "user", "content": "hi"}]},
        timeout=120,
    )


def reported(server: Server, node: str) -> dict[str, Any] | None:
    """The node's view once a heartbeat carried its disk and memory figures."""
    view = node_view(server, node)
    return view if view.get("disk_total_bytes") else None


def stop_all(server: Server, agents: list[Proc]) -> None:
    for agent in agents:
        agent.stop()
    server.proc.stop()


def test_a_node_whose_disk_cannot_take_the_weights_is_ruled_out_and_explain_says_so(
    tmp_path: Path, hub: HubStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    size = sum(len(data) for data in repo.commits[sha].values())
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    server, agent_port = start(tmp_path, model("tiny", keep_alive=-1))
    # node-a sorts first, so ids alone would pick it; its watermark leaves 10 MB.
    agents = [
        start_agent(agent_port, tmp_path, hub, "node-a", "--weights-max-use", "10MB"),
        start_agent(agent_port, tmp_path, hub, "node-b"),
    ]
    try:
        # The config model was pinned when the server read the file, with its size.
        shown = models_show(server)
        assert f"weights:     org/tiny (commit {sha}), 30.0 MB" in shown, shown
        stored = httpx.get(f"{server.admin}/admin/api/models/tiny", timeout=10).json()
        assert stored["weights_bytes"] == size, stored

        view_a = wait_for(lambda: reported(server, "node-a"), "node-a's disk figures")
        wait_for(lambda: reported(server, "node-b"), "node-b's disk figures")
        assert view_a["weights_max_use"] == {"bytes": 10_000_000}, view_a
        assert view_a["weights_room_bytes"] == 10_000_000, view_a
        assert view_a["disk_total_bytes"] >= view_a["weights_disk_free_bytes"] > 0, view_a

        explained = cli(server, "models", "explain", "tiny")
        assert "the next replica goes to node node-b" in explained, explained
        assert "disk cannot take 30.0 MB: " in explained, explained
        assert "weights limited to 10.0 MB" in explained, explained
        assert f"node-b: must download 30.0 MB (org/tiny@{sha[:7]})" in explained, explained

        # The dry run of a model not in the catalog yet pins it too, and says the same.
        body = {
            "name": "other",
            "weights": "org/tiny",
            "profiles": [{"name": "p", "engine": "sim"}],
        }
        dry = httpx.post(f"{server.admin}/admin/api/placement/dry-run", json=body, timeout=30)
        assert dry.status_code == 200, dry.text
        planned = dry.json()
        assert planned["placement"]["node"] == "node-b", planned
        [rejected] = planned["profiles"][0]["rejected"]
        assert rejected["node"] == "node-a", planned
        assert rejected["reason"].startswith("disk cannot take 30.0 MB: "), planned

        answer = chat(server, "tiny")
        assert answer.status_code == 200, answer.text
        [shard] = [s for s in shards(server) if s["state"] == "ready"]
        assert [s["id"] for s in node_view(server, "node-b")["shards"]] == [shard["id"]]
        assert node_view(server, "node-a")["shards"] == []

        shown_a = cli(server, "nodes", "show", "node-a")
        assert "downloads may take 9.5 MiB (--weights-max-use 9.5 MiB)" in shown_a, shown_a
        assert " used of " in shown_a, shown_a
        shown_b = cli(server, "nodes", "show", "node-b")
        assert "(no eviction)" in shown_b, shown_b
    except BaseException:
        print(server.proc.output())
        for agent in agents:
            print(agent.output())
        raise
    finally:
        stop_all(server, agents)


def test_a_replica_stays_awake_when_its_node_cannot_hold_it_asleep_in_host_memory(
    tmp_path: Path, hub: HubStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add(tiny_repo())
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    naps = dict(sleep_after=1, keep_alive=300)
    server, agent_port = start(
        tmp_path, model("roomy", role="b", **naps) + model("tight", role="a", **naps)
    )
    agents = [
        start_agent(
            agent_port, tmp_path, hub, "node-a", "--labels", "role=a",
            "--sleep-memory-max", "10MB",
        ),
        start_agent(agent_port, tmp_path, hub, "node-b", "--labels", "role=b"),
    ]  # fmt: skip
    try:
        wait_for(lambda: reported(server, "node-a"), "node-a's memory figures")
        for name in ("roomy", "tight"):
            answer = chat(server, name)
            assert answer.status_code == 200, answer.text

        def state(name: str) -> str:
            found = [s for s in shards(server) if s["model"] == name]
            return str(found[0]["state"]) if found else ""

        def events(name: str) -> list[dict[str, Any]]:
            got: list[dict[str, Any]] = httpx.get(
                f"{server.admin}/admin/api/events", params={"model": name}, timeout=10
            ).json()["events"]
            return got

        wait_for(lambda: state("roomy") == "sleeping", "roomy's idle replica to sleep")
        kept = wait_for(
            lambda: [e for e in events("tight") if "stays awake" in e["message"]],
            "tight's replica kept awake",
        )
        assert "asleep it would hold 30.0 MB of host memory" in kept[0]["message"], kept
        assert "--sleep-memory-max 10.0 MB" in kept[0]["message"], kept
        assert state("tight") == "ready"
        # Said once, not on every reconcile; the replica serves without a wake.
        assert len(kept) == 1, kept
        assert chat(server, "tight").status_code == 200
        assert not [e for e in events("tight") if e["kind"] == "wake"], events("tight")

        view_b = node_view(server, "node-b")
        assert view_b["sleeping_memory_bytes"] >= WEIGHT_BYTES, view_b
        assert view_b["memory_available_bytes"] > 0, view_b
        view_a = node_view(server, "node-a")
        assert view_a["sleeping_memory_bytes"] == 0, view_a
        assert view_a["sleep_memory_max_bytes"] == 10_000_000, view_a
        shown = cli(server, "nodes", "show", "node-b")
        assert "28.6 MiB held by sleeping replicas" in shown, shown
        assert "--sleep-memory-max 9.5 MiB" in cli(server, "nodes", "show", "node-a")
    except BaseException:
        print(server.proc.output())
        for agent in agents:
            print(agent.output())
        raise
    finally:
        stop_all(server, agents)


def test_a_config_model_the_hub_refuses_stops_the_server_and_a_reload_naming_file_and_field(
    tmp_path: Path, hub: HubStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add(tiny_repo())
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    config = tmp_path / "llmgw.yaml"
    config.write_text(CONTROL + "models:\n" + model("seed", "none") + model("bad", "org/nope"))
    started = subprocess.run(
        llmgw(
            "server", "--listen", f"127.0.0.1:{free_port()}",
            "--admin-listen", f"127.0.0.1:{free_port()}",
            "--agent-listen", f"127.0.0.1:{free_port()}", "--insecure-agents",
            "--auth-mode", "open", "--data-dir", str(tmp_path / "data"), "--config", str(config),
        ),
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    said = started.stdout + started.stderr
    assert started.returncode != 0, said
    assert f"{config}: models[1].weights: model 'bad', field 'weights': " in said, said
    assert "the hub refused 'org/nope' at revision 'main'" in said, said
    assert "Repository not found" in said, said
    assert "Traceback" not in said, said

    # A good file starts; a reload that names a bad revision changes nothing.
    config.write_text(CONTROL + "models:\n" + model("seed", "none") + model("tiny"))
    server = Server("--config", str(config), data_dir=tmp_path / "data")
    try:
        sha = hub.repos["org/tiny"].refs["main"]
        assert f"(commit {sha})" in models_show(server)
        config.write_text(
            CONTROL + "models:\n" + model("seed", "none") + model("tiny", "org/tiny@v9")
        )
        refused = subprocess.run(
            llmgw("models", "reload", "--admin", server.admin),
            check=False, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0, said
        assert f"{config}: models[1].weights: " in said, said
        assert "the hub refused 'org/tiny' at revision 'v9'" in said, said
        assert "nothing was reloaded" in said, said
        assert f"(commit {sha})" in models_show(server)
    except BaseException:
        print(server.proc.output())
        raise
    finally:
        server.proc.stop()
