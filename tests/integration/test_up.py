"""`llmgw up` as a real process: the gateway, its local agent and engines started on demand.

Without a model file `up` serves only the simulated `sim-small`, so the main test
is quick: it reads the printed key, lists the models, has the first request
activate the model through the local agent, and checks that SIGTERM leaves no
agent or engine behind (found through /proc as the children of `up` and of the
agent). The `engine` test does the same with the real Gemma 3 270M on llama.cpp.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from procs import free_port, llmgw
from upproc import descendants, running_up, stop_and_check_clean

# The first request waits for the engine to start (a few seconds for the sim, a few
# more for llama.cpp loading a 240 MB model from a cold disk).
FIRST_REQUEST_TIMEOUT = 60.0


def test_up_serves_the_sim_model_with_the_printed_key_and_stops_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMGW_MODEL_FILE", raising=False)
    monkeypatch.delenv("LLMGW_CHAT_MODEL_FILE", raising=False)
    with running_up(tmp_path) as up:
        out = up.proc.output()
        assert f"llmgw is up: {up.url}" in out, out
        assert "gemma-3-270m is not served" in out, out
        assert "smollm2-135m-instruct is not served: no --chat-model-file given" in out, out
        assert f"curl -s {up.url}/v1/chat/completions" in out, out
        assert f"Authorization: Bearer {up.key}" in out, out
        assert "models list" in out and "nodes list" in out, out
        # mTLS with no flags: the local agent joined the cluster CA with a token of its own.
        assert "PLAINTEXT" not in out and "INSECURE AGENTS" not in out, out
        agent_log = (tmp_path / "data" / "agent.log").read_text()
        assert "joined the cluster through" in agent_log, agent_log
        assert (tmp_path / "data" / "agent" / "tls" / "node.crt").exists()

        models = httpx.get(f"{up.url}/v1/models", headers=up.auth(), timeout=10)
        assert models.status_code == 200, models.text
        assert [m["id"] for m in models.json()["data"]] == ["sim-small"], models.json()

        body = {"model": "sim-small", "messages": [{"role": "user", "content": "Hello!"}]}
        anonymous = httpx.post(f"{up.url}/v1/chat/completions", json=body, timeout=10)
        assert anonymous.status_code == 401, anonymous.text

        resp = httpx.post(
            f"{up.url}/v1/chat/completions",
            json=body,
            headers=up.auth(),
            timeout=FIRST_REQUEST_TIMEOUT,
        )
        assert resp.status_code == 200, f"{resp.text}\n{up.proc.output()}"
        data = resp.json()
        assert data["object"] == "chat.completion", data
        assert data["choices"][0]["message"]["content"], data

        tree = descendants(up.proc.popen.pid)
        assert any(" sim " in cmd for cmd in tree.values()), tree  # the engine it started
        stop_and_check_clean(up)


def test_up_rotates_the_quickstart_key_on_every_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMGW_MODEL_FILE", raising=False)
    monkeypatch.delenv("LLMGW_CHAT_MODEL_FILE", raising=False)
    keys = []
    for expected in ("'quickstart', created", "'quickstart', rotated"):
        with running_up(tmp_path) as up:
            keys.append(up.key)
            assert expected in up.proc.output(), up.proc.output()
            agent_log = (tmp_path / "data" / "agent.log").read_text()
            stop_and_check_clean(up)
    assert keys[0] != keys[1]
    # The second start reuses the local agent's certificate: no token, no new join.
    assert "with mTLS as local" in agent_log, agent_log
    assert "joined the cluster" not in agent_log, agent_log
    listed = subprocess.run(
        llmgw("keys", "list", "--json", "--data-dir", str(tmp_path / "data")),
        capture_output=True,
        text=True,
        check=True,
    )
    assert listed.stdout.count('"quickstart"') == 1, listed.stdout


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--listen", "nonsense"], "--listen"),
        (["--agent-listen", "127.0.0.1:0"], "--agent-listen"),
        (["--port-range", "9-1"], "--port-range"),
        (["--engine-python", "/nonexistent/python"], "--engine-python"),
        # An existing file that is no GGUF (this test module).
        (["--chat-model-file", __file__], "--chat-model-file"),
        # vLLM needs its program and the checkpoint directory, both real.
        (["--vllm", "/nonexistent/vllm", "--vllm-model", "/tmp"], "--vllm"),
        (["--vllm", "/bin/true", "--vllm-model", "/nonexistent"], "--vllm-model"),
        (["--vllm", "/bin/true"], "--vllm-model"),
        (["--vllm-model", "/tmp"], "--vllm"),
    ],
)
def test_up_refuses_a_bad_flag_with_one_error_line(
    tmp_path: Path, args: list[str], flag: str
) -> None:
    result = subprocess.run(
        llmgw("up", "--data-dir", str(tmp_path / "data"), *args),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result
    assert result.stderr.startswith("error: "), result.stderr
    assert flag in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout, result


def test_up_names_the_flag_of_a_busy_port(tmp_path: Path) -> None:
    with socket_listening() as port:
        result = subprocess.run(
            llmgw(
                "up",
                "--data-dir", str(tmp_path / "data"),
                "--listen", f"127.0.0.1:{free_port()}",
                "--admin-listen", f"127.0.0.1:{free_port()}",
                "--agent-listen", f"127.0.0.1:{port}",
            ),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )  # fmt: skip
    assert result.returncode == 2, result
    assert result.stderr.startswith("error: cannot listen on"), result.stderr
    assert "--agent-listen" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_up_stops_with_the_agent_log_when_the_agent_exits_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMGW_MODEL_FILE", raising=False)
    monkeypatch.delenv("LLMGW_CHAT_MODEL_FILE", raising=False)
    data = tmp_path / "data"
    data.mkdir()
    (data / "weights").write_text("a file where the agent wants its weights directory")
    result = subprocess.run(
        llmgw(
            "up",
            "--data-dir", str(data),
            "--listen", f"127.0.0.1:{free_port()}",
            "--admin-listen", f"127.0.0.1:{free_port()}",
            "--agent-listen", f"127.0.0.1:{free_port()}",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 1, result
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("error: the local agent exited with status 2;"), result.stderr
    # The agent's own complaint, from the tail of its log, indented under the error.
    assert "  error: --weights-dir: cannot create" in result.stderr.split(errors[0])[1]
    assert "Traceback" not in result.stderr, result.stderr


@contextlib.contextmanager
def socket_listening() -> Iterator[int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def required_path(name: str) -> str:
    raw = os.environ.get(name)
    if not raw or not Path(raw).exists():
        pytest.fail(
            f"{name}={raw!r} is not set or does not exist: this test needs the real llama.cpp "
            f"engine and the Gemma model. Run `make test`, which builds both and sets {name}.",
            pytrace=False,
        )
    return raw


@pytest.mark.engine
@pytest.mark.timeout(240)
def test_up_serves_gemma_on_llamacpp_activated_by_the_first_request(tmp_path: Path) -> None:
    python = required_path("LLMGW_ENGINE_PYTHON")
    model = required_path("LLMGW_MODEL_FILE")
    with running_up(tmp_path, "--engine-python", python, "--model-file", model) as up:
        out = up.proc.output()
        assert f"curl -s {up.url}/v1/completions" in out, out
        assert "gemma-3-270m is not served" not in out, out
        body = {
            "model": "gemma-3-270m",
            "prompt": "The capital of France is the city of",
            "max_tokens": 16,
            "temperature": 0,
        }
        resp = httpx.post(
            f"{up.url}/v1/completions",
            json=body,
            headers=up.auth(),
            timeout=FIRST_REQUEST_TIMEOUT * 2,
        )
        assert resp.status_code == 200, f"{resp.text}\n{up.proc.output()}"
        text = resp.json()["choices"][0]["text"]
        assert text.startswith(" Paris"), resp.json()
        stop_and_check_clean(up)
