"""The control plane end to end: a real `llmgw server`, real agents, real sim engines.

Agents declare GPUs (`--gpus 2x24GiB`); the sim engine takes them like a real one.
Timings are shortened through the config file (heartbeats, lost window, retries).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import procs
import pytest
from procs import Proc, Server, free_port, free_port_block, llmgw


def wait_for(check: Callable[[], object], what: str, within: float = 30.0) -> Any:
    """`procs.wait_for` with this module's deadline."""
    return procs.wait_for(check, what, within)


CONTROL = (
    "control: {heartbeat_interval: 0.3, unreachable_after: 1.5, lost_after: 3, "
    "reconcile_interval: 0.5, retry_base: 1, retry_max: 4, activation_timeout: 60, "
    "activation_keepalive: 0.3, stop_grace: 5, placement: %s}\n"
    "router: {health: {interval: 0.5}}\n"
)


def sim_model(name: str, *, gpus: int = 1, args: str = "", **fields: object) -> str:
    extra = "".join(f"    {k}: {json.dumps(v)}\n" for k, v in fields.items())
    engine_args = json.dumps(args.split()) if args else "[]"
    return (
        f"  - name: {name}\n    weights: none\n"
        f"    profiles: [{{name: sim-{gpus}gpu, engine: sim, gpus: {gpus}, "
        f"engine_args: {engine_args}}}]\n{extra}"
    )


class Fleet:
    def __init__(self, server: Server, agents: dict[str, Proc], agent_port: int, tmp: Path):
        self.server = server
        self.agents = agents
        self.agent_port = agent_port
        self.tmp = tmp

    def model(self, name: str) -> dict[str, Any]:
        response = httpx.get(f"{self.server.admin}/admin/api/models/{name}", timeout=10)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    def status(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.model(name)["status"]
        return status

    def ready_replicas(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.status(name)["replicas"] if r["state"] == "ready"]

    def events(self, model: str) -> list[dict[str, Any]]:
        response = httpx.get(
            f"{self.server.admin}/admin/api/events", params={"model": model}, timeout=10
        )
        events: list[dict[str, Any]] = response.json()["events"]
        return events

    def chat(self, model: str, *, timeout: float = 60.0, **body: object) -> httpx.Response:
        return httpx.post(
            f"{self.server.url}/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": 5,
                **body,
            },
            timeout=timeout,
        )


def start_agent(node: str, agent_port: int, tmp: Path, low: int | None = None) -> Proc:
    low = low or free_port_block(10)
    return Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", node,
            "--gpus", "2x24GiB", "--weights-dir", str(tmp / node),
            "--port-range", f"{low}-{low + 9}",
        )
    )  # fmt: skip


def start_server(tmp: Path, agent_port: int) -> Server:
    return Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp / "llmgw.yaml"),
        data_dir=tmp / "data",
    )  # fmt: skip


@contextmanager
def fleet(
    tmp: Path,
    models: str,
    *,
    nodes: int = 2,
    placement: str = "pack",
    first_port: int | None = None,
    extra: str = "",
) -> Iterator[Fleet]:
    """`extra`: more top-level config (e.g. `telemetry:`)."""
    (tmp / "llmgw.yaml").write_text(CONTROL % placement + extra + "models:\n" + models)
    agent_port = free_port()
    server = start_server(tmp, agent_port)
    agents: dict[str, Proc] = {}
    running = Fleet(server, agents, agent_port, tmp)
    try:
        for i in range(1, nodes + 1):
            agents[f"node-{i}"] = start_agent(f"node-{i}", agent_port, tmp, first_port)
        wait_for(lambda: len(registered(server)) == nodes, "every agent to register")
        yield running
    except BaseException:
        print(server.proc.output())
        raise
    finally:
        for proc in agents.values():
            proc.stop()
        running.server.proc.stop()


def registered(server: Server) -> list[str]:
    nodes = httpx.get(server.admin + "/admin/api/nodes", timeout=10).json()["nodes"]
    return [n["id"] for n in nodes if n["state"] == "ready"]


def test_models_are_placed_within_resources_and_refused_with_reasons_beyond_them(
    tmp_path: Path,
) -> None:
    models = sim_model("duo", min_replicas=2, max_replicas=2) + sim_model("huge", gpus=4)
    with fleet(tmp_path, models) as f:
        wait_for(lambda: len(f.ready_replicas("duo")) == 2, "both replicas of duo")
        replicas = f.ready_replicas("duo")
        # Each on a GPU of its own (the nodes may register one after the other,
        # so both may land on the first).
        assert [len(r["gpus"]) for r in replicas] == [1, 1]
        assert len({(r["node"], r["gpus"][0]) for r in replicas}) == 2
        served = {f.chat("duo").headers["x-llmgw-replica"] for _ in range(8)}
        assert served <= {r["id"] for r in replicas}

        explained = httpx.get(f"{f.server.admin}/admin/api/models/huge/placement").json()
        assert explained["placeable"] is False
        rejected = {r["node"]: r["reason"] for r in explained["profiles"][0]["rejected"]}
        assert set(rejected) == {"node-1", "node-2"}
        assert all("GPU" in reason for reason in rejected.values()), rejected

        answer = f.chat("huge", timeout=10)
        assert answer.status_code == 503
        error = answer.json()["error"]
        assert error["code"] == "model_unplaceable"
        assert "node-1" in error["message"] and "node-2" in error["message"]
        assert int(answer.headers["retry-after"]) > 0

        cli = subprocess.run(
            llmgw("models", "explain", "huge", "--admin", f.server.admin),
            check=False, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        assert "node-1" in cli.stdout and "node-2" in cli.stdout


def test_activation_from_zero_is_shared_streams_keepalives_and_scales_back_to_zero(
    tmp_path: Path,
) -> None:
    models = sim_model("lazy", args="--load-time 1.5", keep_alive=2)
    with fleet(tmp_path, models) as f:
        assert f.status("lazy")["replicas"] == []
        results: list[int] = []

        def one() -> None:
            results.append(f.chat("lazy").status_code)

        threads = [threading.Thread(target=one) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert results == [200] * 20
        starts = [e for e in f.events("lazy") if e["kind"] == "start"]
        assert len(starts) == 1, starts
        assert len(f.status("lazy")["replicas"]) == 1

        # Idle past keep_alive: back to zero, gracefully.
        wait_for(lambda: f.status("lazy")["replicas"] == [], "lazy to scale to zero")
        assert f.status("lazy")["state"] == "stopped"
        assert any(e["kind"] == "stop" for e in f.events("lazy"))

        # A stream activates it again; SSE comments keep it alive while it loads.
        with httpx.stream(
            "POST",
            f"{f.server.url}/v1/chat/completions",
            json={
                "model": "lazy",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "stream": True,
            },
            timeout=60,
        ) as stream:
            assert stream.status_code == 200
            lines = [line for line in stream.iter_lines() if line]
        assert lines[0].startswith(": llmgw is starting model lazy")
        data = [line for line in lines if line.startswith("data: ")]
        assert data[-1] == "data: [DONE]"
        assert json.loads(data[0][6:])["choices"][0]["delta"] is not None


def test_a_crashing_engine_fails_fast_with_its_output_and_backs_off(tmp_path: Path) -> None:
    models = sim_model("broken", args="--no-such-flag")
    with fleet(tmp_path, models) as f:
        answer = f.chat("broken", timeout=30)
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "model_failed"
        assert int(answer.headers["retry-after"]) >= 1
        # The client learns which replica failed where; the engine's output (its
        # arguments, paths, addresses) is the operator's, in the status below.
        assert "failed to start (replica " in error["message"]
        assert " on node " in error["message"]
        assert "llmgw models show broken" in error["message"]
        assert "no-such-flag" not in error["message"]

        status = f.status("broken")
        assert status["failures"] >= 1
        assert any("no-such-flag" in line for line in status["last_failure"]["output_tail"])

        # Retried with growing waits (1 s, 2 s, 4 s, capped at 4 s).
        wait_for(lambda: f.status("broken")["failures"] >= 3, "two retries", within=20)
        waits = [e["message"].rsplit("retrying in ", 1)[1] for e in f.events("broken")
                 if e["kind"] == "failed"]  # fmt: skip
        assert waits[::-1][:3] == ["1 s", "2 s", "4 s"], waits


def test_load_scales_replicas_up_to_max_and_back_down_after_the_delay(tmp_path: Path) -> None:
    models = sim_model(
        "busy", args="--itl 0.02", min_replicas=1, max_replicas=3,
        target_in_flight=2, scale_down_delay=2,
    )  # fmt: skip
    with fleet(tmp_path, models) as f:
        wait_for(lambda: len(f.ready_replicas("busy")) == 1, "busy's first replica")
        stop = threading.Event()
        codes: list[int] = []
        served: set[str] = set()

        def worker() -> None:
            while not stop.is_set():
                answer = f.chat("busy", max_tokens=50)  # about a second each
                codes.append(answer.status_code)
                served.add(answer.headers.get("x-llmgw-replica", ""))

        # Seven in flight at two per replica: four wanted, three allowed.
        workers = [threading.Thread(target=worker) for _ in range(7)]
        for thread in workers:
            thread.start()
        try:
            wait_for(lambda: len(f.ready_replicas("busy")) == 3, "three replicas under load")
            wait_for(lambda: len(served) == 3, "requests served by every replica")
            assert f.status("busy")["desired_replicas"] == 3
        finally:
            stop.set()
            for thread in workers:
                thread.join(60)
        assert set(codes) == {200}, codes
        # Idle again: after scale_down_delay, back to min_replicas.
        wait_for(lambda: len(f.ready_replicas("busy")) == 1, "back to one replica")
        scale = [e["message"] for e in f.events("busy") if e["kind"] == "scale"][::-1]
        # The first step up may already be the whole way, should the workers all
        # start before the controller looks.
        assert re.fullmatch(
            r"[2-7] requests in flight at 2 per replica: [23] replicas for the load", scale[0]
        ), scale
        assert any(m.endswith(": 3 replicas for the load") for m in scale), scale
        assert scale[-1].startswith("load lower for 2 s: 0 requests in flight"), scale
        # The two surplus replicas drain, then leave the list.
        wait_for(lambda: len(f.status("busy")["replicas"]) == 1, "surplus replicas stopped")


def test_a_port_held_by_another_program_is_refused_and_the_retry_takes_the_next(
    tmp_path: Path,
) -> None:
    low = free_port_block(10)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", low))
        squatter.listen()
        with fleet(tmp_path, sim_model("m", min_replicas=1), nodes=1, first_port=low) as f:
            wait_for(lambda: len(f.ready_replicas("m")) == 1, "m to start on another port")
            assert f.ready_replicas("m")[0]["endpoint_url"] == f"http://127.0.0.1:{low + 1}"
            failed = [e["message"] for e in f.events("m") if e["kind"] == "failed"]
            assert len(failed) == 1, failed
            assert f"port: {low} is in use by another process" in failed[0]
            assert f.chat("m").status_code == 200


def test_a_killed_node_s_replicas_come_back_elsewhere_while_requests_are_served(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, sim_model("other", gpus=0), nodes=3, placement="spread") as f:
        # Added once every node is there, so the two replicas go to two nodes.
        ha = {
            "name": "ha",
            "weights": "none",
            "min_replicas": 2,
            "max_replicas": 2,
            "profiles": [{"name": "one-gpu", "engine": "sim", "gpus": 1}],
        }
        added = httpx.post(f"{f.server.admin}/admin/api/models", json=ha, timeout=10)
        assert added.status_code == 201, added.text
        wait_for(lambda: len(f.ready_replicas("ha")) == 2, "two replicas of ha")
        first = {r["node"] for r in f.ready_replicas("ha")}
        assert len(first) == 2
        victim = sorted(first)[0]
        failures: list[str] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                answer = f.chat("ha", timeout=30)
                if answer.status_code != 200:
                    failures.append(answer.text)
                time.sleep(0.05)

        loader = threading.Thread(target=load)
        loader.start()
        try:
            f.agents[victim].popen.send_signal(signal.SIGKILL)
            f.agents[victim].popen.wait(5)

            def moved() -> bool:
                nodes = {r["node"] for r in f.ready_replicas("ha")}
                return len(nodes) == 2 and victim not in nodes

            wait_for(moved, "the lost node's replica to come back elsewhere", within=40)
        finally:
            stop.set()
            loader.join(60)
        assert failures == []

        # The replacement starts once the node is unreachable; it is lost later.
        def lost() -> bool:
            nodes = httpx.get(f"{f.server.admin}/admin/api/nodes", timeout=10).json()["nodes"]
            return any(n["id"] == victim and n["state"] == "lost" for n in nodes)

        wait_for(lost, "the killed node to be lost")
        # The operator can see what happened to the node, in order.
        told = httpx.get(
            f"{f.server.admin}/admin/api/events", params={"node": victim}, timeout=10
        ).json()["events"]
        node_events = [re.split("[:;]", e["message"])[0] for e in told if e["kind"] == "node"]
        node_events.reverse()
        assert node_events[0].startswith("registered with 2 GPUs"), node_events
        assert node_events[-3:] == ["the agent's stream closed", "unreachable", "lost"], told


def test_draining_a_node_starts_the_replacement_before_stopping_the_old_one(
    tmp_path: Path,
) -> None:
    models = sim_model("mover", args="--load-time 1 --itl 0.03 --shutdown-grace 30", min_replicas=1)
    with fleet(tmp_path, models) as f:
        wait_for(lambda: len(f.ready_replicas("mover")) == 1, "mover to be ready")
        old = f.ready_replicas("mover")[0]
        # A stream of about 3 s is in flight on the old replica while it is drained.
        streamed: list[str] = []

        def stream() -> None:
            body = {"model": "mover", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 100, "stream": True}  # fmt: skip
            with httpx.stream(
                "POST", f"{f.server.url}/v1/chat/completions", json=body, timeout=60
            ) as response:
                streamed.extend(line for line in response.iter_lines() if line)

        in_flight = threading.Thread(target=stream)
        in_flight.start()
        time.sleep(0.3)
        drained = httpx.post(f"{f.server.admin}/admin/api/nodes/{old['node']}/drain", json={})
        assert drained.status_code == 200

        def moved() -> bool:
            replicas = f.status("mover")["replicas"]
            return [r["node"] for r in replicas if r["state"] == "ready"] == [
                n for n in ("node-1", "node-2") if n != old["node"]
            ] and len(replicas) == 1

        wait_for(moved, "mover to move off the drained node")
        events = f.events("mover")[::-1]  # oldest first
        new_ready = next(
            i
            for i, e in enumerate(events)
            if e["kind"] == "ready" and old["id"] not in e["message"]
        )
        old_stop = next(
            i for i, e in enumerate(events) if e["kind"] == "stop" and old["id"] in e["message"]
        )
        assert new_ready < old_stop, events
        assert f.chat("mover").status_code == 200
        in_flight.join(30)
        assert streamed[-1] == "data: [DONE]"
        assert sum(1 for line in streamed if line.startswith("data: {")) >= 100


def test_a_model_added_through_the_api_survives_a_restart(tmp_path: Path) -> None:
    with fleet(tmp_path, sim_model("base", gpus=0)) as f:
        added = subprocess.run(
            llmgw(
                "models", "add", "--admin", f.server.admin, "--name", "extra", "--weights",
                "none", "--engine", "sim", "--alias", "extra-alias",
            ),
            check=False, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        assert f.chat("extra-alias").status_code == 200

        f.server.proc.stop()
        f.server = start_server(tmp_path, f.agent_port)
        wait_for(lambda: len(registered(f.server)) == 2, "agents to reconnect")
        model = f.model("extra")
        assert model["source"] == "store"
        # The replica kept running through the restart and was adopted, not duplicated.
        wait_for(lambda: len(f.ready_replicas("extra")) == 1, "the adopted replica")
        assert f.chat("extra").status_code == 200
        assert len(f.status("extra")["replicas"]) == 1

        removed = httpx.delete(
            f"{f.server.admin}/admin/api/models/extra", headers={"Content-Type": "application/json"}
        )
        assert removed.status_code == 200
        wait_for(lambda: not any(
            r for n in httpx.get(f.server.admin + "/admin/api/nodes").json()["nodes"]
            for r in n["shards"] if r["model"] == "extra"
        ), "the removed model's replica to stop")  # fmt: skip
        gone = f.chat("extra")
        assert gone.status_code == 404


@pytest.mark.parametrize("body", [{"stream": True}, {}])
def test_a_model_that_may_not_be_activated_says_so(tmp_path: Path, body: dict[str, object]) -> None:
    models = sim_model("manual", activation=False) + sim_model("auto")
    with fleet(tmp_path, models, nodes=1) as f:
        answer = f.chat("manual", timeout=10, **body)
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "model_not_running"
