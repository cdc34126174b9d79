"""Scaling on waiting requests and KV-cache use, end to end: a real `llmgw server`,
real agents and real sim engines whose /metrics the router reads.

The sims run one sequence at a time (`--max-running 1`), so requests beyond the
first wait in the engine, as they do in a full vLLM batch; a model with
`max_in_flight: 1` makes them wait in the router's queue instead.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from procs import Proc, free_port, free_port_block, llmgw
from test_control_plane import CONTROL, Fleet, fleet, sim_model, wait_for
from test_control_plane import start_server as control_plane_server
from test_standby_fleet import role, start_agent, start_server
from test_up import required_path


@contextmanager
def load(f: Fleet, model: str, workers: int, **body: object) -> Iterator[list[int]]:
    """`workers` clients sending chat requests back to back until the block ends;
    yields the status codes seen so far."""
    stop = threading.Event()
    codes: list[int] = []

    def worker() -> None:
        while not stop.is_set():
            try:
                codes.append(f.chat(model, max_tokens=40, **body).status_code)
            except httpx.TransportError:  # the server was killed
                codes.append(0)
                stop.wait(0.1)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    try:
        yield codes
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)


def scale_events(f: Fleet, model: str) -> list[str]:
    return [e["message"] for e in f.events(model) if e["kind"] == "scale"][::-1]


def show(f: Fleet, model: str) -> str:
    cli = subprocess.run(
        llmgw("models", "show", model, "--admin", f.server.admin),
        check=False, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    return cli.stdout


def test_requests_waiting_in_the_engines_scale_up_to_max_and_back_down(tmp_path: Path) -> None:
    models = sim_model(
        "deep", args="--itl 0.02 --max-running 1", min_replicas=1, max_replicas=3,
        target_queue_depth=1, scale_down_delay=2,
    )  # fmt: skip
    with fleet(tmp_path, models) as f:
        wait_for(lambda: len(f.ready_replicas("deep")) == 1, "deep's first replica")
        assert "one replica per 1 request waiting, down after 2s" in show(f, "deep")
        # Eight clients, one sequence per engine: seven wait at first, and still five
        # with three replicas, at one per replica: as many replicas as allowed.
        with load(f, "deep", 8) as codes:
            wait_for(lambda: len(f.ready_replicas("deep")) == 3, "three replicas", within=60)
            wait_for(
                lambda: (f.status("deep")["load"]["engine_waiting"] or 0) > 0,
                "waiting requests read from the engines",
            )
            shown = show(f, "deep")
            assert re.search(r"\d+ waiting \(\d+ in engines, 0 in routers", shown), shown
        assert set(codes) == {200}, codes
        wait_for(lambda: len(f.ready_replicas("deep")) == 1, "back to one replica", within=60)
        scale = scale_events(f, "deep")
        assert re.fullmatch(
            r"\d+ requests waiting \(\d+ in engines, 0 in routers\) at 1 per replica: "
            r"[23] replicas for the load",
            scale[0],
        ), scale
        assert any(m.endswith(": 3 replicas for the load") for m in scale), scale
        assert re.fullmatch(
            r"load lower for 2 s: [01] requests waiting \([01] in engines, 0 in routers\) at 1 "
            r"per replica: [01] replicas? for the load",
            scale[-1],
        ), scale


def test_requests_waiting_in_the_routers_queue_count_too(tmp_path: Path) -> None:
    # One request per replica leaves the router: the rest wait in its queue, and the
    # engines report nothing waiting.
    models = sim_model(
        "held", args="--itl 0.02", min_replicas=1, max_replicas=2, max_in_flight=1,
        target_queue_depth=1, scale_down_delay=2,
    )  # fmt: skip
    with fleet(tmp_path, models) as f:
        wait_for(lambda: len(f.ready_replicas("held")) == 1, "held's first replica")
        with load(f, "held", 6) as codes:
            wait_for(lambda: len(f.ready_replicas("held")) == 2, "two replicas", within=60)
        assert set(codes) == {200}, codes
        scale = scale_events(f, "held")
        assert re.fullmatch(
            r"\d+ requests waiting \((0 in engines|engines report none), [2-9] in routers\) at 1 "
            r"per replica: "
            r"2 replicas for the load",
            scale[0],
        ), scale
        wait_for(lambda: len(f.ready_replicas("held")) == 1, "back to one replica", within=60)


def test_requests_waiting_too_long_in_the_routers_queue_add_one_replica_at_a_time(
    tmp_path: Path,
) -> None:
    # One request per replica leaves the router, each about a second long: with six
    # clients on one replica the oldest waits some four seconds, four times the target,
    # yet one replica is asked for at a time, each once the last is Ready.
    models = sim_model(
        "slow", args="--itl 0.02", min_replicas=1, max_replicas=3, max_in_flight=1,
        target_queue_wait=1, scale_down_delay=2,
    )  # fmt: skip
    with fleet(tmp_path, models) as f:
        wait_for(lambda: len(f.ready_replicas("slow")) == 1, "slow's first replica")
        assert (
            "one more than are Ready while requests wait over 1 s in the routers' queues, "
            "down after 2s of lower load"
        ) in show(f, "slow")
        with load(f, "slow", 6) as codes:
            wait_for(lambda: len(f.ready_replicas("slow")) >= 2, "a second replica", within=60)
            # Queued requests are in flight too (target_in_flight reads this count): more
            # than the Ready replicas let through to the engines, one each.
            wait_for(
                lambda: f.status("slow")["in_flight"] > len(f.ready_replicas("slow")),
                "queued requests counted in flight",
            )
            wait_for(
                lambda: f.status("slow")["load"]["queue_wait_seconds"] > 0,
                "the queue's longest wait in the model's load",
            )
            assert re.search(r"in routers, longest \d+(\.\d+)? s\)", show(f, "slow"))
        assert set(codes) == {200}, codes
        scale = scale_events(f, "slow")
        assert re.fullmatch(
            r"longest queue wait \d+\.\d\d s over the 1 s target with 1 replica Ready: "
            r"2 replicas for the load",
            scale[0],
        ), scale
        # Every step up is one replica more than were Ready when it was asked for.
        for message in scale:
            step = re.search(r"with (\d+) replicas? Ready: (\d+) replicas", message)
            if step is not None and "over the" in message:
                assert int(step[2]) == int(step[1]) + 1, scale
        wait_for(lambda: len(f.ready_replicas("slow")) == 1, "back to one replica", within=60)
        assert re.fullmatch(
            r"load lower for 2 s: longest queue wait 0\.\d\d s, under half the 1 s target: "
            r"0 replicas for the load",
            scale_events(f, "slow")[-1],
        ), scale_events(f, "slow")

        # Bad targets are refused naming the field (API) or the flag (CLI).
        for bad in (0, -1, "1s"):
            refused = httpx.post(
                f"{f.server.admin}/admin/api/models",
                json={"name": "bad", "weights": "none", "profiles": [{"engine": "sim"}],
                      "target_queue_wait": bad},
                timeout=10,
            )  # fmt: skip
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert (error["code"], error["param"]) == ("invalid_model", "target_queue_wait")
            assert "model 'bad', field 'target_queue_wait': " in error["message"], error
        for flag in ("0", "-1", "soon"):
            cli = subprocess.run(
                llmgw(
                    "models", "add", "--name", "bad", "--weights", "none", "--engine", "sim",
                    "--target-queue-wait", flag, "--admin", f.server.admin,
                ),
                check=False, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert cli.returncode == 2, (flag, cli.stderr)
            assert "--target-queue-wait" in cli.stderr and "Traceback" not in cli.stderr
        assert "bad" not in {m["name"] for m in httpx.get(
            f"{f.server.admin}/admin/api/models", timeout=10
        ).json()["models"]}  # fmt: skip


def test_requests_queued_in_the_router_count_for_target_in_flight(tmp_path: Path) -> None:
    # One request at a time reaches the one replica's engine; the other three wait in
    # the router's queue, and still the model is at four in flight: two replicas.
    models = sim_model(
        "counted", args="--itl 0.02", min_replicas=1, max_replicas=2, max_in_flight=1,
        target_in_flight=3, scale_down_delay=2,
    )  # fmt: skip
    with fleet(tmp_path, models) as f:
        wait_for(lambda: len(f.ready_replicas("counted")) == 1, "counted's first replica")
        with load(f, "counted", 4) as codes:
            wait_for(lambda: len(f.ready_replicas("counted")) == 2, "two replicas", within=60)
        assert set(codes) == {200}, codes
        assert scale_events(f, "counted")[0] == (
            "4 requests in flight at 3 per replica: 2 replicas for the load"
        )
        wait_for(lambda: len(f.ready_replicas("counted")) == 1, "back to one", within=60)


def test_a_bad_queue_wait_target_in_the_config_file_names_the_file_and_field(
    tmp_path: Path,
) -> None:
    for bad, says in (("0", "greater than 0"), ("-1.5", "greater than 0"), ("2s", "number")):
        config = tmp_path / "llmgw.yaml"
        config.write_text(
            "models:\n  - name: bad\n    weights: none\n    max_replicas: 2\n"
            f"    target_queue_wait: {bad}\n    profiles: [{{engine: sim}}]\n"
        )
        result = subprocess.run(
            llmgw("server", "--config", str(config), "--data-dir", str(tmp_path / "data"),
                  "--listen", f"127.0.0.1:{free_port()}", "--admin-listen",
                  f"127.0.0.1:{free_port()}"),
            check=False, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert f"{config}: models[0].target_queue_wait: " in result.stderr, result.stderr
        assert says in result.stderr and "Traceback" not in result.stderr


def test_kv_cache_use_scales_up_and_shows_in_models_show(tmp_path: Path) -> None:
    # The sim's KV use is its prefix cache's: 16 blocks of 16 tokens fill with a few
    # long distinct prompts and stay full.
    models = sim_model(
        "roomy", args="--cache-blocks 16", min_replicas=1, max_replicas=2,
        target_kv_use=0.6, scale_down_delay=2,
    )  # fmt: skip
    with fleet(tmp_path, models) as f:
        wait_for(lambda: len(f.ready_replicas("roomy")) == 1, "roomy's first replica")
        for i in range(4):
            prompt = " ".join(f"w{i}x{j}" for j in range(200))
            answer = f.chat("roomy", messages=[{"role": "user", "content": prompt}])
            assert answer.status_code == 200, answer.text
        wait_for(lambda: len(f.ready_replicas("roomy")) == 2, "a second replica for KV use")
        scale = scale_events(f, "roomy")
        assert re.fullmatch(
            r"KV cache \d+% used on 1 replica at 60% per replica: 2 replicas for the load",
            scale[0],
        ), scale
        # Bad targets are refused, naming the field (API) or the flag (CLI).
        bad = httpx.post(
            f"{f.server.admin}/admin/api/models",
            json={"name": "bad", "weights": "none", "profiles": [{"engine": "sim"}],
                  "target_kv_use": 1.5},
            timeout=10,
        )  # fmt: skip
        assert bad.status_code == 400, bad.text
        error = bad.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_model", "target_kv_use")
        assert "field 'target_kv_use'" in error["message"], error
        cli = subprocess.run(
            llmgw(
                "models", "add", "--name", "bad", "--weights", "none", "--engine", "sim",
                "--target-queue-depth", "0", "--admin", f.server.admin,
            ),
            check=False, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert cli.returncode != 0
        assert "--target-queue-depth" in cli.stderr and "Traceback" not in cli.stderr
        shown = show(f, "roomy")
        assert "one replica per 60% KV-cache use" in shown
        assert re.search(r"KV cache \d+% used", shown), shown
        assert "not reported" not in shown.split("load:", 1)[1].split("\n", 1)[0]


STANDBY_CONFIG = """
control:
  heartbeat_interval: 0.3
  unreachable_after: 1.5
  lost_after: 30
  reconcile_interval: 0.5
  lease_ttl: 3
models:
""" + sim_model(
    "held", args="--itl 0.02", min_replicas=1, max_replicas=2, max_in_flight=1,
    target_queue_depth=1, scale_down_delay=2,
)  # fmt: skip


def test_a_standbys_queue_reaches_the_leader_and_stops_counting_when_it_dies(
    tmp_path: Path, database: str
) -> None:
    (tmp_path / "llmgw.yaml").write_text(STANDBY_CONFIG)
    ports = [free_port(), free_port()]
    leader = start_server(tmp_path, database, ports[0])
    procs: list[Proc] = [leader.proc]
    try:
        wait_for(lambda: role(leader) == "leader", "the first server to lead")
        standby = start_server(tmp_path, database, ports[1])
        procs.append(standby.proc)
        wait_for(lambda: role(standby) == "standby", "the second server to stand by")
        procs.append(start_agent("node-1", ports, tmp_path))
        f = Fleet(leader, {}, ports[0], tmp_path)
        wait_for(lambda: len(f.ready_replicas("held")) == 1, "held's first replica", within=60)
        via_standby = Fleet(standby, {}, ports[1], tmp_path)
        wait_for(lambda: via_standby.chat("held").status_code == 200, "the standby to serve")
        # Every request goes through the standby: only its router's queue holds them,
        # and only the store carries that to the leader.
        with load(via_standby, "held", 6) as codes:
            wait_for(lambda: len(f.ready_replicas("held")) == 2, "two replicas", within=60)
            scale = scale_events(f, "held")
            assert re.fullmatch(
                r"\d+ requests waiting \((0 in engines|engines report none), [2-9] in routers\) at 1 "
                r"per replica: "
                r"2 replicas for the load",
                scale[0],
            ), scale
            # The standby dies with requests queued: its rows stay in the store, but
            # count no more once it has been silent for a lease TTL.
            standby.proc.signal(signal.SIGKILL)
            wait_for(lambda: len(f.ready_replicas("held")) == 1, "back to one", within=60)
        assert 200 in codes
        assert scale_events(f, "held")[-1].startswith("load lower for 2 s: 0 requests waiting")
    except BaseException:
        for proc in procs:
            print(proc.output())
        raise
    finally:
        for proc in procs:
            proc.stop()


@pytest.mark.engine
@pytest.mark.timeout(240)
def test_an_engine_without_metrics_shows_the_signal_missing(tmp_path: Path) -> None:
    # llama.cpp's server exports no /metrics: nothing reports waiting or KV use, so
    # target_kv_use asks for nothing and models show says what is missing.
    python = required_path("LLMGW_ENGINE_PYTHON")
    model_file = required_path("LLMGW_MODEL_FILE")
    (tmp_path / "llmgw.yaml").write_text(
        CONTROL % "pack"
        + "models:\n"
        + f"  - name: gemma\n    weights: {model_file}\n    min_replicas: 1\n"
        "    max_replicas: 2\n    target_kv_use: 0.5\n    target_queue_depth: 4\n"
        "    profiles: [{name: cpu, engine: llamacpp, gpus: 0, "
        'engine_args: ["--n_ctx", "512"]}]\n'
    )
    agent_port = free_port()
    server = control_plane_server(tmp_path, agent_port)
    low = free_port_block(10)
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "cpu-1",
            "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / "w"),
            "--port-range", f"{low}-{low + 9}", "--engine-python", python,
        )
    )  # fmt: skip
    f = Fleet(server, {"cpu-1": agent}, agent_port, tmp_path)
    try:
        wait_for(lambda: len(f.ready_replicas("gemma")) == 1, "gemma on llama.cpp", within=180)
        answer = httpx.post(
            f"{server.url}/v1/completions",
            json={"model": "gemma", "prompt": "The capital of France is", "max_tokens": 4},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        # The router asked for /metrics at least once by now (it reads every second).
        wait_for(
            lambda: len(f.status("gemma")["load"]["missing"]) == 2, "the signals to show missing"
        )
        load = f.status("gemma")["load"]
        assert (load["engine_waiting"], load["kv_use"]) == (None, None)
        shown = show(f, "gemma")
        assert "0 waiting (not reported in engines, 0 in routers" in shown, shown
        assert "KV cache not reported" in shown
        assert "target_kv_use asks for no replicas" in shown
        assert "target_queue_depth counts the routers' queues only" in shown
        assert f.status("gemma")["desired_replicas"] == 1
    except BaseException:
        print(server.proc.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()
