"""LoRA adapters loaded on request, end to end: a real `llmgw server`, a real agent and
the sim's copy of vLLM's runtime LoRA API. A request for an adapter that no replica has
starts its base (none runs), loads the adapter into the replica and is answered by it;
over the profile's `max_loaded` the least valuable idle adapter (asked for least, then
least recently) is unloaded; a request for it loads it again; an adapter the engine
refuses is answered at once with the engine's own words; `models show BASE` lists what
each replica has loaded; an adapter hammered beyond its replica's room is loaded on a
second replica, and both serve it.
"""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from hub_standin import make_repo, serve_hub
from lora_adapters import sim_adapter
from procs import Proc, Server, free_port, free_port_block, llmgw, role
from test_control_plane import CONTROL, Fleet, fleet, registered, start_agent, wait_for
from test_gateway_keys_limits_usage import bearer, create_key, error_of, usage_rows
from test_hub_weights import start_agent as hub_agent


def models(adapters: Path) -> str:
    entries = "".join(
        f"  - name: {name}\n    adapter_of: base\n    weights: {adapters / name}\n"
        for name in ("red", "green", "blue", "wide")
    )
    return (
        "  - name: base\n    weights: none\n"
        "    profiles: [{name: sim, engine: sim, gpus: 1,\n"
        "                adapters: {max_loaded: 2, max_rank: 8}}]\n"
        + entries
        + f"  - name: ghost\n    adapter_of: base\n    weights: {adapters / 'ghost'}\n"
    )


def engine_adapters(f: Fleet) -> list[str]:
    """The adapters the base's engine lists in its /v1/models, by name."""
    [replica] = f.ready_replicas("base")
    cards = httpx.get(str(replica["endpoint_url"]) + "/v1/models", timeout=10).json()["data"]
    return sorted(c["id"] for c in cards if c.get("parent") == "base")


def reported(f: Fleet) -> list[str]:
    """The adapters the base's replica has loaded, as its agent reported them."""
    replicas = f.ready_replicas("base")
    return sorted(replicas[0]["adapters"]) if replicas else []


def test_adapters_load_on_request_evict_the_idle_one_and_fail_in_the_engines_words(
    tmp_path: Path,
) -> None:
    root = tmp_path / "adapters"
    for name in ("red", "green", "blue"):
        sim_adapter(root, name, rank=8)
    sim_adapter(root, "wide", rank=16)
    with fleet(tmp_path, models(root), nodes=1) as f:
        assert f.status("base")["replicas"] == []  # nothing runs until asked

        # An adapter no replica has: its base starts, the adapter loads, it answers.
        red = f.chat("red")
        assert red.status_code == 200, red.text
        assert red.json()["model"] == "red"
        assert engine_adapters(f) == ["red"]
        wait_for(lambda: reported(f) == ["red"], "the agent to report red loaded")

        green = f.chat("green")
        assert green.status_code == 200, green.text
        assert engine_adapters(f) == ["green", "red"]

        # Over max_loaded (2): red, used least recently and idle, makes room for blue.
        blue = f.chat("blue")
        assert blue.status_code == 200, blue.text
        assert blue.json()["model"] == "blue"
        assert engine_adapters(f) == ["blue", "green"]
        wait_for(lambda: reported(f) == ["blue", "green"], "the agent to report red gone")

        # red is asked for again: it is loaded again (green is now the idle oldest).
        again = f.chat("red")
        assert again.status_code == 200, again.text
        assert again.json()["model"] == "red"
        assert engine_adapters(f) == ["blue", "red"]

        # The base is still served by its replica, which the router keeps as the base's
        # (its load counts for the base), with the adapters it holds after it.
        base = f.chat("base")
        assert base.status_code == 200, base.text
        assert base.json()["model"] == "base"
        [endpoint] = f.server.endpoints()
        assert endpoint["models"][0] == "base"

        shown = subprocess.run(
            llmgw("models", "show", "base", "--admin", f.server.admin),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        [replica] = f.ready_replicas("base")
        assert f"replica {replica['id']} has adapters loaded: " in shown.stdout
        assert shown.stdout.split("has adapters loaded: ")[1].splitlines()[0] in (
            "blue, red",
            "red, blue",
        )

        # The router's request metrics are per adapter (the name clients sent).
        counted = re.findall(
            r'llmgw_requests_total\{[^}]*model="red"[^}]*\} (\S+)', f.server.metrics()
        )
        assert sum(float(n) for n in counted) == 2

        # The engine refuses: answered at once, a client error, in the engine's words.
        wide = f.chat("wide")
        assert wide.status_code == 400, wide.text
        error = wide.json()["error"]
        assert error["code"] == "adapter_refused"
        assert "LoRA rank 16 is greater than max_lora_rank 8" in error["message"]
        ghost = f.chat("ghost")
        assert ghost.status_code == 400, ghost.text
        assert "Loading lora ghost failed: No adapter found for" in ghost.json()["error"]["message"]
        # Neither is listed as loaded; room was made first (blue, idle and least recently
        # used, was unloaded), and red, used last, stays.
        assert engine_adapters(f) == ["red"]
        wait_for(lambda: reported(f) == ["red"], "the agent to report only red loaded")
        assert f.chat("red").status_code == 200


def test_a_key_allowed_one_adapter_cannot_use_another_and_usage_names_the_base(
    tmp_path: Path,
) -> None:
    root = tmp_path / "adapters"
    for name in ("red", "green"):
        sim_adapter(root, name, rank=8)
    (tmp_path / "llmgw.yaml").write_text(
        CONTROL % "pack"
        + "auth: {refresh_interval: 0.2}\nusage: {flush_interval: 0.05}\nmodels:\n"
        + models(root)
    )
    data_dir = tmp_path / "data"
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        auth=True, data_dir=data_dir,
    )  # fmt: skip
    agent = None
    try:
        agent = start_agent("node-1", agent_port, tmp_path)
        only_red = create_key(data_dir, "--name", "only-red", "--models", "red")
        url = server.url + "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "Say it kindly"}], "max_tokens": 4}
        answer = httpx.post(
            url, json={"model": "red", **body}, headers=bearer(only_red), timeout=60
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "red"
        engine_usage = answer.json()["usage"]
        for other in ("green", "base"):
            denied = httpx.post(
                url, json={"model": other, **body}, headers=bearer(only_red), timeout=60
            )
            assert error_of(denied, 403)["code"] == "model_not_allowed"

        def red_usage() -> list[object]:
            return [r for r in usage_rows(data_dir, model="red") if r.requests]

        [row] = wait_for(red_usage, "the adapter's usage to be recorded", within=30)
        assert (row.requests, row.prompt_tokens, row.completion_tokens) == (
            1,
            engine_usage["prompt_tokens"],
            engine_usage["completion_tokens"],
        )
        report = httpx.get(
            server.admin + "/admin/api/usage", params={"by": "model"}, timeout=10
        ).json()["usage"]
        by_model = {r["model"]: r for r in report}
        # The refused requests count as errors of what they asked for.
        assert {
            m: (r.get("adapter_of"), r["requests"], r["errors"]) for m, r in by_model.items()
        } == {"red": ("base", 1, 0), "green": ("base", 1, 1), "base": (None, 1, 1)}
        # `llmgw usage` reads the store, and says the same: a BASE column beside MODEL.
        cli = ("usage", "--by", "model", "--data-dir", str(data_dir))
        table = subprocess.run(llmgw(*cli), capture_output=True, text=True, check=True).stdout
        header, *lines = table.splitlines()
        assert header.split()[:3] == ["MODEL", "BASE", "REQUESTS"]
        cells = {line.split()[0]: line.split()[1:4] for line in lines}
        assert cells["red"] == ["base", "1", "0"]
        assert cells["green"] == ["base", "1", "1"]
        assert cells["base"] == ["-", "1", "1"]
        listed = json.loads(
            subprocess.run(llmgw(*cli, "--json"), capture_output=True, text=True, check=True).stdout
        )
        assert {r["model"]: r.get("adapter_of") for r in listed} == {
            "red": "base", "green": "base", "base": None,
        }  # fmt: skip
    except BaseException:
        print(server.proc.output())
        raise
    finally:
        if agent is not None:
            agent.stop()
        server.proc.stop()


def test_a_stream_waiting_for_a_load_gets_keepalive_comments_saying_so(tmp_path: Path) -> None:
    root = tmp_path / "adapters"
    sim_adapter(root, "red", rank=8)
    slow = (
        "  - name: base\n    weights: none\n    min_replicas: 1\n"
        "    profiles: [{name: sim, engine: sim, gpus: 1,\n"
        "                engine_args: [--lora-load-time, '1.5'],\n"
        "                adapters: {max_loaded: 2, max_rank: 8}}]\n"
        f"  - name: red\n    adapter_of: base\n    weights: {root / 'red'}\n"
    )
    with fleet(tmp_path, slow, nodes=1) as f:
        [replica] = wait_for(lambda: f.ready_replicas("base"), "base's replica")
        body = {
            "model": "red",
            "stream": True,
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 3,
        }
        with httpx.stream(
            "POST", f.server.url + "/v1/chat/completions", json=body, timeout=60
        ) as answer:
            assert answer.status_code == 200
            lines = [line for line in answer.iter_lines() if line]
        comments = [line for line in lines if line.startswith(":")]
        assert f": llmgw loading adapter red into replica {replica['id']} of base" in comments
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert chunks and {c["model"] for c in chunks} == {"red"}
        assert lines[-1] == "data: [DONE]"


def test_a_standby_asked_for_an_adapter_loaded_nowhere_waits_for_the_leader_to_load_it(
    tmp_path: Path, database: str
) -> None:
    root = tmp_path / "adapters"
    sim_adapter(root, "red", rank=8)
    (tmp_path / "llmgw.yaml").write_text(
        "control: {heartbeat_interval: 0.3, reconcile_interval: 0.5, lease_ttl: 3,\n"
        "          activation_keepalive: 0.2}\n"
        "models:\n"
        "  - name: base\n    weights: none\n    min_replicas: 1\n"
        "    profiles: [{name: sim, engine: sim, gpus: 1,\n"
        "                engine_args: [--lora-load-time, '1.5'],\n"
        "                adapters: {max_loaded: 2, max_rank: 8}}]\n"
        f"  - name: red\n    adapter_of: base\n    weights: {root / 'red'}\n"
    )
    ports = [free_port(), free_port()]
    servers: list[Server] = []
    agent = None

    def start(port: int) -> Server:
        server = Server(
            "--store", database, "--agent-listen", f"127.0.0.1:{port}",
            "--config", str(tmp_path / "llmgw.yaml"), wait_ready=False,
        )  # fmt: skip
        servers.append(server)
        return server

    try:
        leader = start(ports[0])
        wait_for(lambda: role(leader) == "leader", "the first server to lead")
        standby = start(ports[1])
        wait_for(lambda: role(standby) == "standby", "the second server to stand by")
        low = free_port_block(10)
        agent = Proc(
            llmgw(
                "agent", "--server", f"127.0.0.1:{ports[0]}",
                "--servers", f"127.0.0.1:{ports[1]}", "--node-id", "node-1",
                "--gpus", "2x24GiB", "--weights-dir", str(tmp_path / "node-1"),
                "--state-dir", str(tmp_path / "node-1" / "state"),
                "--port-range", f"{low}-{low + 9}",
            )
        )  # fmt: skip

        def served(server: Server, model: str) -> bool:
            return any(model in e["models"] for e in server.endpoints())  # type: ignore[operator]

        wait_for(lambda: served(standby, "base"), "the standby to route the base")
        assert not served(standby, "red") and not served(leader, "red")
        # Loaded nowhere: the standby asks the leader, and its stream waits (with
        # keep-alive comments saying so) until the leader's load reaches the store.
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        with httpx.stream(
            "POST",
            standby.url + "/v1/chat/completions",
            json={"model": "red", "stream": True, **body},
            timeout=60,
        ) as answer:
            assert answer.status_code == 200
            lines = [line for line in answer.iter_lines() if line]
        comments = [line for line in lines if line.startswith(":")]
        assert ": llmgw is waiting for the leader to load adapter red" in comments, lines
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert chunks and {c["model"] for c in chunks} == {"red"}
        assert lines[-1] == "data: [DONE]"
        # The leader loaded it, through its agent, into the base's replica.
        status = httpx.get(leader.admin + "/admin/api/models/base", timeout=10).json()["status"]
        [replica] = [r for r in status["replicas"] if r["state"] == "ready"]
        assert replica["adapters"] == ["red"]
        assert served(leader, "red")
        # Now both route it; the standby without asking again.
        answer = httpx.post(
            standby.url + "/v1/chat/completions", json={"model": "red", **body}, timeout=60
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "red"
        # Its replica is still the base's there too.
        [endpoint] = standby.endpoints()
        assert endpoint["models"][0] == "base"  # type: ignore[index]
    except BaseException:
        for server in servers:
            print(server.proc.output())
        raise
    finally:
        if agent is not None:
            agent.stop()
        for server in servers:
            server.proc.stop()


def test_a_restarted_agent_reports_the_adapters_its_adopted_engine_holds(tmp_path: Path) -> None:
    root = tmp_path / "adapters"
    sim_adapter(root, "red", rank=8)
    config = (
        "  - name: base\n    weights: none\n    min_replicas: 1\n"
        "    profiles: [{name: sim, engine: sim, gpus: 1,\n"
        "                adapters: {max_loaded: 2, max_rank: 8}}]\n"
        f"  - name: red\n    adapter_of: base\n    weights: {root / 'red'}\n"
    )
    with fleet(tmp_path, config, nodes=0) as f:
        low = free_port_block(5)
        argv = llmgw(
            "agent", "--server", f"127.0.0.1:{f.agent_port}", "--node-id", "node-a",
            "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / "w"),
            "--state-dir", str(tmp_path / "s"), "--port-range", f"{low}-{low + 4}",
        )  # fmt: skip
        # The first agent leaves its engine running when it stops (as in production);
        # the second, the test's default, stops it on its way out.
        agents = [Proc(argv, env={"LLMGW_AGENT_STOP_ENGINES_ON_EXIT": "0"})]
        try:
            [replica] = wait_for(lambda: f.ready_replicas("base"), "base's replica")
            assert f.chat("red", max_tokens=3).status_code == 200
            assert reported(f) == ["red"]
            agents[0].popen.terminate()
            agents[0].popen.wait(30)
            agents.append(Proc(argv))
            wait_for(lambda: "adopted 1 engine" in agents[1].output(), "the engine adopted")
            # The new agent asks the engine what it holds and reports it, unasked.
            wait_for(
                lambda: "the adopted engine holds adapters ('red',)" in agents[1].output(),
                "the new agent to read the engine's adapters",
            )
            wait_for(lambda: reported(f) == ["red"], "the shard to report red again")
            assert [r["id"] for r in f.ready_replicas("base")] == [replica["id"]]
            routed = [e["id"] for e in f.server.endpoints() if "red" in e["models"]]  # type: ignore[operator]
            assert routed == [replica["id"]]
            # Served where it is, with no second load.
            answer = f.chat("red", max_tokens=3)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == "red"
            assert f.server.proc.output().count("loading adapter red into replica") == 1
            assert engine_adapters(f) == ["red"]
        except BaseException:
            for agent in agents:
                print(agent.output())
            raise
        finally:
            for agent in agents:
                agent.stop()


def test_an_adapter_from_the_hub_is_downloaded_by_the_agent_then_loaded(tmp_path: Path) -> None:
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}
    (tmp_path / "llmgw.yaml").write_text(
        CONTROL % "pack" + "models:\n" + "  - name: base\n    weights: none\n    min_replicas: 1\n"
        "    profiles: [{name: sim, engine: sim, adapters: {max_loaded: 2, max_rank: 8}}]\n"
        "  - name: red\n    adapter_of: base\n    weights: org/red-lora\n"
        "  - name: nope\n    adapter_of: base\n    weights: org/no-such-lora\n"
    )
    agent_port = free_port()
    with serve_hub() as hub:
        hub.add(make_repo("org/red-lora", {"adapter_config.json": json.dumps(config).encode()}))
        server = Server(
            "--agent-listen", f"127.0.0.1:{agent_port}",
            "--config", str(tmp_path / "llmgw.yaml"), data_dir=tmp_path / "data",
        )  # fmt: skip
        agent = hub_agent(agent_port, tmp_path, hub)
        try:
            # Asked before the node registered, the base would be refused as unplaceable.
            wait_for(lambda: registered(server) == ["node-a"], "the agent to register")
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            url = server.url + "/v1/chat/completions"
            red = httpx.post(url, json={"model": "red", **body}, timeout=60)
            assert red.status_code == 200, red.text
            assert red.json()["model"] == "red"
            assert hub.file_gets("adapter_config.json")  # the agent fetched it
            missing = httpx.post(url, json={"model": "nope", **body}, timeout=60)
            assert missing.status_code == 400, missing.text
            assert "the hub refused org/no-such-lora" in missing.json()["error"]["message"]
        except BaseException:
            print(server.proc.output())
            raise
        finally:
            agent.stop()
            server.proc.stop()


def test_a_hot_adapter_beyond_its_replicas_room_is_loaded_on_another_and_served_by_both(
    tmp_path: Path,
) -> None:
    """Two replicas of the base, each taking 2 requests at once (`max_in_flight: 2`, the
    sim's `--max-running 2`); 6 long requests for one adapter at once: the router finds
    the replica holding it full, the control plane loads it on the other replica while
    the overflow waits in the queue, and the waiting requests are served there."""
    root = tmp_path / "adapters"
    sim_adapter(root, "hot", rank=8)
    two = (
        "  - name: base\n    weights: none\n    min_replicas: 2\n    max_replicas: 2\n"
        "    max_in_flight: 2\n"
        "    profiles: [{name: sim, engine: sim, gpus: 1,\n"
        "                engine_args: [--max-running, '2'],\n"
        "                adapters: {max_loaded: 2, max_rank: 8}}]\n"
        f"  - name: hot\n    adapter_of: base\n    weights: {root / 'hot'}\n"
    )

    def holders(f: Fleet) -> set[str]:
        return {r["id"] for r in f.ready_replicas("base") if "hot" in r["adapters"]}

    with fleet(tmp_path, two, nodes=1) as f:

        def both() -> set[str] | None:
            ready = {r["id"] for r in f.ready_replicas("base")}
            return ready if len(ready) == 2 else None

        replicas = wait_for(both, "both replicas of base")
        first = f.chat("hot")
        assert first.status_code == 200, first.text
        [holder] = wait_for(lambda: holders(f) or None, "the agent to report hot loaded")
        # Long answers (the sim's 10 ms per token): the first two fill the holder while
        # the other four arrive.
        with ThreadPoolExecutor(max_workers=6) as pool:
            answers = list(pool.map(lambda _: f.chat("hot", max_tokens=500), range(6)))
        assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
        assert {a.json()["model"] for a in answers} == {"hot"}
        assert holders(f) == replicas
        served = {a.headers["x-llmgw-replica"] for a in answers}
        assert served == replicas, (served, holder)
