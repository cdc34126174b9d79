"""Hub weights are the agent's job: downloaded once per node with the real hub client.

A real `llmgw server`, real agents and `llmgw sim` engines, and a hub stand-in
(`hub_standin`) serving a small repo over the API the real `huggingface_hub`
client uses; agents get `HF_ENDPOINT` pointing at it. The stand-in throttles
its bytes so a download lasts long enough to be seen (and killed) mid-way. The
repo, config and helpers are `hub_fleet`'s (shared with the progress tests).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from hub_fleet import (
    RATE,
    SEED,
    WEIGHT_BYTES,
    config,
    hub_fleet,
    models_show,
    node_view,
    shards,
    start_agent,
    tiny_repo,
)
from hub_standin import HubStandin, make_repo
from procs import Server, free_port, llmgw, wait_for


def proc_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def proc_argv(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def test_the_agent_downloads_hub_weights_and_starts_the_engine_offline_on_the_snapshot(
    tmp_path: Path, hub: HubStandin
) -> None:
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    hub.bytes_per_second = RATE  # about 5 s: progress is seen before it is done
    (tmp_path / "llmgw.yaml").write_text(config(f"org/tiny@{sha}"))
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = start_agent(agent_port, tmp_path, hub)
    try:
        seen = wait_for(
            lambda: [s for s in shards(server) if "% of 30.0 MB" in s.get("message", "")],
            "download progress in the node's shard",
        )
        assert seen[0]["message"].startswith(f"downloading org/tiny@{sha[:7]} "), seen
        hub.bytes_per_second = 0  # progress seen: the rest comes unpaced
        ready = wait_for(
            lambda: [s for s in shards(server) if s["state"] == "ready"], "the replica ready"
        )
        pid = ready[0]["pid"]
        snapshot = tmp_path / "node-a" / "weights" / "hub" / "models--org--tiny" / "snapshots" / sha
        argv = proc_argv(pid)
        assert argv[argv.index("--weights") + 1] == str(snapshot)
        env = proc_env(pid)
        assert env["HF_HUB_OFFLINE"] == "1"
        # Compile caches live beside the weights, so a second start on this node reuses them.
        weights = tmp_path / "node-a" / "weights"
        assert env["VLLM_CACHE_ROOT"] == str(weights / ".engine-cache" / "vllm")
        assert env["TORCHINDUCTOR_CACHE_DIR"] == str(weights / ".engine-cache" / "torchinductor")
        assert (snapshot / "model.safetensors").stat().st_size == WEIGHT_BYTES
        answer = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert len(hub.file_gets("model.safetensors")) == 1
        # The node reports what it holds: the admin API and `llmgw nodes show` list it.
        held = wait_for(lambda: node_view(server)["weights"], "the node to report its weights")
        assert [(w["repo"], w["revision"]) for w in held] == [("org/tiny", sha)]
        assert held[0]["bytes"] >= WEIGHT_BYTES and held[0]["last_used"] is not None
        shown = subprocess.run(
            llmgw("nodes", "show", "node-a", "--admin", server.admin),
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert f"org/tiny@{sha[:7]}" in shown and "30.0 MB" in shown, shown
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_two_replicas_on_one_node_share_one_download_and_models_show_its_progress(
    tmp_path: Path, hub: HubStandin
) -> None:
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    hub.bytes_per_second = RATE
    (tmp_path / "llmgw.yaml").write_text(config(f"org/tiny@{sha}", min_replicas=2, max_replicas=2))
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = start_agent(agent_port, tmp_path, hub)
    try:

        def progress_shown() -> str | None:
            text = models_show(server)
            return text if "% of 30.0 MB" in text else None

        shown = wait_for(progress_shown, "models show to print the download's progress")
        assert f": downloading org/tiny@{sha[:7]} " in shown, shown
        hub.bytes_per_second = 0  # progress seen: the rest comes unpaced
        wait_for(
            lambda: len([s for s in shards(server) if s["state"] == "ready"]) == 2,
            "both replicas ready",
        )
        # Both engines run on the one snapshot, fetched once.
        assert len(hub.file_gets("model.safetensors")) == 1, hub.requests
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_a_download_killed_mid_way_is_resumed_by_the_restarted_agent(
    tmp_path: Path, hub: HubStandin
) -> None:
    # Two weight files: the small one is done long before the big one.
    first, second = os.urandom(10_000_000), os.urandom(40_000_000)
    repo = hub.add(
        make_repo(
            "org/two",
            {
                "config.json": b'{"model_type": "llama"}',
                "model-00001-of-00002.safetensors": first,
                "model-00002-of-00002.safetensors": second,
            },
        )
    )
    sha = repo.refs["main"]
    hub.bytes_per_second = RATE
    (tmp_path / "llmgw.yaml").write_text(config(f"org/two@{sha}"))
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = start_agent(agent_port, tmp_path, hub)
    agents = [agent]
    snapshot = tmp_path / "node-a" / "weights" / "hub" / "models--org--two" / "snapshots" / sha
    blobs = snapshot.parent.parent / "blobs"
    try:
        wait_for(
            (snapshot / "model-00001-of-00002.safetensors").exists,
            "the first file to be downloaded",
        )
        assert not (snapshot / "model-00002-of-00002.safetensors").exists()
        agent.popen.kill()  # mid-way through the second file
        agent.popen.wait(30)
        assert list(blobs.glob("*.incomplete")), "the killed agent left a part file"
        hub.bytes_per_second = 0  # killed mid-way: the resumed rest comes unpaced
        agent = start_agent(agent_port, tmp_path, hub)
        agents.append(agent)
        wait_for(
            lambda: [s for s in shards(server) if s["state"] == "ready"],
            "the replica ready after the restart",
            within=120,
        )
        assert (snapshot / "model-00001-of-00002.safetensors").read_bytes() == first
        assert (snapshot / "model-00002-of-00002.safetensors").read_bytes() == second
        # The finished file was not fetched again; the one cut off was.
        assert len(hub.file_gets("model-00001-of-00002.safetensors")) == 1
        assert len(hub.file_gets("model-00002-of-00002.safetensors")) == 2
        assert not list(blobs.glob("*.incomplete"))
    except BaseException:
        print(server.proc.output())
        for proc in agents:
            print(proc.output())
        raise
    finally:
        for proc in agents:
            proc.stop()
        server.proc.stop()


@pytest.mark.parametrize(
    ("weights", "reason"),
    [
        ("org/missing@{sha}", "Repository not found"),
        ("org/tiny@0000000000000000000000000000000000000000", "Invalid rev id"),
    ],
)
def test_a_bad_repo_or_revision_fails_the_replica_with_the_hubs_reason(
    tmp_path: Path, hub: HubStandin, weights: str, reason: str
) -> None:
    repo = hub.add(tiny_repo())
    (tmp_path / "llmgw.yaml").write_text(config(weights.format(sha=repo.refs["main"])))
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = start_agent(agent_port, tmp_path, hub)
    try:

        def failures() -> list[dict[str, Any]]:
            events: list[dict[str, Any]] = httpx.get(
                f"{server.admin}/admin/api/events", params={"model": "tiny"}, timeout=10
            ).json()["events"]
            return [e for e in events if e["kind"] == "failed" and reason in e["message"]]

        # Failed, with the hub's words, and retried (a second failure) with backoff.
        def twice() -> list[dict[str, Any]] | None:
            found = failures()
            return found if len(found) >= 2 else None

        found = wait_for(twice, "the hub's refusal, twice")
        assert "the hub refused org/" in found[0]["message"], found
        assert "exit code" not in found[0]["message"], found
        assert reason in models_show(server)
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_adding_a_model_pins_its_hub_revision_and_refuses_what_the_hub_refuses(
    tmp_path: Path, hub: HubStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = hub.add(tiny_repo())
    hub.add(tiny_repo("org/private", token="hf_secret"))
    sha = repo.refs["main"]
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    (tmp_path / "llmgw.yaml").write_text(SEED)
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = start_agent(agent_port, tmp_path, hub)

    def add(name: str, weights: str) -> httpx.Response:
        body = {"name": name, "weights": weights, "profiles": [{"name": "p", "engine": "sim"}]}
        return httpx.post(server.admin + "/admin/api/models", json=body, timeout=30)

    try:
        added = add("tiny", "org/tiny")  # the branch main, resolved now
        assert added.status_code == 201, added.text
        assert added.json()["weights"] == "org/tiny"
        assert added.json()["weights_commit"] == sha
        shown = models_show(server)
        assert f"weights:     org/tiny (commit {sha})" in shown, shown
        # The branch moves on: the model still runs the commit it was added at.
        moved = make_repo("org/tiny", {"config.json": b"{}"}, seed="later")
        repo.commits.update(moved.commits)
        repo.refs["main"] = moved.refs["main"]
        answer = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        [shard] = shards(server)
        argv = proc_argv(shard["pid"])
        assert argv[argv.index("--weights") + 1].endswith(f"/snapshots/{sha}")

        for name, weights, said in [
            ("nope", "org/nope", "Repository not found"),
            ("badrev", "org/tiny@v9", "Invalid rev id: v9"),
            ("private", "org/private", "Repository not found"),
        ]:
            refused = add(name, weights)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["param"] == "weights" and error["code"] == "invalid_model", error
            assert f"the hub refused {weights.split('@')[0]!r}" in error["message"], error
            assert said in error["message"], error
        listed = httpx.get(server.admin + "/admin/api/models", timeout=10).json()["models"]
        assert sorted(m["name"] for m in listed) == ["seed", "tiny"]
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_an_unreachable_hub_is_a_503_naming_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    (tmp_path / "llmgw.yaml").write_text(SEED)
    server = Server("--config", str(tmp_path / "llmgw.yaml"), data_dir=tmp_path / "data")
    try:
        body = {"name": "m", "weights": "org/m", "profiles": [{"name": "p", "engine": "sim"}]}
        refused = httpx.post(server.admin + "/admin/api/models", json=body, timeout=60)
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "hub_unavailable" and error["param"] == "weights", error
        assert "cannot resolve org/m@main" in error["message"], error
        assert "give weights_commit" in error["message"], error
        # Pinned by hand, it needs no hub.
        pinned = httpx.post(
            server.admin + "/admin/api/models",
            json={**body, "weights_commit": "a" * 40},
            timeout=60,
        )
        assert pinned.status_code == 201, pinned.text
        assert pinned.json()["weights_commit"] == "a" * 40
        # So is a revision that is a commit already.
        at_commit = httpx.post(
            server.admin + "/admin/api/models",
            json={**body, "name": "m2", "weights": "org/m@" + "b" * 40},
            timeout=60,
        )
        assert at_commit.status_code == 201, at_commit.text
        assert at_commit.json()["weights_commit"] == "b" * 40
    finally:
        server.proc.stop()


def test_a_request_waiting_for_an_activation_sees_the_download_in_its_keepalive_comments(
    tmp_path: Path, hub: HubStandin
) -> None:
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    hub.bytes_per_second = RATE
    (tmp_path / "llmgw.yaml").write_text(config(f"org/tiny@{sha}", min_replicas=0))
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = start_agent(agent_port, tmp_path, hub)
    try:
        wait_for(
            lambda: httpx.get(server.admin + "/admin/api/nodes", timeout=10).json()["nodes"],
            "the node to register",
        )
        comments: list[str] = []
        data: list[str] = []
        body = {
            "model": "tiny",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        }
        with httpx.stream(
            "POST", server.url + "/v1/chat/completions", json=body, timeout=120
        ) as answer:
            assert answer.status_code == 200
            for line in answer.iter_lines():
                if line.startswith(":"):
                    comments.append(line)
                elif line.startswith("data:"):
                    data.append(line)
        assert data[-1] == "data: [DONE]", data
        progress = [c for c in comments if c.startswith(f": llmgw downloading org/tiny@{sha[:7]} ")]
        assert any("% of 30.0 MB" in c and " left" in c for c in progress), comments
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_placement_prefers_the_node_holding_the_weights_and_explain_says_why(
    tmp_path: Path, hub: HubStandin
) -> None:
    from huggingface_hub import snapshot_download

    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    # node-b (which sorts after node-a, so ids would pick node-a) holds the snapshot.
    snapshot_download(
        "org/tiny", revision=sha, cache_dir=tmp_path / "node-b" / "weights" / "hub",
        endpoint=hub.url,
    )  # fmt: skip
    before = len(hub.file_gets("model.safetensors"))
    (tmp_path / "llmgw.yaml").write_text(config(f"org/tiny@{sha}", min_replicas=0))
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agents = [start_agent(agent_port, tmp_path, hub, node) for node in ("node-a", "node-b")]
    try:
        wait_for(lambda: node_view(server, "node-b").get("weights"), "node-b's weights")

        def explain() -> str:
            return subprocess.run(
                llmgw("models", "explain", "tiny", "--admin", server.admin),
                capture_output=True, text=True, timeout=60, check=True,
            ).stdout  # fmt: skip

        for _ in range(3):  # every time, not by luck
            shown = explain()
            assert "the next replica goes to node node-b" in shown, shown
            assert f"node-b: has org/tiny@{sha[:7]} on disk" in shown, shown
            assert f"node-a: must download 30.0 MB (org/tiny@{sha[:7]})" in shown, shown
        answer = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        [shard] = [s for s in shards(server) if s["state"] == "ready"]
        assert node_view(server, "node-b")["shards"][0]["id"] == shard["id"]
        # Started on what was there: nothing downloaded again.
        assert len(hub.file_gets("model.safetensors")) == before
    except BaseException:
        print(server.proc.output())
        for agent in agents:
            print(agent.output())
        raise
    finally:
        for agent in agents:
            agent.stop()
        server.proc.stop()


def test_models_activate_follows_the_download(tmp_path: Path, hub: HubStandin) -> None:
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    hub.bytes_per_second = RATE
    (tmp_path / "llmgw.yaml").write_text(config(f"org/tiny@{sha}", min_replicas=0))
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = start_agent(agent_port, tmp_path, hub)
    try:
        wait_for(lambda: node_view(server).get("connected"), "the node to register")
        done = subprocess.run(
            llmgw("models", "activate", "tiny", "--admin", server.admin, "--poll-interval", "0.2"),
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        steps = [
            line
            for line in done.stderr.splitlines()
            if f"starting on node-a: downloading org/tiny@{sha[:7]} " in line
            and "% of 30.0 MB" in line
        ]
        assert steps, done.stderr
        assert "model tiny is ready" in done.stdout + done.stderr, done
        assert not [line for line in steps if " h left" in line], steps
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_models_activate_on_a_terminal_draws_the_download_as_a_bar(
    tmp_path: Path, hub: HubStandin
) -> None:
    sha = hub.add(tiny_repo()).refs["main"]
    hub.bytes_per_second = RATE
    with hub_fleet(tmp_path, hub, config(f"org/tiny@{sha}", min_replicas=0)) as fleet:
        wait_for(lambda: node_view(fleet.server).get("connected"), "the node to register")
        command = " ".join(
            llmgw("models", "activate", "tiny", "--admin", fleet.server.admin,
                  "--poll-interval", "0.2")
        )  # fmt: skip
        on_tty = subprocess.run(
            ["script", "-qec", command, "/dev/null"],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert on_tty.returncode == 0, on_tty.stdout
        shown = on_tty.stdout
        # One bar, redrawn in place as the download moves; its steps are not lines.
        assert "\x1b[1F\x1b[J" in shown, shown
        assert re.search(rf"replica \S+ \[#*-+\] downloading org/tiny@{sha[:7]} \d+% of", shown)
        assert ": downloading " not in shown, shown
        assert "model tiny is ready" in shown, shown


def test_over_the_weights_limit_the_least_recently_used_unused_snapshot_is_evicted(
    tmp_path: Path, hub: HubStandin
) -> None:
    first = hub.add(tiny_repo("org/first"))
    second = hub.add(tiny_repo("org/second"))
    (tmp_path / "llmgw.yaml").write_text(
        "control: {heartbeat_interval: 0.3, reconcile_interval: 0.3, activation_timeout: 120}\n"
        "models:\n"
        + "".join(
            f"  - name: {name}\n    weights: org/{name}@{repo.refs['main']}\n"
            f"    keep_alive: {keep}\n    profiles: [{{name: sim, engine: sim}}]\n"
            for name, repo, keep in (("first", first, 1), ("second", second, 600))
        )
    )
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    # Room for one 30 MB snapshot, not two.
    agent = start_agent(agent_port, tmp_path, hub, "node-a", "--weights-max-use", "45MB")
    hub_dir = tmp_path / "node-a" / "weights" / "hub"

    def ask(model: str) -> None:
        answer = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text

    def held() -> list[str]:
        return [w["repo"] for w in node_view(server).get("weights") or []]

    try:
        ask("first")
        wait_for(lambda: held() == ["org/first"], "org/first on the node")
        # `first` goes idle and stops; `second` comes in: `first` is evicted for it.
        wait_for(lambda: not shards(server), "first to scale to zero", within=60)
        ask("second")
        wait_for(lambda: held() == ["org/second"], "only org/second on the node")
        assert not (hub_dir / "models--org--first" / "snapshots" / first.refs["main"]).exists()
        assert "removed org/first@" in agent.output()
        # In use, a snapshot is kept even over the limit: `first` comes back, `second`
        # (running) stays, and both are on disk until `second` stops.
        ask("first")
        wait_for(lambda: sorted(held()) == ["org/first", "org/second"], "both on the node")
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_an_agent_told_to_stop_does_not_wait_for_a_download(
    tmp_path: Path, hub: HubStandin
) -> None:
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    hub.bytes_per_second = 200_000  # 150 s for the whole file: far longer than a stop
    (tmp_path / "llmgw.yaml").write_text(config(f"org/tiny@{sha}"))
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = start_agent(agent_port, tmp_path, hub)
    try:
        wait_for(
            lambda: [s for s in shards(server) if "downloading" in s.get("message", "")],
            "the download to begin",
        )
        # The weights file itself is being fetched (by the hub client's own worker thread).
        wait_for(lambda: hub.file_gets("model.safetensors"), "the weights file's fetch to begin")
        agent.popen.terminate()
        assert agent.popen.wait(120) == 0, agent.output()
        # It stopped before the download ended: the file was never completed.
        snapshot = tmp_path / "node-a" / "weights" / "hub" / "models--org--tiny" / "snapshots"
        assert not (snapshot / sha / "model.safetensors").exists()
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()
