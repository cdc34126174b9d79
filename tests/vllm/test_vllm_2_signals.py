"""What llmgw reads from real vLLM's /metrics: requests running and waiting, KV-cache
use and prefix-cache hits, and what it does with them (the model's load line,
autoscaling on `target_queue_depth`, the router's mirror of the engine's hit counters).

vLLM runs two sequences at a time here (`--max-num-seqs 2`), so a third concurrent
request waits inside the engine, as a full batch makes requests wait on a GPU.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from procs import wait_for
from vllm_fleet import MODEL, Fleet

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

# Long enough to span several of vLLM's 128-token prefix-cache blocks.
LONG_PROMPT = " ".join(f"Fact {n}: the river number {n} flows into the sea." for n in range(60))


@contextmanager
def load(fleet: Fleet, workers: int) -> Iterator[list[int]]:
    """`workers` clients sending chat requests back to back until the block ends."""
    stop = threading.Event()
    codes: list[int] = []

    def worker(index: int) -> None:
        with fleet.client(timeout=300) as client:
            while not stop.is_set():
                answer = client.post(
                    "/v1/chat/completions",
                    json={"model": MODEL, "max_tokens": 24, "messages": [
                        {"role": "user", "content": f"Count from {index} to {index + 30}."}
                    ]},
                )  # fmt: skip
                codes.append(answer.status_code)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    try:
        yield codes
    finally:
        stop.set()
        for thread in threads:
            thread.join(300)


def scale_events(fleet: Fleet) -> list[str]:
    return [e["message"] for e in fleet.events(MODEL) if e["kind"] == "scale"][::-1]


def test_waiting_requests_and_kv_use_are_read_from_vllm_and_scale_the_model(
    vllm_fleet: Fleet,
) -> None:
    assert len(vllm_fleet.ready()) == 1
    with load(vllm_fleet, 5) as codes:
        # Two run and three wait inside vLLM: its own vllm:num_requests_waiting says so.
        load_now = wait_for(
            lambda: (
                (found := vllm_fleet.status()["load"])
                and (found.get("engine_waiting") or 0) > 0
                and found
            ),
            "requests waiting in vLLM, read from its /metrics",
            within=120,
        )
        assert load_now["kv_use"] is not None and 0 < load_now["kv_use"] <= 1, load_now
        shown = vllm_fleet.cli("models", "show", MODEL).stdout
        assert re.search(r"\d+ waiting \(\d+ in engines, \d+ in routers", shown), shown
        assert re.search(r"KV cache \d+% used", shown), shown
        # More than router.queue.max_waiting (1) waiting in vLLM: the router's queue
        # calls the model saturated and holds the next requests itself.
        saturated = wait_for(
            lambda: next(
                (
                    m
                    for m in vllm_fleet.admin("/admin/api/queue")["models"]
                    if m["model"] == MODEL and m["state"] == "saturated"
                ),
                None,
            ),
            "the router's queue to find the model saturated by vLLM's waiting requests",
            within=120,
        )
        assert saturated["saturated"] is True, saturated
        # One replica per waiting request (target_queue_depth 1), up to max_replicas 2.
        wait_for(
            lambda: any(m.endswith(": 2 replicas for the load") for m in scale_events(vllm_fleet)),
            "autoscaling to ask for a second replica",
            within=120,
        )
        wait_for(lambda: len(vllm_fleet.shards()) == 2, "the second replica to be placed")
    assert set(codes) == {200}, codes
    # The load is gone: after scale_down_delay the surplus replica (the one still
    # loading, or the newest) is drained and the first keeps serving (keep_alive -1).
    wait_for(lambda: len(vllm_fleet.shards()) == 1, "the surplus replica to stop", within=120)
    lower = scale_events(vllm_fleet)[-1]
    assert re.match(r"load lower for 2 s: .*: [01] replicas? for the load$", lower), lower
    assert len(vllm_fleet.ready()) == 1


def hits(fleet: Fleet) -> float:
    """The engine's prefix-cache hits (tokens) as llmgw mirrors them, over its endpoints."""
    text = httpx.get(fleet.server.admin + "/metrics", timeout=10).text
    found = re.findall(r"^llmgw_engine_prefix_cache_hits_tokens\{[^}]*\} (\S+)$", text, re.M)
    return sum(float(value) for value in found)


def test_a_repeated_long_prompt_shows_vllms_prefix_hits_in_llmgws_metrics(
    vllm_fleet: Fleet,
) -> None:
    before = hits(vllm_fleet)
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": LONG_PROMPT}]}
    with vllm_fleet.client() as client:
        first = client.post("/v1/chat/completions", json=body)
        assert first.status_code == 200, first.text
        prompt_tokens = first.json()["usage"]["prompt_tokens"]
        assert prompt_tokens > 512
        again = client.post("/v1/chat/completions", json=body)
        assert again.status_code == 200, again.text
    # vLLM counts hits in whole 128-token blocks: nearly the whole prompt, the second time.
    wait_for(
        lambda: hits(vllm_fleet) - before >= prompt_tokens - 128,
        "vLLM's prefix-cache hits in llmgw's metrics",
    )
