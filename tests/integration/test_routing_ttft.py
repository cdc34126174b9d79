"""Routing by predicted time to first token on a real `llmgw server` in front of real sims.

Each sim runs two sequences at once (`--max-running 2`), as an engine's batch, and
answers slowly, so a stream holds its slot until the test lets it go. The router is
told nothing of the batch size: it learns it from the sims' metrics (requests
running while some wait; `llmgw_route_batch_size`). What a user sees is asserted:
which replica served (`x-llmgw-replica`), read on a loaded machine without timing
thresholds (every wait is for an event: a slot taken, a metric read).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from procs import Server, Sim

HEAD = "You answer the questions of team {group} about tides, winds and ships. " * 14


def body(group: str, *turns: str, max_tokens: int = 2, stream: bool = False) -> dict[str, object]:
    messages = [{"role": "system", "content": HEAD.format(group=group)}]
    for i, turn in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": turn})
    return {"model": "m", "messages": messages, "max_tokens": max_tokens, "stream": stream}


def wait_until(check: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Held:
    """A streamed request that holds its engine slot until `release()`."""

    def __init__(self, url: str, payload: dict[str, object]) -> None:
        self.replica: str | None = None
        self.status: int | None = None
        self._started = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, payload), daemon=True)
        self._thread.start()

    def _run(self, url: str, payload: dict[str, object]) -> None:
        with (
            httpx.Client(timeout=300) as client,
            client.stream("POST", url + "/v1/chat/completions", json=payload) as resp,
        ):
            self.status = resp.status_code
            self.replica = resp.headers.get("x-llmgw-replica")
            self._started.set()
            self._stop.wait(300)
        # Leaving the block closes the connection: the router cancels the engine's request.

    def started(self) -> str:
        assert self._started.wait(90), "the held stream never answered"
        assert self.status == 200 and self.replica is not None
        return self.replica

    def answered(self) -> bool:
        return self._started.is_set()


def release(held: list[Held]) -> None:
    """Lets every held stream go (a queued one starts, then ends, once others left)."""
    for h in held:
        h._stop.set()
    for h in held:
        h._thread.join(90)


def config(tmp: Path, sims: list[Sim]) -> str:
    lines = ["endpoints:"]
    for i, sim in enumerate(sims):
        lines += [f"  - id: r{i}", f"    url: {sim.url}", "    models: [m]"]
    # Engine metrics read often, so that the test's waits for a read are short.
    lines += ["router:", "  routing:", "    metrics_interval: 0.2"]
    path = tmp / "ttft.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def metric(server: Server, name: str, endpoint: str) -> float | None:
    for line in server.metrics().splitlines():
        if line.startswith(f'{name}{{endpoint="{endpoint}"}}'):
            return float(line.split()[-1])
    return None


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Server, dict[str, Sim]]]:
    # 20 tokens a second: a stream of 1,000 tokens holds its slot far longer than a test.
    sims = [Sim("--max-running", "2", "--itl", "0.05", model="m") for _ in range(3)]
    server = Server("--config", config(tmp_path, sims))
    try:
        yield server, {f"r{i}": sim for i, sim in enumerate(sims)}
    finally:
        server.proc.stop()
        for sim in sims:
            sim.proc.stop()


def opening(user: int) -> str:
    # Longer than a few routing blocks: the replica that served it holds more than the head.
    return f"user {user} starts a conversation about the harbour. " * 10


def post(server: Server, payload: dict[str, object]) -> str:
    resp = httpx.post(server.url + "/v1/chat/completions", json=payload, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.headers["x-llmgw-replica"]


def saturate(server: Server, sims: dict[str, Sim], group: str) -> tuple[str, list[Held]]:
    """Warm `group` on one replica, then hold three of its streams there (two running,
    one waiting in the engine) until the router has learned that batch size."""
    home = post(server, body(group, "warm up"))
    held = [
        Held(server.url, body(group, f"user {i} asks at length", max_tokens=1000, stream=True))
        for i in range(3)
    ]
    # Two run and answer; the third waits inside the engine (it may not answer yet).
    wait_until(lambda: sum(h.answered() for h in held) >= 2, "two held streams to answer")
    assert {h.started() for h in held if h.answered()} == {home}
    sim = sims[home]
    wait_until(
        lambda: sim.stats()["running"] == 2 and sim.stats()["waiting"] == 1,
        "the home replica to run two and queue one",
    )
    wait_until(
        lambda: metric(server, "llmgw_route_batch_size", home) == 2,
        "the router to learn the home replica's batch size",
    )
    return home, held


def test_a_saturated_replica_is_passed_over_for_an_idle_one(
    fleet: tuple[Server, dict[str, Sim]],
) -> None:
    server, sims = fleet
    home, held = saturate(server, sims, "north")
    try:
        # A new user of the same group: its head is cached only on the full replica,
        # which would make it wait; an idle replica computes the head instead.
        resp = httpx.post(
            server.url + "/v1/chat/completions",
            json=body("north", "a new user's question"),
            headers={"x-llmgw-route": "1"},
            timeout=120,
        )
        assert resp.status_code == 200
        assert resp.headers["x-llmgw-replica"] != home, resp.headers["x-llmgw-route"]
        assert " wait=0.0ms " in resp.headers["x-llmgw-route"]
    finally:
        release(held)


def test_a_group_moves_while_its_replica_stays_saturated(
    fleet: tuple[Server, dict[str, Sim]],
) -> None:
    server, sims = fleet
    home, held = saturate(server, sims, "south")
    moved: dict[int, str] = {}
    try:
        for user in range(3):
            moved[user] = post(server, body("south", opening(user)))
        assert home not in moved.values(), moved
    finally:
        release(held)
    wait_until(lambda: sims[home].stats()["running"] == 0, "the home replica to empty")
    # The home replica has room again, yet the moved conversations stay where their
    # history is cached: they moved, they do not bounce back.
    for user in range(3):
        second = body("south", opening(user), "an answer that the engine gave, " * 8, "and then?")
        assert post(server, second) == moved[user]


def test_a_cold_prefix_goes_to_the_least_loaded_replica(
    fleet: tuple[Server, dict[str, Sim]],
) -> None:
    server, _ = fleet
    # One group's two conversations on one replica: it is busy, the others idle.
    held = [
        Held(server.url, body("hot", f"user {i} talks", max_tokens=1000, stream=True))
        for i in range(2)
    ]
    try:
        assert len({h.started() for h in held}) == 1
        wait_until(lambda: server.in_flight() == 2, "two held streams in flight")
        for n in range(4):
            loads = {str(e["id"]): int(str(e["in_flight"])) for e in server.endpoints()}
            h = Held(server.url, body(f"cold-{n}", "hello", max_tokens=1000, stream=True))
            held.append(h)
            replica = h.started()
            # Rendezvous order alone would pick the same replica for some of these.
            assert loads[replica] == min(loads.values()), (replica, loads)
            wait_until(
                lambda r=replica, before=loads[replica]: any(
                    e["id"] == r and int(str(e["in_flight"])) == before + 1
                    for e in server.endpoints()
                ),
                "the held stream to count in flight",
            )
        counts = sorted(int(str(e["in_flight"])) for e in server.endpoints())
        assert counts == [2, 2, 2], counts
    finally:
        release(held)
