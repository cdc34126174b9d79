"""Two real `llmgw server` routers sharing their prefix index through the real Redis, in
front of real sims: what one router placed, the other sends to the same replica; and a
router whose Redis is down serves every request on its own index."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from procs import Server, Sim, free_port

REDIS_URL = "redis://127.0.0.1:6379/0"


def config(tmp: Path, name: str, sims: list[Sim], redis_url: str, channel: str) -> str:
    lines = ["endpoints:"]
    for i, sim in enumerate(sims):
        lines += [f"  - id: r{i}", f"    url: {sim.url}", "    models: [m]"]
    lines += [
        "router:",
        "  routing:",
        f"    redis_url: '{redis_url}'",
        f"    share_channel: '{channel}'",
        "    share_interval: 0.02",
    ]
    path = tmp / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def body(group: int, question: str) -> dict[str, object]:
    system = f"You answer the questions of team {group} about the sea and its ships. " * 12
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": "m", "messages": messages, "max_tokens": 2}


def shared(server: Server, outcome: str) -> float:
    for line in server.metrics().splitlines():
        if line.startswith(f'llmgw_route_index_shared_total{{outcome="{outcome}"}}'):
            return float(line.split()[-1])
    return 0.0


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def sims() -> Iterator[list[Sim]]:
    started = [Sim("--zero-delay", model="m") for _ in range(4)]
    yield started
    for sim in started:
        sim.proc.stop()


def test_a_group_placed_by_one_router_goes_to_the_same_replica_from_the_other(
    sims: list[Sim], tmp_path: Path
) -> None:
    channel = f"llmgw:test:{secrets.token_hex(4)}"
    one = Server("--config", config(tmp_path, "one", sims, REDIS_URL, channel))
    two = Server("--config", config(tmp_path, "two", sims, REDIS_URL, channel))
    try:
        placed: dict[int, str] = {}
        with httpx.Client(base_url=one.url, timeout=10) as client:
            # Subscriptions start with the servers: send until the other router applies one.
            wait_until(
                lambda: (
                    client.post("/v1/chat/completions", json=body(99, "hi")).status_code == 200
                    and shared(two, "applied") > 0
                ),
                "the second router to apply the first one's placements",
            )
            for group in range(8):
                resp = client.post("/v1/chat/completions", json=body(group, "first question"))
                assert resp.status_code == 200
                placed[group] = resp.headers["x-llmgw-replica"]
        assert len(set(placed.values())) > 1  # the groups are spread over the replicas
        wait_until(lambda: shared(two, "applied") >= shared(one, "sent") >= 9, "every placement")
        with httpx.Client(base_url=two.url, timeout=10) as client:
            for group in range(8):
                resp = client.post(
                    "/v1/chat/completions",
                    json=body(group, "a second question"),
                    headers={"x-llmgw-route": "1"},
                )
                assert resp.status_code == 200
                route = resp.headers["x-llmgw-route"]
                # The second router never saw this group, yet holds its prefix where the first sent it.
                assert resp.headers["x-llmgw-replica"] == placed[group], route
                held, total = route.split("cached=")[1].split()[0].split("/")
                assert int(held) > int(total) / 2, route
    finally:
        one.proc.stop()
        two.proc.stop()


def test_a_router_whose_redis_is_down_serves_on_its_own_index(
    sims: list[Sim], tmp_path: Path
) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    server = Server("--config", config(tmp_path, "alone", sims, down, "llmgw:test:down"))
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            replicas = set()
            for _ in range(10):
                resp = client.post("/v1/chat/completions", json=body(1, "same question"))
                assert resp.status_code == 200
                replicas.add(resp.headers["x-llmgw-replica"])
        # Its own index still keeps the group on one replica.
        assert len(replicas) == 1
        wait_until(lambda: shared(server, "dropped") >= 1, "the placements to be dropped")
        wait_until(
            lambda: "routing index sharing: Redis publish failed" in server.proc.output(),
            "the outage to be logged",
        )
        assert server.proc.output().count("routing index sharing: Redis publish failed") == 1
    finally:
        server.proc.stop()
