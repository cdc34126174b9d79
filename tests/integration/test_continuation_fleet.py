"""No stream dies with its replica: 50 streams over 3 placed replicas, one replica lost mid-stream.

A real `llmgw server`, three real agents on loopback (one GPU each) and the
three `llmgw sim` replicas the control plane places on them (counting:
`--text sequence`; Messages and Responses served natively, as vLLM does). Fifty
streams at once, chat, Messages and Responses mixed; once every client has read
a few tokens, the replica of one of them is lost: its engine
SIGKILLed, or its node frozen (agent and engine SIGSTOPped: connections stay
open and nothing answers, until the control plane sees the heartbeats stop).
Every stream must end as a whole answer would, with the sim's sequence (no gap,
no repeat), its usage, and one usage record per request; the streams of the
lost replica are the continued ones. Every wait is on an event, never a sleep.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for
from streams import MESSAGES, Streamed, api_stream, records, sim_pids, stream, words

TOKENS = 60
STREAMS = 50

CONFIG = """
control:
  heartbeat_interval: 0.3
  unreachable_after: 3
  lost_after: 300
  reconcile_interval: 0.5
  activation_keepalive: 0.3
router: {health: {interval: 0.5}}
models:
  - name: m1
    weights: none
    min_replicas: 3
    max_replicas: 3
    keep_alive: -1
    profiles:
      - name: sim
        engine: sim
        gpus: 1
        engine_args: [--text, sequence, --itl, "0.05", --native-apis, "messages,responses"]
"""

BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "m1",
        "messages": MESSAGES,
        "max_tokens": TOKENS,
        "stream_options": {"include_usage": True},
    },
    "/v1/messages": {"model": "m1", "messages": MESSAGES, "max_tokens": TOKENS},
    "/v1/responses": {"model": "m1", "input": "Count.", "max_output_tokens": TOKENS},
}


@dataclass
class Fleet:
    server: Server
    agents: dict[str, Proc]
    # node -> the first port of its agent's --port-range (10 ports)
    lows: dict[str, int]
    # replica id -> engine URL, once three replicas are in the router
    urls: dict[str, str]

    def node_of(self, replica: str) -> str:
        port = int(self.urls[replica].rsplit(":", 1)[1])
        return next(n for n, low in self.lows.items() if low <= port < low + 10)

    def engine_pids(self, replica: str) -> list[int]:
        return sim_pids(self.urls[replica].rsplit(":", 1)[1])


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agents: dict[str, Proc] = {}
    lows: dict[str, int] = {}
    try:
        for node in ("node-a", "node-b", "node-c"):
            lows[node] = low = free_port_block(10)
            argv = llmgw(
                "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", node,
                "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / node / "w"),
                "--state-dir", str(tmp_path / node / "s"), "--port-range", f"{low}-{low + 9}",
            )  # fmt: skip
            agents[node] = Proc(argv)

        def three_routed() -> list[dict[str, object]] | None:
            found = [e for e in server.endpoints() if e["healthy"] and e["engine"] == "sim"]
            return found if len(found) == 3 else None

        endpoints = wait_for(three_routed, "three ready replicas in the router", within=240)
        yield Fleet(server, agents, lows, {str(e["id"]): str(e["url"]) for e in endpoints})
    except BaseException:
        print(server.proc.output())
        for node, proc in agents.items():
            print(f"--- agent {node}\n{proc.output()}")
        raise
    finally:
        for proc in agents.values():
            # A frozen agent would not hear SIGTERM.
            proc.signal(signal.SIGCONT)
            proc.stop()
        # Engines outlive their agents: stop those the agents started (frozen ones too).
        for low in lows.values():
            for port in range(low, low + 10):
                for pid in sim_pids(str(port)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        server.proc.stop()


@dataclass
class Loss:
    """The lost replica, and the streams that were under way on it (with their API)."""

    replica: str
    under_way: dict[int, str]


def run_streams(fleet: Fleet, lose: Callable[[str], None]) -> tuple[Loss, list[Streamed]]:
    """Fifty streams at once; once every client has read three tokens, `lose(replica)`
    is called for the replica with streams of the most APIs under way. What was lost,
    and every stream read (each checked whole)."""
    seen: dict[int, tuple[Streamed, str]] = {}
    losses: list[Loss] = []
    lock = threading.Lock()

    def reading(streamed: Streamed, path: str) -> None:
        with lock:
            seen[id(streamed)] = (streamed, path)
            if len(seen) < STREAMS or losses:
                return
            # Streams far from their end: nothing can finish them before the loss.
            by_replica: dict[str, dict[int, str]] = {}
            for key, (s, p) in seen.items():
                if len(s.text.split()) < TOKENS - 10:
                    by_replica.setdefault(s.replica, {})[key] = p
            replica = max(
                by_replica, key=lambda r: (len(set(by_replica[r].values())), len(by_replica[r]))
            )
            losses.append(Loss(replica, by_replica[replica]))
            lose(replica)

    def one(n: int) -> tuple[str, Streamed]:
        # Mixed so that any replica gets every API, whatever order they arrive in.
        path = list(BODIES)[(n // 3) % len(BODIES)]

        def on_tokens(streamed: Streamed) -> None:
            reading(streamed, path)

        if path == "/v1/chat/completions":
            return path, stream(fleet.server, BODIES[path], on_tokens=on_tokens)
        return path, api_stream(fleet.server, path, BODIES[path], on_tokens=on_tokens)

    with ThreadPoolExecutor(max_workers=STREAMS) as pool:
        futures = [pool.submit(one, n) for n in range(STREAMS)]
        done = [f.result(timeout=240) for f in futures]
    [loss] = losses
    for path, result in done:
        assert result.status == 200, (path, result)
        assert result.errors == [], (path, result.errors)
        assert result.text.split() == words(TOKENS), (path, result.text)
        assert result.done == 1, (path, result)
        assert len(result.ids) == 1, (path, result.ids)
        assert len(result.usage) == 1, (path, result.usage)
        assert result.usage[0]["completion_tokens"] == TOKENS, (path, result.usage)
    return loss, [result for _, result in done]


def check_records(fleet: Fleet, loss: Loss, results: list[Streamed]) -> None:
    """One usage record per request, each counting what its client read; every stream
    under way on the lost replica was continued (of each API), and no other."""

    def all_recorded() -> dict[str, tuple[int, int, int, int]] | None:
        found = records(fleet.server.data_dir)
        return found if len(found) >= len(results) else None

    recorded = wait_for(all_recorded, "a usage record per request", within=60)
    assert len(recorded) == len(results)
    for result in results:
        status, prompt, completion, times = recorded[result.request_id]
        assert (status, completion) == (200, TOKENS)
        assert result.usage[0]["prompt_tokens"] == prompt
        if id(result) in loss.under_way:
            assert times >= 1, result
        elif result.replica != loss.replica:
            assert times == 0, result
    print(f"{len(results)} streams; continued: {Counter(loss.under_way.values())}")
    assert set(loss.under_way.values()) == set(BODIES)


@pytest.mark.timeout(420)
def test_fifty_streams_outlive_an_engine_killed_mid_stream(fleet: Fleet) -> None:
    def kill(replica: str) -> None:
        for pid in fleet.engine_pids(replica):
            os.kill(pid, signal.SIGKILL)

    loss, results = run_streams(fleet, kill)
    check_records(fleet, loss, results)
    assert 'llmgw_continuations_total{cause="disconnect",model="m1"}' in fleet.server.metrics()


@pytest.mark.timeout(420)
def test_fifty_streams_outlive_a_node_frozen_mid_stream(fleet: Fleet) -> None:
    def freeze(replica: str) -> None:
        fleet.agents[fleet.node_of(replica)].signal(signal.SIGSTOP)
        for pid in fleet.engine_pids(replica):
            os.kill(pid, signal.SIGSTOP)

    loss, results = run_streams(fleet, freeze)
    check_records(fleet, loss, results)
    # Nothing closed the frozen engine's connections: the control plane's word that its
    # node stopped answering moved them on.
    assert 'llmgw_continuations_total{cause="abandoned",model="m1"}' in fleet.server.metrics()
    for pid in fleet.engine_pids(loss.replica):
        os.kill(pid, signal.SIGCONT)
