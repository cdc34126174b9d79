"""Routing per model on a real server, agents and sims, counted by the sims themselves.

A model with two replicas and `target_in_flight: 2`: one hot prompt (longer than a
routing block) sent one at a time stays on one replica (its prefix cache), sent at a
concurrency above the target it spreads over both (load wins over affinity at
capacity). A model whose own `routing` turns every scorer off is balanced by load
alone, the same prompt included.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from test_control_plane import Fleet, fleet, sim_model, wait_for

HOT = "You answer questions about the weather at sea, briefly and exactly. " * 20


def _requests_by_engine(urls: list[str]) -> dict[str, int]:
    return {
        url: int(httpx.get(url + "/sim/stats", timeout=10).json()["requests_total"]) for url in urls
    }


def body(model: str) -> dict[str, object]:
    messages = [{"role": "system", "content": HOT}, {"role": "user", "content": "wind?"}]
    return {"model": model, "messages": messages, "max_tokens": 20}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    off = {"prefix": 0, "load": 0, "kv": 0, "session": 0, "rendezvous": 0}
    # hot's answers take about a second each (20 tokens, 50 ms apart).
    declared = sim_model(
        "hot", args="--itl 0.05", min_replicas=2, max_replicas=2, target_in_flight=2
    ) + sim_model("plain", min_replicas=2, max_replicas=2, routing={"scorers": off})
    with fleet(tmp_path_factory.mktemp("routing"), declared) as f:
        for name in ("hot", "plain"):
            wait_for(lambda n=name: len(f.ready_replicas(n)) == 2, f"two replicas of {name}", 60)
        yield f


def test_a_hot_prompt_stays_on_one_replica_until_its_target_in_flight(models: Fleet) -> None:
    hot = body("hot")
    urls = [r["endpoint_url"] for r in models.ready_replicas("hot")]
    before = _requests_by_engine(urls)
    with httpx.Client(base_url=models.server.url, timeout=60) as client:
        for _ in range(5):
            assert client.post("/v1/chat/completions", json=hot).status_code == 200
    one_at_a_time = {u: n - before[u] for u, n in _requests_by_engine(urls).items()}
    # One in flight at a time: the prefix's replica takes every request.
    assert sorted(one_at_a_time.values()) == [0, 5], one_at_a_time

    codes: list[int] = []

    def send() -> None:
        url = f"{models.server.url}/v1/chat/completions"
        codes.append(httpx.post(url, json=hot, timeout=60).status_code)

    # Six at once against a target of two per replica: both replicas serve.
    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert codes == [200] * 6
    at_once = {u: n - before[u] - one_at_a_time[u] for u, n in _requests_by_engine(urls).items()}
    assert sum(at_once.values()) == 6
    assert min(at_once.values()) >= 2, at_once


def test_a_models_own_routing_replaces_the_servers(models: Fleet) -> None:
    urls = [r["endpoint_url"] for r in models.ready_replicas("plain")]
    before = _requests_by_engine(urls)
    with httpx.Client(base_url=models.server.url, timeout=60) as client:
        for _ in range(20):
            assert client.post("/v1/chat/completions", json=body("plain")).status_code == 200
    served = {u: n - before[u] for u, n in _requests_by_engine(urls).items()}
    # Every weight 0: least outstanding by two random choices, no affinity to the prompt.
    assert sum(served.values()) == 20
    assert min(served.values()) >= 1, served
