"""The queue's reserve, the SDK's timeout as a wait budget, a client leaving the
queue and the wait in usage records, in a real `llmgw server` with API keys in
front of a real `llmgw sim`.

Five places on one replica (`router.max_in_flight: 5`). Long streams of a
flooding key hold places; what the light key, the flood's waiting requests and
the store then see is checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from procs import Server, Sim, llmgw, wait_for

from llmgw.cli.status import queue_lines

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "Tell me about the sea"}]}


def _create_key(data_dir: Path, name: str) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    out = subprocess.run(
        [*llmgw("keys", "create", "--name", name, "--json"), "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=60, check=True, env=env,
    )  # fmt: skip
    created = json.loads(out.stdout)
    return str(created["id"]), str(created["secret"])


def _usage(*args: str, fleet: Fleet) -> str:
    """What `llmgw usage ARGS` prints for the fleet's store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    out = subprocess.run(
        [*llmgw("usage", *args), "--data-dir", str(fleet.data_dir)],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


class Fleet:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.keys = {name: _create_key(data_dir, name) for name in ("light", "flood")}
        # About 0.1 s a token: a 400-token stream holds its place for as long as a test needs.
        self.sim = Sim("--itl", "0.1", "--itl-per-running", "0", model="m1")

    def server(self, queue: str) -> Server:
        config = self.data_dir.parent / f"llmgw-{time.monotonic_ns()}.yaml"
        config.write_text(
            f"router: {{max_in_flight: 5, queue: {{recheck: 0.2, {queue}}}}}\n"
            "control: {activation_keepalive: 0.2}\n"
        )
        return Server(
            "--endpoint", f"s={self.sim.url}=m1", "--config", str(config),
            auth=True, data_dir=self.data_dir,
        )  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("reserve")
    made = Fleet(tmp / "data")
    yield made
    made.sim.proc.stop()


class Stream:
    """A streaming request in a thread: its status, what it received, and a way to
    hang up (closing the connection, as a client that goes away does)."""

    def __init__(self, server: Server, secret: str, max_tokens: int) -> None:
        self.status: list[int] = []
        self.received: list[bytes] = []
        self._hang_up = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(server.url, secret, max_tokens), daemon=True
        )
        self._thread.start()

    def _run(self, url: str, secret: str, max_tokens: int) -> None:
        body = {**CHAT, "stream": True, "max_tokens": max_tokens}
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {secret}"},
            timeout=120,
        ) as resp:
            self.status.append(resp.status_code)
            for chunk in resp.iter_bytes():
                self.received.append(chunk)
                if self._hang_up.is_set():
                    return

    @property
    def text(self) -> str:
        return b"".join(self.received).decode()

    @property
    def answering(self) -> bool:
        return "data: {" in self.text

    def hang_up(self) -> None:
        self._hang_up.set()
        self._thread.join(timeout=60)

    def join(self) -> None:
        self._thread.join(timeout=60)


def _chat(server: Server, secret: str) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/chat/completions",
        json={**CHAT, "max_tokens": 2},
        headers={"authorization": f"Bearer {secret}"},
        timeout=60,
    )


def test_a_flooding_key_leaves_the_reserve_to_a_light_key(fleet: Fleet) -> None:
    server = fleet.server("reserve: 0.2")
    light, flood = fleet.keys["light"][1], fleet.keys["flood"][1]
    holders: list[Stream] = []
    try:
        holders = [Stream(server, flood, 400) for _ in range(7)]
        # Five places: with nobody else asking, the flood fills them all.
        wait_for(
            lambda: sum(h.answering for h in holders) == 5 and server.queue_state()["waiting"] == 2,
            "the flood to fill every place",
        )
        assert server.queue_state()["reserve"] == 0
        # A light request comes: it waits for a place, and from now on the
        # reserve keeps one (at most 0.2 of five places) for keys under their share.
        first = Stream(server, light, 3)
        wait_for(lambda: server.queue_state()["waiting"] == 3, "the light request to wait")
        state = server.queue_state()
        assert state["reserve"] == 1 and state["reserve_max"] == 1
        # A flood request ends: its place goes to the light key, under its share,
        # not to the flood's requests that waited longer.
        ending = next(h for h in holders if h.answering)
        holders.remove(ending)
        ending.hang_up()
        first.join()
        assert first.status == [200] and "data: [DONE]" in first.text
        # The place the light request left is kept: the flood holds four.
        wait_for(
            lambda: server.in_flight() == 4 and server.queue_state()["waiting"] == 2,
            "the flood to hold all but the kept place",
        )
        state = server.queue_state()
        assert state["saturated"] is False
        assert queue_lines([state]) == [
            "queue m1: full but for kept places; waiting: default 2 (oldest "
            f"{state['classes']['default']['oldest_wait_seconds']:g}s); "  # type: ignore[index]
            "1 kept for keys under their share"
        ]
        # The light key's next request finds the kept place and is answered at
        # once, while the flood's requests still wait.
        answer = Stream(server, light, 3)
        answer.join()
        assert answer.status == [200]
        assert "data: [DONE]" in answer.text
        assert ": llmgw queued" not in answer.text
        assert server.queue_state()["waiting"] == 2
        assert sum(h.answering for h in holders) == 4
    finally:
        for holder in holders:
            holder.hang_up()
        wait_for(lambda: server.in_flight() == 0, "every request to end")
        server.proc.stop()


def test_a_client_that_hangs_up_leaves_the_queue_and_usage_says_how_long_one_waited(
    fleet: Fleet,
) -> None:
    server = fleet.server("reserve: 0")
    flood_id, flood = fleet.keys["flood"]
    holders = [Stream(server, flood, 400) for _ in range(5)]
    try:
        wait_for(lambda: sum(h.answering for h in holders) == 5, "the flood to fill the model")
        # The OpenAI SDK's own timeout header lowers the request's wait budget.
        refused = httpx.post(
            server.url + "/v1/chat/completions",
            json={**CHAT, "max_tokens": 2},
            headers={"authorization": f"Bearer {flood}", "x-stainless-timeout": "0.3"},
            timeout=60,
        )
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "5"
        message = refused.json()["error"]["message"]
        assert "whole wait budget of 0.3 s (1 requests waiting in the queue)" in message
        leaving = Stream(server, flood, 3)
        wait_for(lambda: ": llmgw queued for model m1" in leaving.text, "the stream to wait")
        staying = Stream(server, flood, 3)
        wait_for(lambda: server.queue_state()["waiting"] == 2, "two requests waiting")
        leaving.hang_up()
        wait_for(lambda: server.queue_state()["waiting"] == 1, "the request to leave the queue")
        assert 'llmgw_queue_abandoned_total{class="default",model="m1"} 1.0' in server.metrics()
        assert not leaving.answering
        wait_for(lambda: ": llmgw queued" in staying.text, "a keep-alive while it waits")
        holders[0].hang_up()
        staying.join()
        assert staying.status == [200]
        assert "data: [DONE]" in staying.text
        # The admin API lists the request's record with how long it waited.
        waited = wait_for(
            lambda: [
                r
                for r in httpx.get(
                    server.admin + "/admin/api/usage/requests",
                    params={"key": "flood", "limit": 50},
                    timeout=10,
                ).json()["requests"]
                if r["status"] == 200 and r["completion_tokens"] == 3
            ],
            "the waiting request's usage record",
        )
        assert len(waited) == 1
        assert waited[0]["key_name"] == "flood"
        assert waited[0]["route"] == "/v1/chat/completions"
        assert waited[0]["queue_ms"] >= 200.0
        bad = httpx.get(
            server.admin + "/admin/api/usage/requests", params={"limit": "all"}, timeout=10
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "limit"
    finally:
        for holder in holders:
            holder.hang_up()
        wait_for(lambda: server.in_flight() == 0, "every request to end")
        server.proc.stop()  # the usage recorder writes what it holds on the way out

    # `llmgw usage --requests` shows the same from the store: the request that waited
    # for a holder to hang up waited at least the keep-alive interval (it got a
    # comment, sent that long after it began waiting); the refused one is there too.
    shown = json.loads(_usage("--requests", "50", "--key", flood_id, "--json", fleet=fleet))
    rows = [r for r in shown if r["status"] == 200 and r["completion_tokens"] == 3]
    assert len(rows) == 1
    assert rows[0]["queue_ms"] >= 200.0
    assert [r["status"] for r in shown].count(429) >= 1
    table = _usage("--requests", "3", "--key", "flood", fleet=fleet).splitlines()
    assert table[0].split() == [
        "TIME", "KEY", "MODEL", "ROUTE", "STATUS", "PROMPT", "COMPLETION",
        "MS", "TTFT", "MS", "QUEUED", "MS", "END", "USER", "REQUEST",
    ]  # fmt: skip
    assert len(table) == 4
    assert all(f"{flood_id} (flood)" in line for line in table[1:])
