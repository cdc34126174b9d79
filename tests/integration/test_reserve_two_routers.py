"""The queue's reserve with two real `llmgw server` routers on one PostgreSQL store
(the keys), in front of one real `llmgw sim`: sharing a Redis (`limits.redis_url`),
a key that spreads its flood over both routers leaves the reserve to a light key;
without it, the same flood takes the reserve.

Each router has ten places on the replica (`router.max_in_flight: 10`), one kept
(`reserve: 0.1`). The sim stalls every generation after two tokens
(`--stall-after-tokens 2`), so a stream of more holds its place until the test
hangs up, and a request for two tokens completes: nothing ends by itself, and
every place is where the test put it.

On router A: key `filler` holds 7 places and `flood` 2, so one place is free,
the kept one (kept since the flood's second request came under its share with
one place left, see `_spread_the_flood`); on router B: `flood` holds 4. Alone, router A sees the flood
holding 2 of its share of 5 (two keys) and gives it the kept place. Sharing, it
sees the flood holding 6 and keeps the place for the light key.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from procs import Server, Sim, llmgw, wait_for

REDIS_URL = "redis://127.0.0.1:6379/0"


def _create_key(store: str, name: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    out = subprocess.run(
        [*llmgw("keys", "create", "--name", name, "--json"), "--store", store],
        capture_output=True, text=True, timeout=60, check=True, env=env,
    )  # fmt: skip
    return str(json.loads(out.stdout)["secret"])


@dataclass
class Fleet:
    store: str
    model: str
    sim: Sim
    secrets: dict[str, str]
    tmp: Path

    def router(self, name: str, *, shared: bool) -> Server:
        config = self.tmp / f"{name}-{time.monotonic_ns()}.yaml"
        limits = f"limits: {{redis_url: '{REDIS_URL}'}}\n" if shared else ""
        config.write_text(
            limits
            + "router: {max_in_flight: 10, queue: {recheck: 0.1, reserve: 0.1}}\n"
            + "control: {activation_keepalive: 0.2}\n"
        )
        return Server(
            "--endpoint", f"s={self.sim.url}={self.model}", "--config", str(config),
            "--store", self.store, auth=True,
        )  # fmt: skip


@pytest.fixture
def fleet(database: str, tmp_path: Path) -> Iterator[Fleet]:
    # A model of its own: other tests' routers on the same Redis never count here.
    model = f"m-{secrets.token_hex(4)}"
    keys = {name: _create_key(database, name) for name in ("filler", "flood", "light")}
    sim = Sim("--stall-after-tokens", "2", model=model)
    try:
        yield Fleet(store=database, model=model, sim=sim, secrets=keys, tmp=tmp_path)
    finally:
        sim.proc.stop()


class Stream:
    """A streaming request in a thread, held open by the sim until `hang_up` closes
    its connection (as a client that goes away does)."""

    def __init__(self, server: Server, model: str, secret: str) -> None:
        self.received: list[bytes] = []
        self._socket: socket.socket | None = None
        self._opened = threading.Event()
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Tell me about the sea"}],
            "stream": True,
            "max_tokens": 50,
        }
        self._thread = threading.Thread(
            target=self._run, args=(server.url, body, secret), daemon=True
        )
        self._thread.start()

    def _run(self, url: str, body: dict[str, object], secret: str) -> None:
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {secret}"},
            timeout=120,
        ) as resp:
            self._socket = resp.extensions["network_stream"].get_extra_info("socket")
            self._opened.set()
            with contextlib.suppress(httpx.HTTPError):
                for chunk in resp.iter_bytes():
                    self.received.append(chunk)

    @property
    def answering(self) -> bool:
        return b"data: {" in b"".join(self.received)

    def hang_up(self) -> None:
        # The stalled stream's reader is blocked on the socket: shutting it down
        # wakes it, and the router sees the client go.
        if self._opened.wait(60) and self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
        self._thread.join(60)


def _status(server: Server) -> str:
    """What `llmgw status` prints for a router."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    out = subprocess.run(
        llmgw("status", "--admin", server.admin),
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def _light(fleet: Fleet, server: Server) -> httpx.Response:
    """One short request of the light key, which waits at most a second."""
    return httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "model": fleet.model,
            "messages": [{"role": "user", "content": "Tell me about the sea"}],
            "max_tokens": 2,
        },
        headers={
            "authorization": f"Bearer {fleet.secrets['light']}",
            "x-llmgw-max-queue-wait": "1",
        },
        timeout=60,
    )


class Flood:
    """The test's streams, opened on a router and waited for."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.streams: list[Stream] = []

    def hold(self, server: Server, key: str, count: int) -> list[Stream]:
        streams = [Stream(server, self.fleet.model, self.fleet.secrets[key]) for _ in range(count)]
        self.streams += streams
        wait_for(lambda: all(s.answering for s in streams), f"{count} streams of {key}")
        return streams

    def hang_up(self, *servers: Server) -> None:
        for stream in self.streams:
            stream.hang_up()
        for server in servers:
            wait_for(lambda: server.in_flight() == 0, "every request to end")  # noqa: B023


def _spread_the_flood(flood: Flood, a: Server, b: Server) -> None:
    """Seven places to `filler` and two to `flood` on A (one free: the kept one),
    four to `flood` on B.

    On A the flood's second request comes when one place is left (the reserve's
    most), under its share while `filler` is about: the reserve counts it as a
    taker and keeps a place from then on. It takes the last place; one of the
    filler's streams then ends, and its place is kept."""
    (ending, *_) = flood.hold(a, "filler", 8)
    flood.hold(a, "flood", 1)
    flood.hold(a, "flood", 1)
    assert a.in_flight() == 10
    flood.streams.remove(ending)
    ending.hang_up()
    wait_for(lambda: a.in_flight() == 9, "the filler's stream to end")
    flood.hold(b, "flood", 4)
    assert a.in_flight() == 9 and b.in_flight() == 4
    assert a.queue_state()["reserve"] == 1


def test_a_flood_spread_over_two_routers_sharing_redis_leaves_the_reserve(
    fleet: Fleet,
) -> None:
    a = fleet.router("a", shared=True)
    b = fleet.router("b", shared=True)
    flood = Flood(fleet)
    try:
        _spread_the_flood(flood, a, b)
        # Router A has read B's counts (its next syncs do): the flood's 4 there.
        wait_for(
            lambda: a.queue_state()["elsewhere"] == {"in_flight": 4, "waiting": 0},
            "router A to see router B's requests",
        )
        # The flood holds 6 of its share of 5: its next request on A waits.
        (waiting,) = [Stream(a, fleet.model, fleet.secrets["flood"])]
        flood.streams.append(waiting)
        wait_for(lambda: a.queue_state()["waiting"] == 1, "the flood's request to wait on A")
        # `llmgw status` on A names the other router's requests next to its queue
        # (the one free place is the kept one: the flood's request waits).
        shown = _status(a).splitlines()
        (line,) = [x for x in shown if x.startswith(f"queue {fleet.model}: ")]
        assert line.startswith(
            f"queue {fleet.model}: full but for kept places; waiting: default 1 (oldest "
        )
        assert line.endswith(
            "; 1 kept for keys under their share; other routers: 4 in flight, 0 waiting"
        ), line

        # The light key's request takes the kept place at once: nothing has ended
        # (every stream is held), so it had no other place to wait for.
        answer = _light(fleet, a)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 2
        assert a.queue_state()["waiting"] == 1
        assert not waiting.answering
        assert all(s.answering for s in flood.streams if s is not waiting)
        # Router B sees A's: filler 7, flood 2 and its waiting request.
        wait_for(
            lambda: b.queue_state()["elsewhere"] == {"in_flight": 9, "waiting": 1},
            "router B to see router A's requests",
        )
    finally:
        flood.hang_up(a, b)
        a.proc.stop()
        b.proc.stop()
    for server in (a, b):
        output = server.proc.output()
        assert "the reserve counts this router's requests only" not in output


def test_without_sharing_the_same_flood_takes_the_reserve(fleet: Fleet) -> None:
    a = fleet.router("a", shared=False)
    b = fleet.router("b", shared=False)
    flood = Flood(fleet)
    try:
        _spread_the_flood(flood, a, b)
        assert "elsewhere" not in a.queue_state()
        # Alone, router A sees the flood holding 2 of its share of 5: it takes the
        # kept place, and the light key's request waits its whole budget.
        flood.hold(a, "flood", 1)
        assert a.in_flight() == 10
        answer = _light(fleet, a)
        assert answer.status_code == 429, answer.text
        assert answer.json()["error"]["code"] == "queue_wait_expired"
    finally:
        flood.hang_up(a, b)
        a.proc.stop()
        b.proc.stop()
