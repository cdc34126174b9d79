"""A key's queue settings as a user sets them (`llmgw keys create/update`) and as
the router applies them: real CLI processes, a real server and sim."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from procs import Server, Sim, llmgw

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "Tell me about the sea"}]}


def run(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return subprocess.run(
        [*llmgw(*args), "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def ok_json(*args: str, data_dir: Path) -> dict[str, object]:
    result = run(*args, "--json", data_dir=data_dir)
    assert result.returncode == 0, result.stderr
    data: dict[str, object] = json.loads(result.stdout)
    return data


def refused(*args: str, data_dir: Path) -> str:
    result = run(*args, data_dir=data_dir)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_keys_carry_priority_weight_and_wait(tmp_path: Path) -> None:
    created = ok_json(
        "keys", "create", "--name", "etl", "--priority", "batch", "--weight", "2",
        "--max-queue-wait", "120", data_dir=tmp_path,
    )  # fmt: skip
    assert (created["priority"], created["weight"], created["max_queue_wait"]) == (
        "batch",
        2.0,
        120.0,
    )
    updated = ok_json(
        "keys", "update", "etl", "--priority", "interactive", "--default-queue-wait",
        data_dir=tmp_path,
    )  # fmt: skip
    assert (updated["priority"], updated["weight"], updated["max_queue_wait"]) == (
        "interactive",
        2.0,
        None,
    )
    listed = run("keys", "list", data_dir=tmp_path)
    assert "priority=interactive weight=2" in listed.stdout
    assert refused("keys", "create", "--name", "x", "--priority", "urgent", data_dir=tmp_path) == (
        "error: --priority must be interactive, default or batch, got 'urgent'"
    )
    assert "--weight must be more than 0" in refused(
        "keys", "update", "etl", "--weight", "0", data_dir=tmp_path
    )
    assert "--max-queue-wait sets what --default-queue-wait clears" in refused(
        "keys", "update", "etl", "--max-queue-wait", "5", "--default-queue-wait",
        data_dir=tmp_path,
    )  # fmt: skip


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_keys_class_is_its_requests_class_and_a_header_only_lowers_it(tmp_path: Path) -> None:
    secrets = {}
    for name, priority in (("holder", "default"), ("etl", "batch"), ("chat", "interactive")):
        created = ok_json("keys", "create", "--name", name, "--priority", priority,
                          data_dir=tmp_path)  # fmt: skip
        secret = created["secret"]
        assert isinstance(secret, str)
        secrets[name] = secret
    sim = Sim("--itl", "0.1", "--itl-per-running", "0", model="m1")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write("router: {max_in_flight: 1, queue: {recheck: 0.2}}\n")
    server = Server(
        "--endpoint", f"s={sim.url}=m1", "--config", handle.name, auth=True, data_dir=tmp_path
    )
    stop = threading.Event()
    statuses: list[int] = []

    def call(secret: str, headers: dict[str, str], body: dict[str, object]) -> None:
        with httpx.stream(
            "POST",
            server.url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {secret}", **headers},
            timeout=60,
        ) as resp:
            statuses.append(resp.status_code)
            for _ in resp.iter_bytes():
                if stop.is_set():
                    return

    def classes() -> dict[str, dict[str, object]]:
        (state,) = httpx.get(server.admin + "/admin/api/queue", timeout=10).json()["models"]
        result: dict[str, dict[str, object]] = state["classes"]
        return result

    threads = [
        threading.Thread(
            target=call,
            args=(secrets["holder"], {}, {**CHAT, "stream": True, "max_tokens": 400}),
            daemon=True,
        )
    ]
    try:
        threads[0].start()
        _wait_for(lambda: bool(statuses), "the holder's stream to start")
        for secret, headers in (
            (secrets["etl"], {"x-llmgw-priority": "interactive"}),  # cannot raise itself
            (secrets["chat"], {"x-llmgw-priority": "batch"}),  # may lower itself
            (secrets["chat"], {}),
        ):
            thread = threading.Thread(
                target=call, args=(secret, headers, {**CHAT, "max_tokens": 1}), daemon=True
            )
            thread.start()
            threads.append(thread)
        _wait_for(
            lambda: classes()["batch"]["waiting"] == 2 and classes()["interactive"]["waiting"] == 1,
            "two batch and one interactive request to queue",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        server.proc.stop()
        sim.proc.stop()
    assert statuses == [200, 200, 200, 200]
