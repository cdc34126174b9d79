"""Load wins over prefix affinity at a replica's capacity: real server, agents and sims.

A model with two replicas and `target_in_flight: 2`: one hot prompt (longer than a
routing block) sent one at a time stays on one replica (its prefix cache), sent at a
concurrency above the target it spreads over both. Counted by the sims themselves.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
from test_control_plane import fleet, sim_model, wait_for

HOT = "You answer questions about the weather at sea, briefly and exactly. " * 20


def _requests_by_engine(urls: list[str]) -> dict[str, int]:
    return {
        url: int(httpx.get(url + "/sim/stats", timeout=10).json()["requests_total"]) for url in urls
    }


def test_a_hot_prompt_stays_on_one_replica_until_its_target_in_flight(tmp_path: Path) -> None:
    # Each answer takes about a second (20 tokens, 50 ms apart).
    models = sim_model("hot", args="--itl 0.05", min_replicas=2, max_replicas=2, target_in_flight=2)
    body = {
        "model": "hot",
        "messages": [{"role": "system", "content": HOT}, {"role": "user", "content": "wind?"}],
        "max_tokens": 20,
    }
    with fleet(tmp_path, models) as f:
        wait_for(lambda: len(f.ready_replicas("hot")) == 2, "two replicas of hot", within=60)
        urls = [r["endpoint_url"] for r in f.ready_replicas("hot")]
        before = _requests_by_engine(urls)
        with httpx.Client(base_url=f.server.url, timeout=60) as client:
            for _ in range(5):
                assert client.post("/v1/chat/completions", json=body).status_code == 200
        one_at_a_time = {u: n - before[u] for u, n in _requests_by_engine(urls).items()}
        # One in flight at a time: the prefix's replica takes every request.
        assert sorted(one_at_a_time.values()) == [0, 5], one_at_a_time

        codes: list[int] = []

        def send() -> None:
            codes.append(
                httpx.post(f"{f.server.url}/v1/chat/completions", json=body, timeout=60).status_code
            )

        # Six at once against a target of two per replica: both replicas serve.
        threads = [threading.Thread(target=send) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert codes == [200] * 6
        at_once = {
            u: n - before[u] - one_at_a_time[u] for u, n in _requests_by_engine(urls).items()
        }
        assert sum(at_once.values()) == 6
        assert min(at_once.values()) >= 2, at_once
