"""A key's model list and its refused requests, through a real server, agent and sim.

A key allowed a model may call it by any of its names (the catalog's aliases),
and every request of a known key is recorded in usage with its status, the
refused ones (400 bad body, 403 model not allowed) too.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for

CONFIG = """\
control: {heartbeat_interval: 0.3, unreachable_after: 1.5, lost_after: 3, reconcile_interval: 0.5}
router: {health: {interval: 0.5}}
auth: {refresh_interval: 0.2}
usage: {flush_interval: 0.05}
models:
  - name: llama
    aliases: [llama-chat]
    weights: none
    min_replicas: 1
    profiles: [{name: one-gpu, engine: sim, gpus: 1}]
  - name: other
    weights: none
    min_replicas: 1
    profiles: [{name: one-gpu, engine: sim, gpus: 1}]
"""
MESSAGES = [{"role": "user", "content": "hello"}]


def create_key(data_dir: Path, name: str, *models: str) -> tuple[str, str]:
    """(key id, secret) of a new key allowed `models`."""
    flags = [arg for model in models for arg in ("--models", model)]
    created = json.loads(
        subprocess.run(
            llmgw("keys", "create", "--data-dir", str(data_dir), "--json", "--name", name, *flags),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    return created["id"], created["secret"]


def chat(server: Server, secret: str, model: str, **body: object) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": model, "messages": MESSAGES, "max_tokens": 3, **body},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=60,
    )


def ready(server: Server, model: str) -> bool:
    status = httpx.get(f"{server.admin}/admin/api/models/{model}", timeout=10).json()["status"]
    return any(r["state"] == "ready" for r in status["replicas"])


def recorded(data_dir: Path, key_id: str) -> list[tuple[str, int]]:
    """(model, status) of every raw usage record of `key_id`, oldest first."""
    with sqlite3.connect(data_dir / "llmgw.db") as db:
        rows = db.execute(
            "SELECT model, status FROM usage_records WHERE key_id = ? ORDER BY id", (key_id,)
        ).fetchall()
    return [(str(model), int(status)) for model, status in rows]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    tmp = tmp_path_factory.mktemp("keys")
    data_dir = tmp / "data"
    (tmp / "llmgw.yaml").write_text(CONFIG)
    subprocess.run(
        llmgw("db", "upgrade", "--data-dir", str(data_dir)), check=True, capture_output=True
    )
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp / "llmgw.yaml"),
        auth=True, data_dir=data_dir,
    )  # fmt: skip
    low = free_port_block(10)
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-1",
            "--gpus", "2x24GiB", "--weights-dir", str(tmp / "node-1"),
            "--state-dir", str(tmp / "node-1" / "state"),
            "--port-range", f"{low}-{low + 9}",
        )
    )  # fmt: skip
    try:
        wait_for(lambda: ready(server, "llama") and ready(server, "other"), "both models Ready")
        yield server, data_dir
    except BaseException:
        print(server.proc.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_a_key_allowed_a_model_may_call_it_by_any_of_its_names(
    gateway: tuple[Server, Path],
) -> None:
    server, data_dir = gateway
    _, by_name = create_key(data_dir, "by-name", "llama")
    _, by_alias = create_key(data_dir, "by-alias", "llama-chat")
    for secret in (by_name, by_alias):
        for model in ("llama", "llama-chat"):
            answer = chat(server, secret, model)
            assert answer.status_code == 200, answer.text
        refused = chat(server, secret, "other")
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "model_not_allowed"
        listed = httpx.get(
            f"{server.url}/v1/models", headers={"Authorization": f"Bearer {secret}"}, timeout=10
        ).json()["data"]
        assert sorted(m["id"] for m in listed) == ["llama", "llama-chat"]


def test_a_known_keys_refused_requests_are_recorded_with_their_status(
    gateway: tuple[Server, Path],
) -> None:
    server, data_dir = gateway
    key_id, secret = create_key(data_dir, "refused", "llama")
    assert chat(server, secret, "llama").status_code == 200
    assert chat(server, secret, "other").status_code == 403
    bad = chat(server, secret, "llama", max_tokens="three")
    assert bad.status_code == 400, bad.text
    no_model = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"messages": MESSAGES},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=10,
    )
    assert no_model.status_code == 400, no_model.text
    expected = [("llama", 200), ("other", 403), ("llama", 400), ("none", 400)]
    seen: list[tuple[str, int]] = []

    def four_records() -> bool:
        seen[:] = recorded(data_dir, key_id)
        return len(seen) >= len(expected)

    wait_for(four_records, "four usage records of the key", within=30)
    assert seen == expected
    report = httpx.get(
        f"{server.admin}/admin/api/usage", params={"key": "refused", "by": "model"}, timeout=10
    )
    assert report.status_code == 200, report.text
    by_model = {r["model"]: (r["requests"], r["errors"]) for r in report.json()["usage"]}
    assert by_model == {"llama": (2, 1), "other": (1, 1), "none": (1, 1)}
