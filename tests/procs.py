"""Starting real llmgw processes on loopback for tests, and always stopping them."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
import pytest
import redis.asyncio as aioredis

# Ports free_port handed out in this run: the kernel may offer a port again as soon
# as its probe socket closes, so two calls before either port is bound (a server's
# admin and agent listeners) could otherwise return the same one.
_HANDED_OUT: set[int] = set()
# Ports inside blocks free_port_block handed out: a block's engines may bind long after
# it was handed out (a fleet warming up in the background while other tests run).
_BLOCKED: set[int] = set()
_PORTS_LOCK = threading.Lock()

# The environment child processes start from: os.environ, except in a background
# start (`Background`), which pins the environment the session began with so that a
# test running meanwhile never leaks its monkeypatched variables into it.
BASE_ENV: ContextVar[Mapping[str, str] | None] = ContextVar("BASE_ENV", default=None)

T = TypeVar("T")


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    base = BASE_ENV.get()
    return {**(os.environ if base is None else base), **(extra or {})}


def free_port() -> int:
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        with _PORTS_LOCK:
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError("no free port that this test run has not handed out already")


def free_port_block(count: int) -> int:
    """The first of `count` consecutive ports that are free now, below the ephemeral range.

    Engines are given ports from an agent's `--port-range`; a block taken from the
    kernel's ephemeral range (where `free_port` draws) can collide with any
    outgoing connection made later in the run, so blocks come from 20000-32000.
    """
    for _ in range(200):
        low = random.randrange(20000, 32000 - count)
        block = set(range(low, low + count))
        with _PORTS_LOCK:
            if block & _BLOCKED or not all(_bindable(port) for port in block):
                continue
            _BLOCKED.update(block)
            return low
    raise RuntimeError(f"no {count} consecutive free ports between 20000 and 32000")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Background(Generic[T]):
    """A slow set-up (a real engine's load), started in a thread as soon as the session
    knows a test needs it and run while other tests run; its user waits in `result()`.

    `setup` enters what it starts into the ExitStack it is given; `close()` (from any
    thread) exits it. Children it starts get the environment of the moment the
    Background was made, not a running test's."""

    def __init__(self, name: str, setup: Callable[[contextlib.ExitStack[bool | None]], T]) -> None:
        self.name = name
        self._setup = setup
        self._env = dict(os.environ)
        self._stack = contextlib.ExitStack()
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._began: float | None = None
        self._closed = False
        self._lock = threading.Lock()

    def run(self) -> None:
        """Run the set-up in this thread (a thread of its own, or the caller's)."""
        with self._lock:
            if self._closed:
                self._done.set()
                return
            self._began = time.monotonic()
        token = BASE_ENV.set(self._env)
        try:
            self._value = self._setup(self._stack)
        except BaseException as exc:  # re-raised to the test that waits in result()
            self._error = exc
        finally:
            BASE_ENV.reset(token)
            self._done.set()

    def result(self, timeout: float) -> T:
        if not self._done.wait(timeout):
            pytest.fail(f"{self.name}: not set up after waiting {timeout:.0f} s")
        if self._error is not None:
            raise self._error
        assert self._value is not None, f"{self.name} was closed before it ran"
        return self._value

    def close(self, timeout: float = 600.0) -> None:
        with self._lock:
            self._closed = True
            began = self._began is not None
        # A set-up still running is let finish (its processes are then in the stack).
        if began:
            self._done.wait(timeout)
        self._stack.close()


def run_in_background(name: str, jobs: Sequence[Background[Any]]) -> threading.Thread:
    """Run `jobs` one after the other in one daemon thread (so heavy loads never overlap)."""

    def run() -> None:
        for job in jobs:
            job.run()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


class Proc:
    """A child process whose output goes to a temp file, readable on failure."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        # Kept open for the life of the process, closed in stop().
        self._log = tempfile.NamedTemporaryFile(prefix="llmgw-test-", suffix=".log", delete=False)  # noqa: SIM115
        self.log_path = Path(self._log.name)
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=child_env(env),
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_http(self, url: str, *, timeout: float = 30.0, status: int = 200) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.argv} exited with {self.popen.returncode}:\n{self.output()}"
                )
            try:
                if httpx.get(url, timeout=1.0).status_code == status:
                    return
            except httpx.HTTPError as exc:
                last = str(exc)
            time.sleep(0.05)
        raise RuntimeError(
            f"{url} not answering {status} after {timeout}s ({last}):\n{self.output()}"
        )

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self._log.close()
        return self.popen.returncode


def descendants(pid: int) -> list[int]:
    """Every process below pid, from the parent links in /proc.

    An agent runs in a session of its own and its engines may too, so killing a
    process group does not reach them; tests collect them here before a stop.
    """
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # it exited meanwhile
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        below = [child for child, up in parents.items() if up == parent]
        found += below
        todo += below
    return found


def llmgw(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmgw", *args]


class Sim:
    def __init__(
        self,
        *args: str,
        model: str = "sim-model",
        extra_models: Sequence[str] = (),
        wait: bool = True,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        more = [arg for m in extra_models for arg in ("--model", m)]
        self.proc = Proc(
            llmgw(
                "sim",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--model",
                model,
                *more,
                *args,
            )
        )
        if wait:
            try:
                self.proc.wait_http(self.url + "/sim/stats")
            except BaseException:
                self.proc.stop()
                raise

    def stats(self) -> dict[str, object]:
        data: dict[str, object] = httpx.get(self.url + "/sim/stats", timeout=5).json()
        return data

    def faults(self, **settings: object) -> None:
        httpx.post(self.url + "/sim/faults", json=settings, timeout=5).raise_for_status()


class Server:
    """A real `llmgw server`; open auth and a fresh SQLite data dir unless told otherwise.

    Its agent listener is plaintext (`--insecure-agents`) so plain test agents can
    register; `insecure_agents=False` gives the default (the cluster CA: agents join
    with a token) or, with `agent_tls` in a config file, certificates of the test's own.
    """

    def __init__(
        self,
        *args: str,
        wait_ready: bool = True,
        auth: bool = False,
        data_dir: Path | None = None,
        insecure_agents: bool = True,
    ) -> None:
        self.port = free_port()
        self.admin_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="llmgw-data-"))
        store_args = [] if "--store" in args else ["--data-dir", str(self.data_dir)]
        self.proc = Proc(
            llmgw(
                "server",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--admin-listen",
                f"127.0.0.1:{self.admin_port}",
                *store_args,
                *(
                    []
                    if "--agent-listen" in args
                    else ["--agent-listen", f"127.0.0.1:{free_port()}"]
                ),
                *([] if auth else ["--auth-mode", "open"]),
                *(["--insecure-agents"] if insecure_agents else []),
                *args,
            )
        )
        try:
            self.proc.wait_http(self.admin + "/healthz")
            if wait_ready:
                self.proc.wait_http(self.admin + "/readyz")
        except BaseException:
            self.proc.stop()
            raise

    def endpoints(self) -> list[dict[str, object]]:
        data: list[dict[str, object]] = httpx.get(self.admin + "/admin/api/endpoints").json()[
            "endpoints"
        ]
        return data

    def metrics(self) -> str:
        return httpx.get(self.admin + "/metrics").text

    def in_flight(self) -> int:
        """Requests in flight over every endpoint, as the admin API counts them."""
        return sum(int(str(e["in_flight"])) for e in self.endpoints())

    def queue_state(self) -> dict[str, Any]:
        """The queue and saturation of the one model this server queues for
        (`GET /admin/api/queue`)."""
        (state,) = httpx.get(self.admin + "/admin/api/queue", timeout=10).json()["models"]
        data: dict[str, Any] = state
        return data


def wait_for(
    check: Callable[[], object], what: str, within: float = 60.0, every: float = 0.1
) -> Any:
    """Poll `check` until it returns something truthy and return that; fail naming
    `what` after `within` seconds. Tests wait on conditions this way, never on sleeps."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def role(server: Server) -> str:
    """The control-plane role (`leader` or `standby`) a server reports."""
    return str(httpx.get(server.admin + "/admin/api/leader", timeout=5).json()["role"])


def redis_answers(port: int) -> bool:
    """Whether a Redis on 127.0.0.1:`port` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def require_redis() -> None:
    """Fail (not skip) the test, saying how to start it, when the machine's Redis
    on 127.0.0.1:6379 does not answer."""
    if not redis_answers(6379):
        pytest.fail(
            "Redis is not running on 127.0.0.1:6379; start it with: "
            "redis-server --daemonize yes --save '' --appendonly no",
            pytrace=False,
        )


async def delete_redis_keys(url: str, prefix: str) -> None:
    """Delete every key under `prefix` in the Redis at `url` (a test's own keys)."""
    client = aioredis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=prefix + "*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


class RedisServer:
    """A throwaway redis-server on its own port, started and stopped by the test."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not on PATH; install Redis (apt-get install redis-server)")
        self.popen = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5.0
        while not redis_answers(self.port):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.popen is not None:
            self.popen.terminate()
            self.popen.wait(5)
            self.popen = None
