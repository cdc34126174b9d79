"""Fixtures for end-to-end tests: the real llama.cpp engine with the real `llmgw server` in front.

Both run as subprocesses on free loopback ports, each in a process group of its own, and
are always stopped in teardown (SIGTERM to the group, SIGKILL after a grace period).
The engine's python and the model file come from `LLMGW_ENGINE_PYTHON` and
`LLMGW_MODEL_FILE`, which `make test` sets after building them; when they are missing
the tests fail (never skip) and say so.

Not guaranteed: the free-port search binds port 0 and releases it, so another process
could take the port before the server binds it; the start then fails with the server's
own output in the message.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from procs import free_port

MODEL_NAME = "gemma-3-270m"
ENGINE_START_TIMEOUT_S = 60.0
GATEWAY_START_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class EngineFiles:
    python: Path
    model: Path


@dataclass(frozen=True)
class Gateway:
    """A running `llmgw server` in front of the engine."""

    base_url: str
    admin_url: str
    engine_url: str
    model: str
    api_key: str


def _required_path(name: str) -> Path:
    raw = os.environ.get(name)
    if not raw:
        pytest.fail(
            f"{name} is not set: this end-to-end test needs the real llama.cpp engine and the "
            f"Gemma model. Run `make test`, which builds both and sets {name}.",
            pytrace=False,
        )
    path = Path(raw)
    if not path.exists():
        pytest.fail(
            f"{name}={raw} does not exist. Run `make test` (or `make engine`) to build it.",
            pytrace=False,
        )
    return path


def _tail(path: Path, lines: int = 40) -> str:
    with path.open(errors="replace") as f:
        return "".join(deque(f, maxlen=lines))


@contextlib.contextmanager
def running(
    argv: list[str], log_path: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run argv in a new process group, output to log_path; stop the whole group on exit."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE_S)
        # Whatever is left of the group (a child that outlived the leader) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for_200(
    proc: subprocess.Popen[bytes], argv: list[str], url: str, log_path: Path, timeout_s: float
) -> float:
    """Poll url until it answers 200; fail the test with the process's output otherwise."""
    start = time.monotonic()
    while True:
        if proc.poll() is not None:
            pytest.fail(
                f"{shlex.join(argv)}\nexited with status {proc.returncode} while starting; "
                f"its output:\n{_tail(log_path)}",
                pytrace=False,
            )
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        if time.monotonic() - start > timeout_s:
            pytest.fail(
                f"{shlex.join(argv)}\ndid not answer 200 on {url} within {timeout_s:.0f} s; "
                f"its output:\n{_tail(log_path)}",
                pytrace=False,
            )
        time.sleep(0.1)


@pytest.fixture(scope="module")
def engine_files() -> EngineFiles:
    return EngineFiles(
        python=_required_path("LLMGW_ENGINE_PYTHON"), model=_required_path("LLMGW_MODEL_FILE")
    )


@pytest.fixture(scope="module")
def engine_url(
    engine_files: EngineFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The real llama.cpp engine (llama-cpp-python's OpenAI server) serving Gemma 3 270M."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("engine") / "engine.log"
    argv = [
        str(engine_files.python), "-m", "llama_cpp.server",
        "--model", str(engine_files.model),
        "--model_alias", MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", "2048",
        # By default a new request (llmgw's health probe included) cuts off a running stream.
        "--interrupt_requests", "False",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    # llama-cpp-python's server lets the PORT and HOST environment variables override
    # --port and --host.
    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "HOST")}
    with running(argv, log_path, env) as proc:
        # llama-cpp-python's server has no /health; /v1/models answers once the model is loaded.
        wait_for_200(proc, argv, f"{url}/v1/models", log_path, ENGINE_START_TIMEOUT_S)
        yield url


@pytest.fixture(scope="module")
def gateway(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The real `llmgw server`, router-only, with the engine as its one static endpoint."""
    port, admin_port = free_port(), free_port()
    work = tmp_path_factory.mktemp("llmgw")
    log_path = work / "llmgw.log"
    data_dir = str(work / "data")
    created = subprocess.run(
        [sys.executable, "-m", "llmgw", "keys", "create", "--name", "e2e", "--json",
         "--data-dir", data_dir],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    api_key = json.loads(created.stdout)["secret"]
    argv = [
        sys.executable, "-m", "llmgw", "server",
        "--endpoint", f"gemma={engine_url}={MODEL_NAME}",
        "--listen", f"127.0.0.1:{port}",
        "--admin-listen", f"127.0.0.1:{admin_port}",
        # Router-only: no agents, and no fixed port 9443 for two test runs to fight over.
        "--agent-listen", "off",
        "--data-dir", data_dir,
    ]  # fmt: skip
    admin_url = f"http://127.0.0.1:{admin_port}"
    with running(argv, log_path) as proc:
        # /readyz answers 200 once the gateway has seen the endpoint healthy.
        wait_for_200(proc, argv, f"{admin_url}/readyz", log_path, GATEWAY_START_TIMEOUT_S)
        yield Gateway(
            base_url=f"http://127.0.0.1:{port}",
            admin_url=admin_url,
            engine_url=engine_url,
            model=MODEL_NAME,
            api_key=api_key,
        )


@pytest.fixture(scope="module")
def client(gateway: Gateway) -> Iterator[httpx.Client]:
    # Generation runs at about 30 tokens/s on 2 cores; requests here ask for a few dozen.
    headers = {"Authorization": f"Bearer {gateway.api_key}"}
    with httpx.Client(base_url=gateway.base_url, timeout=60, headers=headers) as c:
        yield c
