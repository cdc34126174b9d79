"""Idle replicas sleep before they stop: a real server, a real agent, `llmgw sim` engines.

The sim plays vLLM's sleep mode (`/sleep`, `/wake_up`, `/is_sleeping`), so every
path runs without a GPU: a model with `sleep_after` is started in sleep mode, its
idle replica is put to sleep (it leaves the router, `models show` and the events
say so), the next request wakes the same replica (a stream gets `: llmgw waking`
comments meanwhile) and `keep_alive` later stops it. Under bursts of concurrent
requests separated by idle spells, no request fails across sleeps and wakes.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import procs
import pytest
from otlp_receiver import OtlpReceiver
from procs import Proc, free_port_block, llmgw
from test_control_plane import fleet, registered, sim_model

# Sleep after 1 s idle; stop after 20 s (the test checks the sleeping state in between).
NAP = sim_model(
    "nap", args="--zero-delay --sleep-time 0.2 --wake-time 0.6", sleep_after=1, keep_alive=20
)
BUSY = sim_model("busy", args="--zero-delay --wake-time 0.4", sleep_after=1, keep_alive=300)


def wait_for(check: Any, what: str, within: float = 60.0) -> Any:
    return procs.wait_for(check, what, within)


def replicas(f: Any, model: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = f.status(model)["replicas"]
    return found


def sleeping(f: Any, model: str) -> bool:
    now = replicas(f, model)
    return bool(now) and all(r["state"] == "sleeping" for r in now)


def stream_lines(f: Any, model: str) -> list[str]:
    with httpx.stream(
        "POST",
        f"{f.server.url}/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
        },
        timeout=60,
    ) as answer:
        assert answer.status_code == 200
        return [line for line in answer.iter_lines() if line]


def test_an_idle_replica_sleeps_the_next_request_wakes_it_and_keep_alive_stops_it(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, NAP, nodes=1) as f:
        first = f.chat("nap")
        assert first.status_code == 200, first.text
        (replica,) = replicas(f, "nap")
        assert replica["state"] == "ready"

        # Idle past sleep_after: asleep, out of the router, the sim's weights off the GPU.
        wait_for(lambda: sleeping(f, "nap"), "the idle replica to sleep")
        assert f.status("nap")["state"] == "sleeping"
        assert [r["id"] for r in replicas(f, "nap")] == [replica["id"]]
        assert not [e for e in f.server.endpoints() if "nap" in e["models"]]
        slept = [e for e in f.events("nap") if e["kind"] == "sleep"]
        assert slept and "to sleep" in slept[0]["message"], f.events("nap")
        sim = httpx.get(replica["endpoint_url"] + "/sim/stats", timeout=10).json()["sleep"]
        assert sim["phase"] == "asleep"
        assert (sim["weights_gpu_bytes"], sim["weights_host_bytes"]) == (0, 1 << 30)
        shown = subprocess.run(
            procs.llmgw("models", "show", "nap", "--admin", f.server.admin),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        assert "sleep after: 1s" in shown.stdout
        assert "sleeping" in shown.stdout

        # The first request wakes that same replica; the stream hears about it meanwhile.
        lines = stream_lines(f, "nap")
        assert lines[0].startswith(": llmgw waking model nap"), lines
        assert lines[-1] == "data: [DONE]"
        (woken,) = replicas(f, "nap")
        assert woken["id"] == replica["id"]
        assert woken["state"] in ("ready", "sleeping")
        kinds = [e["kind"] for e in f.events("nap")]
        assert "start" not in kinds[: kinds.index("sleep")], "a wake must not start a replica"
        woke = [e for e in f.events("nap") if e["kind"] == "woke"]
        assert woke and " woke in " in woke[0]["message"]
        assert "llmgw_replica_wake_seconds_count" in f.server.metrics()
        after = httpx.get(replica["endpoint_url"] + "/sim/stats", timeout=10).json()["sleep"]
        # One wake; it may be asleep again already (sleep_after is 1 s).
        assert after["wakes"] == 1 and after["sleeps"] >= 1
        last = f.status("nap")["last_wake"]
        assert last["replica"] == replica["id"] and last["seconds"] > 0
        again = subprocess.run(
            procs.llmgw("models", "show", "nap", "--admin", f.server.admin),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert f"last wake:   replica {replica['id']} woke in " in again.stdout

        # Asleep again, then keep_alive stops it as it would a Ready replica.
        wait_for(lambda: sleeping(f, "nap"), "the replica to sleep again")
        wait_for(lambda: replicas(f, "nap") == [], "keep_alive to stop the sleeping replica")
        assert f.status("nap")["state"] == "stopped"
        assert any(e["kind"] == "stop" for e in f.events("nap"))


def test_bursts_of_requests_across_sleeps_and_wakes_fail_none(tmp_path: Path) -> None:
    with fleet(tmp_path, BUSY, nodes=1) as f:
        assert f.chat("busy").status_code == 200
        statuses: list[int] = []
        lock = threading.Lock()

        def one() -> None:
            answer = f.chat("busy", timeout=90)
            with lock:
                statuses.append(answer.status_code)

        for _ in range(3):
            wait_for(lambda: sleeping(f, "busy"), "the replica to sleep")
            # A burst at a sleeping replica: one wake, every request served.
            threads = [threading.Thread(target=one) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(90)
        assert statuses == [200] * 24
        # At least one wake per burst (a slow machine may let it doze within a burst too).
        assert len([e for e in f.events("busy") if e["kind"] == "woke"]) >= 3
        assert len([e for e in f.events("busy") if e["kind"] == "start"]) == 1


def test_a_bad_sleep_after_is_refused_naming_the_field(tmp_path: Path) -> None:
    with fleet(tmp_path, NAP, nodes=1) as f:

        def add(**fields: object) -> httpx.Response:
            model = {
                "name": "bad",
                "weights": "none",
                "profiles": [{"name": "p", "engine": "sim"}],
                **fields,
            }
            return httpx.post(f"{f.server.admin}/admin/api/models", json=model, timeout=10)

        longer = add(sleep_after="10m", keep_alive="5m")
        assert longer.status_code == 400, longer.text
        assert "sleep_after" in longer.text and "shorter than keep_alive" in longer.text
        for value in ("soon", 0, -5):
            answer = add(sleep_after=value)
            assert answer.status_code == 400, answer.text
            assert "sleep_after" in answer.text
        cannot = httpx.post(
            f"{f.server.admin}/admin/api/models",
            json={
                "name": "gguf",
                "weights": "/models/x.gguf",
                "profiles": [{"name": "p", "engine": "llamacpp"}],
                "sleep_after": 60,
            },
            timeout=10,
        )
        assert cannot.status_code == 400, cannot.text
        assert "sleep_after" in cannot.text and "cannot sleep" in cannot.text

        cli = subprocess.run(
            procs.llmgw(
                "models", "add", "--name", "bad", "--weights", "none", "--engine", "sim",
                "--keep-alive", "1m", "--sleep-after", "2m", "--admin", f.server.admin,
            ),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )  # fmt: skip
        assert cli.returncode != 0
        assert "sleep_after" in cli.stderr + cli.stdout

        # The config file: the server refuses to start, naming the file and the field.
        config = tmp_path / "bad.yaml"
        config.write_text("models:\n" + sim_model("x", sleep_after="1h", keep_alive="10m"))
        started = subprocess.run(
            procs.llmgw("server", "--config", str(config), "--data-dir", str(tmp_path / "d2")),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert started.returncode != 0
        assert str(config) in started.stderr and "sleep_after" in started.stderr, started.stderr


def test_a_sleeping_replica_is_stopped_when_placement_needs_its_gpus(tmp_path: Path) -> None:
    # One node with two GPUs: the sleeping model holds both; another model needs one.
    models = sim_model(
        "wide", gpus=2, args="--zero-delay", sleep_after=1, keep_alive=300
    ) + sim_model("other", args="--zero-delay")
    with fleet(tmp_path, models, nodes=1) as f:
        assert f.chat("wide").status_code == 200
        wait_for(lambda: sleeping(f, "wide"), "wide to sleep")
        (asleep,) = replicas(f, "wide")

        answer = f.chat("other", timeout=90)
        assert answer.status_code == 200, answer.text
        assert replicas(f, "wide") == [] or all(
            r["state"] != "sleeping" for r in replicas(f, "wide")
        )
        stops = [e for e in f.events("wide") if e["kind"] == "stop"]
        assert stops and asleep["id"] in stops[0]["message"], f.events("wide")
        assert "its GPUs are needed" in stops[0]["message"]
        assert "model other needs its GPUs" in stops[0]["message"]
        (placed,) = replicas(f, "other")
        assert placed["state"] == "ready"


def test_sleep_and_wake_are_traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    with OtlpReceiver() as receiver:
        telemetry = f"telemetry: {{otlp_endpoint: '{receiver.url}'}}\n"
        with fleet(tmp_path, NAP, nodes=1, extra=telemetry) as f:
            assert f.chat("nap").status_code == 200
            (replica,) = replicas(f, "nap")
            wait_for(lambda: sleeping(f, "nap"), "the idle replica to sleep")
            assert f.chat("nap").status_code == 200

            def spans() -> dict[str, Any] | None:
                found = {s.name: s for s in receiver.spans()}
                wanted = ("llmgw.shard.sleep", "llmgw.shard.wake")
                return found if all(name in found for name in wanted) else None

            found = wait_for(spans, "the sleep and wake spans")
            asleep, woke = found["llmgw.shard.sleep"], found["llmgw.shard.wake"]
            for span in (asleep, woke):
                assert span.attributes["llmgw.model"] == "nap"
                assert span.attributes["llmgw.replica"] == replica["id"]
                assert span.attributes["llmgw.node"] == "node-1"
            assert asleep.attributes["llmgw.sleep.level"] == 1
            assert woke.attributes["llmgw.wake.seconds"] > 0


def test_a_restarted_agent_adopts_a_sleeping_engine_as_sleeping(tmp_path: Path) -> None:
    with fleet(tmp_path, BUSY, nodes=0) as f:
        low = free_port_block(5)
        argv = llmgw(
            "agent", "--server", f"127.0.0.1:{f.agent_port}", "--node-id", "node-s",
            "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / "w"),
            "--state-dir", str(tmp_path / "s"), "--port-range", f"{low}-{low + 4}",
        )  # fmt: skip
        # The first agent leaves its engines running when it stops (as in production);
        # the second, the test's default, stops them on its way out.
        agents = [Proc(argv, env={"LLMGW_AGENT_STOP_ENGINES_ON_EXIT": "0"})]
        try:
            # The agent registers before the first request, which must find a node.
            wait_for(lambda: registered(f.server) == ["node-s"], "the agent to register")
            assert f.chat("busy").status_code == 200
            wait_for(lambda: sleeping(f, "busy"), "the replica to sleep")
            (asleep,) = replicas(f, "busy")
            # SIGTERM: the agent leaves its engines running for the next one to adopt.
            agents[0].popen.terminate()
            agents[0].popen.wait(30)
            agents.append(Proc(argv))
            wait_for(lambda: "adopted 1 engine" in agents[1].output(), "the engine adopted")
            wait_for(lambda: sleeping(f, "busy"), "the adopted replica to show sleeping")
            assert [r["id"] for r in replicas(f, "busy")] == [asleep["id"]]
            assert not [e for e in f.server.endpoints() if "busy" in e["models"]]
            # And a request wakes it, as before the restart.
            assert f.chat("busy").status_code == 200
            assert [r["id"] for r in replicas(f, "busy")] == [asleep["id"]]
        finally:
            for agent in agents:
                agent.stop()
