"""`llmgw server`, `llmgw version` and `--help` as a user runs them from a shell."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
from procs import Server, Sim, free_port, llmgw


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw(*args), capture_output=True, text=True, timeout=timeout, check=False
    )


def test_version_and_help() -> None:
    version = run("version")
    assert version.returncode == 0
    assert version.stdout.startswith("llmgw ")
    top = run("--help")
    assert top.returncode == 0
    for command in ("server", "sim", "version"):
        assert command in top.stdout
    server_help = run("server", "--help")
    assert "--endpoint" in server_help.stdout and "--admin-listen" in server_help.stdout


def test_refuses_to_start_with_nothing_to_serve() -> None:
    result = run("server", "--listen", f"127.0.0.1:{free_port()}")
    assert result.returncode == 2
    assert "nothing to serve" in result.stderr
    assert "--endpoint ID=URL=MODEL" in result.stderr
    assert "Traceback" not in result.stderr


def test_config_error_names_file_and_field(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("endpoints:\n  - id: a\n    url: localhost:8000\n    models: [m]\n")
    result = run("server", "--config", str(cfg))
    assert result.returncode == 2
    assert (
        f"{cfg}: endpoints[0].url: 'localhost:8000' is not an http:// or https:// URL"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_bad_flags_are_named() -> None:
    result = run("server", "--endpoint", "only-an-id")
    assert result.returncode == 2
    assert "--endpoint 'only-an-id': expected ID=URL=MODEL" in result.stderr
    result = run("server", "--endpoint", "a=http://h=m", "--listen", "nowhere")
    assert result.returncode == 2
    assert "--listen 'nowhere'" in result.stderr


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run(
            "server",
            "--endpoint",
            "a=http://127.0.0.1:1=m",
            "--admin-listen",
            f"127.0.0.1:{port}",
            "--listen",
            f"127.0.0.1:{free_port()}",
        )
    assert result.returncode == 2
    assert (
        f"cannot listen on 127.0.0.1:{port} for the admin listener (--admin-listen)"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_sigterm_lets_in_flight_requests_finish() -> None:
    sim = Sim("--itl", "0.02", "--itl-per-running", "0", model="m1")
    server = Server("--endpoint", f"s={sim.url}=m1")
    results: list[httpx.Response] = []

    def call() -> None:
        body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60}
        results.append(httpx.post(server.url + "/v1/chat/completions", json=body, timeout=20))

    try:
        worker = threading.Thread(target=call)
        worker.start()
        deadline = time.monotonic() + 5
        while sim.stats()["running"] != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.proc.signal(signal.SIGTERM)
        worker.join(20)
        assert server.proc.popen.wait(20) == 0
        assert len(results) == 1
        assert results[0].status_code == 200
        assert results[0].json()["usage"]["completion_tokens"] == 60
        # New connections are refused once it has stopped.
        try:
            httpx.get(server.url + "/healthz", timeout=1)
            raise AssertionError("server still accepting after SIGTERM")
        except httpx.ConnectError:
            pass
        assert "stopped" in server.proc.output()
    finally:
        server.proc.stop()
        sim.proc.stop()


def test_a_catalog_model_the_engine_would_refuse_names_file_model_profile_and_field(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        "models:\n  - name: big\n    weights: org/big\n"
        "    profiles: [{name: tp2, engine: sglang, gpus: 0}]\n"
    )
    result = run("server", "--config", str(cfg), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {cfg}: model 'big', profile 'tp2', field 'gpus':")
    assert "Traceback" not in result.stderr
    shape = tmp_path / "shape.yaml"
    shape.write_text("models:\n  - name: big\n    weights: org/big\n    profiles: []\n")
    result = run("server", "--config", str(shape), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert str(shape) in result.stderr and "models[0].profiles" in result.stderr
