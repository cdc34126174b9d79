"""`llmgw up` as a real process, for the tests that start it: its URL, key and children.

Not guaranteed: that the ports `running_up` picks are still free when `up` binds them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from procs import Proc, free_port, free_port_block, llmgw

READY = "ready: the local agent registered as node 'local'"
KEY = re.compile(r"^  (sk-llmgw-\S+)$", re.MULTILINE)


@dataclass
class Up:
    proc: Proc
    url: str
    admin: str
    key: str

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> dict[int, str]:
    """Every process below pid, with its command line."""
    result: dict[int, str] = {}
    todo = children(pid)
    while todo:
        child = todo.pop()
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            result[child] = cmdline.replace(b"\0", b" ").decode(errors="replace")
            todo += children(child)
    return result


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.1)


@contextlib.contextmanager
def running_up(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, ready_timeout: float = 60
) -> Iterator[Up]:
    port, admin_port, agent_port = free_port(), free_port(), free_port()
    low = free_port_block(10)
    proc = Proc(
        llmgw(
            "up",
            "--listen", f"127.0.0.1:{port}",
            "--admin-listen", f"127.0.0.1:{admin_port}",
            "--agent-listen", f"127.0.0.1:{agent_port}",
            "--data-dir", str(tmp_path / "data"),
            "--port-range", f"{low}-{low + 9}",
            *args,
        ),
        env=env,
    )  # fmt: skip

    def ready() -> bool:
        assert proc.popen.poll() is None, f"`llmgw up` exited:\n{proc.output()}"
        return READY in proc.output()

    try:
        proc.wait_http(f"http://127.0.0.1:{admin_port}/healthz", timeout=ready_timeout)
        # Printed once the local agent has registered: requests can start models from then on.
        wait_for("the ready line", ready, ready_timeout)
        match = KEY.search(proc.output())
        assert match, f"no key printed:\n{proc.output()}"
        yield Up(
            proc=proc,
            url=f"http://127.0.0.1:{port}",
            admin=f"http://127.0.0.1:{admin_port}",
            key=match.group(1),
        )
    except BaseException:
        print(proc.output())
        raise
    finally:
        seen = descendants(proc.popen.pid)
        proc.stop(timeout=40)
        for pid in seen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def stop_and_check_clean(up: Up) -> None:
    """SIGTERM `up`; it exits 0 and takes its agent and every engine with it."""
    tree = descendants(up.proc.popen.pid)
    assert any(" agent " in cmd for cmd in tree.values()), tree
    up.proc.signal(signal.SIGTERM)
    try:
        up.proc.popen.wait(40)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`llmgw up` still running 40 s after SIGTERM:\n{up.proc.output()}")
    assert up.proc.popen.returncode == 0, up.proc.output()
    wait_for("the agent and engines to exit", lambda: not any(alive(p) for p in tree), 10)
