"""Traces and JSON logs end to end: a real `llmgw server` (tracing to an OTLP/HTTP
receiver the test runs, JSON logs, the access log on), a real agent and the sim
engine it starts.

One model starts on its first request (an activation); a second request is a
stream with the client's own `traceparent`. The receiver decodes what the server
exports with the official protos; the test reads the traces: the request's spans
and their parents, their attributes, the `traceparent` the engine received, the
activation's own trace and the links both ways, an agent's registration, and
that no prompt text and no key secret appears in any span or log line.

A stream whose engine breaks off mid-answer (sims that fail every generation after
a few tokens) is continued on the other replica: each continuation is a span of
the request's trace, under its server span, with the cause, the replicas and the
tokens, and the engine that continued it was sent that span as its parent.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import procs
import pytest
from otlp_receiver import OtlpReceiver, ReceivedSpan
from procs import Proc, Server, free_port, free_port_block, llmgw

PROMPT = "tell me about the pelican named Zorbulax-4471"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
FIRST_TRACE = "0af7651916cd43dd8448eb211c80319c"
CONTROL = (
    "control: {heartbeat_interval: 0.3, unreachable_after: 1.5, lost_after: 3, "
    "reconcile_interval: 0.5, activation_timeout: 60, activation_keepalive: 0.3}\n"
)


def _config(tmp: Path, otlp: str) -> Path:
    path = tmp / "llmgw.yaml"
    path.write_text(
        CONTROL
        + f"telemetry: {{otlp_endpoint: '{otlp}', access_log: true}}\n"
        + "models:\n"
        + "  - name: traced\n    weights: none\n"
        + "    profiles: [{name: sim, engine: sim, gpus: 1, engine_args: []}]\n"
    )
    return path


def _create_key(data_dir: Path) -> dict[str, Any]:
    result = subprocess.run(
        llmgw("keys", "create", "--name", "tracer", "--rpm", "1000", "--data-dir",
              str(data_dir), "--json"),
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    created: dict[str, Any] = json.loads(result.stdout)
    return created


def _stream(server: Server, secret: str, traceparent: str) -> httpx.Response:
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {secret}", "traceparent": traceparent},
        json={
            "model": "traced",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 8,
            "stream": True,
        },
        timeout=120,
    ) as response:
        response.read()
    return response


def _one(spans: list[ReceivedSpan], name: str, **where: str) -> ReceivedSpan:
    found = [
        s for s in spans if s.name == name and all(getattr(s, k) == v for k, v in where.items())
    ]
    assert len(found) == 1, (name, where, [(s.name, s.trace_id, s.parent_id) for s in spans])
    return found[0]


def _json_lines(output: str) -> list[dict[str, Any]]:
    lines = [line for line in output.splitlines() if line.strip()]
    parsed = []
    for line in lines:
        entry = json.loads(line)  # every line is one JSON object
        assert {"time", "level", "logger", "message"} <= entry.keys(), line
        parsed.append(entry)
    return parsed


@pytest.fixture
def receiver() -> Any:
    with OtlpReceiver() as running:
        yield running


def test_a_streamed_request_and_its_activation_are_traced_end_to_end(
    tmp_path: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Export spans within moments rather than the SDK's default 5 s batches.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    agent_port = free_port()
    server = Server(
        "--config", str(_config(tmp_path, receiver.url)),
        "--agent-listen", f"127.0.0.1:{agent_port}", "--log-format", "json",
        auth=True, data_dir=tmp_path / "data",
    )  # fmt: skip
    low = free_port_block(10)
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-1",
            "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / "w"),
            "--state-dir", str(tmp_path / "agent"),
            "--port-range", f"{low}-{low + 9}", "--log-format", "json",
        )
    )  # fmt: skip
    try:
        key = _create_key(tmp_path / "data")
        secret, key_id = key["secret"], key["id"]
        # The first request finds no replica: it waits for an activation.
        first = _stream(server, secret, f"00-{FIRST_TRACE}-{CLIENT_SPAN}-01")
        assert first.status_code == 200, first.text
        second = _stream(server, secret, f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
        assert second.status_code == 200, second.text
        assert "data: [DONE]" in second.text
        replica = second.headers["x-llmgw-replica"]
        # A client's trace may hold many requests: each has a request id of its own.
        assert second.headers["x-request-id"].replace("-", "") != CLIENT_TRACE
        # What the engine was sent (the sim keeps its last request's traceparent).
        endpoints = httpx.get(server.admin + "/admin/api/endpoints", timeout=10).json()
        (url,) = [e["url"] for e in endpoints["endpoints"] if e["id"] == replica]
        sent = httpx.get(url + "/sim/stats", timeout=10).json()["last_request"]["traceparent"]
        # Without x-request-id and without a trace, the request id is the trace id.
        third = httpx.post(
            server.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {secret}"},
            json={"model": "traced", "messages": [{"role": "user", "content": PROMPT}]},
            timeout=60,
        )
        assert third.status_code == 200, third.text
        third_trace = third.headers["x-request-id"].replace("-", "")

        def request_spans() -> list[ReceivedSpan] | None:
            spans = receiver.spans()
            names = {s.name for s in spans if s.trace_id == CLIENT_TRACE}
            wanted = {"POST /v1/chat/completions", "llmgw.upstream", "llmgw.route"}
            activation = [s for s in spans if s.name == "llmgw.activation"]
            third = [
                s for s in spans
                if s.trace_id == third_trace and s.name == "POST /v1/chat/completions"
            ]  # fmt: skip
            return spans if wanted <= names and activation and third else None

        spans = procs.wait_for(request_spans, "the request's spans at the receiver", 60)
        assert {s.service for s in spans} == {"llmgw-server"}

        third_root = _one(
            [s for s in spans if s.trace_id == third_trace], "POST /v1/chat/completions"
        )
        assert third_root.parent_id == ""  # a trace begun here
        assert third_root.attributes["llmgw.request_id"] == third.headers["x-request-id"]

        # The streamed request: a server span under the client's span, children below it.
        mine = [s for s in spans if s.trace_id == CLIENT_TRACE]
        root = _one(mine, "POST /v1/chat/completions")
        assert root.parent_id == CLIENT_SPAN
        assert root.span.kind == root.span.SPAN_KIND_SERVER
        assert root.attributes["llmgw.model"] == "traced"
        assert root.attributes["llmgw.key_id"] == key_id
        assert root.attributes["llmgw.stream"] is True
        assert root.attributes["http.response.status_code"] == 200
        assert root.attributes["llmgw.replica"] == replica
        assert root.attributes["llmgw.request_id"] == second.headers["x-request-id"]
        for name in ("llmgw.auth", "llmgw.limits", "llmgw.route"):
            assert _one(mine, name).parent_id == root.span_id, name
        # The replica had room: the request did not wait in the queue, and has no span for it.
        assert not [s for s in mine if s.name == "llmgw.queue"]
        route = _one(mine, "llmgw.route")
        assert route.attributes["llmgw.route.chosen"] == replica
        assert any(k.startswith("llmgw.route.score.") for k in route.attributes), route.attributes
        upstream = _one(mine, "llmgw.upstream")
        assert upstream.parent_id == root.span_id
        assert upstream.span.kind == upstream.span.SPAN_KIND_CLIENT
        assert upstream.attributes["llmgw.replica"] == replica
        assert upstream.attributes["llmgw.attempt"] == 1
        assert upstream.attributes["llmgw.ttft_s"] > 0
        assert upstream.attributes["llmgw.completion_tokens"] > 0
        assert "llmgw.retry_reason" not in upstream.attributes

        # The engine was sent the attempt's span as parent, in the client's trace.
        assert sent == f"00-{CLIENT_TRACE}-{upstream.span_id}-01"

        # The activation: a trace of its own, linked both ways with the request that waited.
        first_spans = [s for s in spans if s.trace_id == FIRST_TRACE]
        first_root = _one(first_spans, "POST /v1/chat/completions")
        wait = _one(first_spans, "llmgw.activation.wait")
        assert wait.parent_id == first_root.span_id
        activation = _one(spans, "llmgw.activation")
        assert activation.trace_id != FIRST_TRACE
        assert activation.attributes["llmgw.model"] == "traced"
        assert (activation.trace_id, activation.span_id) in wait.links()
        assert (FIRST_TRACE, wait.span_id) in activation.links()
        events = activation.events()
        assert "placed" in events and "ready" in events, events
        assert events.index("placed") < events.index("ready")
        assert activation.span.status.code == activation.span.status.STATUS_CODE_OK
        # The reconcile that placed it, and the start it sent, are in its trace.
        reconcile = [
            s for s in spans if s.name == "llmgw.reconcile" and s.trace_id == activation.trace_id
        ]
        assert reconcile and reconcile[0].parent_id == activation.span_id
        start = _one(spans, "llmgw.shard.start", trace_id=activation.trace_id)
        assert start.parent_id == reconcile[0].span_id
        assert start.attributes["llmgw.node"] == "node-1"

        registration = [s for s in spans if s.name == "llmgw.agent.register"]
        assert registration and registration[0].attributes["llmgw.node"] == "node-1"

        # Neither the prompt nor the key's secret is in any span.
        for span in receiver.spans():
            text = span.text()
            assert "Zorbulax" not in text and secret not in text, span.name
    finally:
        agent.stop()
        server.proc.stop()
    # Every log line is a JSON object; the access log names the request and its trace.
    server_log = _json_lines(server.proc.output())
    agent_log = _json_lines(agent.output())
    access = [e for e in server_log if e["logger"] == "llmgw.access"]
    assert any(
        e["trace_id"] == CLIENT_TRACE
        and e["request_id"] == second.headers["x-request-id"]
        and e["model"] == "traced"
        and e["status"] == 200
        and e["replica"] == replica
        and e["key_id"] == key_id
        for e in access
    ), access
    # The control plane's lines carry their context as fields of their own.
    assert any(
        e.get("model") == "traced" and e.get("node") == "node-1" and e.get("replica")
        for e in server_log
    ), server_log
    for entry in server_log + agent_log:
        text = json.dumps(entry)
        assert "Zorbulax" not in text and secret not in text, entry


def test_tracing_off_passes_the_clients_traceparent_to_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Tracing off: no endpoint in the config, none in the environment.
    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    sim = procs.Sim()
    server = Server("--endpoint", f"e1={sim.url}=sim-model")
    try:
        traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
        answer = httpx.post(
            server.url + "/v1/chat/completions",
            headers={"traceparent": traceparent, "tracestate": "vendor=abc"},
            json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert answer.status_code == 200
        last = sim.stats()["last_request"]
        assert isinstance(last, dict)
        assert last["traceparent"] == traceparent
        assert last["headers"]["tracestate"] == "vendor=abc"
        # Off, the request id is a fresh UUID, not a trace id.
        assert answer.headers["x-request-id"].replace("-", "") != CLIENT_TRACE
    finally:
        server.proc.stop()
        sim.proc.stop()


def test_a_request_that_waited_in_the_queue_has_a_span_for_its_wait(
    tmp_path: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    # One place per replica, and about 0.1 s a token: a long stream holds the place.
    sim = procs.Sim("--itl", "0.1", "--itl-per-running", "0")
    config = tmp_path / "llmgw.yaml"
    config.write_text(
        f"telemetry: {{otlp_endpoint: '{receiver.url}'}}\n"
        "router: {max_in_flight: 1, queue: {max_wait: 60, recheck: 0.2}}\n"
    )
    server = Server("--endpoint", f"e1={sim.url}=sim-model", "--config", str(config))
    release = threading.Event()

    def hold() -> None:
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 400, "stream": True}  # fmt: skip
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                          timeout=120) as resp:  # fmt: skip
            for _ in resp.iter_bytes():
                if release.is_set():
                    return

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        procs.wait_for(lambda: server.in_flight() == 1, "the long stream to hold the replica")
        refused = httpx.post(
            server.url + "/v1/chat/completions",
            headers={
                "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
                "x-llmgw-max-queue-wait": "0.3",
            },
            json={"model": "sim-model", "messages": [{"role": "user", "content": "y"}]},
            timeout=60,
        )
        assert refused.status_code == 429, refused.text

        def queue_span() -> ReceivedSpan | None:
            found = [
                s for s in receiver.spans()
                if s.trace_id == CLIENT_TRACE and s.name == "llmgw.queue"
            ]  # fmt: skip
            return found[0] if found else None

        span = procs.wait_for(queue_span, "the queue's span at the receiver", 60)
        root = procs.wait_for(
            lambda: [
                s for s in receiver.spans()
                if s.trace_id == CLIENT_TRACE and s.name == "POST /v1/chat/completions"
            ],
            "the server span",
            60,
        )[0]  # fmt: skip
        assert span.parent_id == root.span_id
        assert span.attributes["llmgw.refused"] == "queue_wait_expired"
        # Its whole budget: asyncio may fire a timer up to its clock's resolution early.
        assert span.attributes["llmgw.queue.waited_s"] >= 0.3 - 0.005
        assert span.attributes["llmgw.model"] == "sim-model"
        assert root.attributes["http.response.status_code"] == 429
    finally:
        release.set()
        holder.join(timeout=60)
        server.proc.stop()
        sim.proc.stop()


def test_a_continued_stream_has_a_span_for_each_continuation(
    tmp_path: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    # Counting sims that break every generation after 4 tokens: 12 tokens take the
    # first answer and two continuations, one on each replica in turn.
    sims = {
        name: procs.Sim(
            "--text", "sequence", "--zero-delay", "--break-after-tokens", "4", model="m1"
        )
        for name in ("s0", "s1")
    }
    config = tmp_path / "llmgw.yaml"
    config.write_text(
        f"telemetry: {{otlp_endpoint: '{receiver.url}', access_log: true}}\n"
        "endpoints:\n"
        + "".join(
            f"  - {{id: {name}, url: '{sim.url}', models: [m1], engine: sim}}\n"
            for name, sim in sims.items()
        )
    )
    server = Server("--config", str(config), "--log-format", "json")
    try:
        with httpx.stream(
            "POST",
            server.url + "/v1/chat/completions",
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            json={
                "model": "m1",
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 12,
                "stream": True,
            },
            timeout=120,
        ) as response:
            text = response.read().decode()
        assert response.status_code == 200, text
        assert "data: [DONE]" in text and "event: error" not in text
        first = response.headers["x-llmgw-replica"]

        def request_spans() -> list[ReceivedSpan] | None:
            mine = [s for s in receiver.spans() if s.trace_id == CLIENT_TRACE]
            names = [s.name for s in mine]
            done = "POST /v1/chat/completions" in names and names.count("llmgw.continuation") == 2
            return mine if done else None

        mine = procs.wait_for(request_spans, "the continued request's spans", 60)
        root = _one(mine, "POST /v1/chat/completions")
        assert root.parent_id == CLIENT_SPAN
        assert root.attributes["http.response.status_code"] == 200
        upstream = _one(mine, "llmgw.upstream")
        assert upstream.attributes["llmgw.replica"] == first
        continuations = sorted(
            (s for s in mine if s.name == "llmgw.continuation"),
            key=lambda s: s.attributes["llmgw.continuation.attempt"],
        )
        other = "s1" if first == "s0" else "s0"
        # Each continuation is the request's child (not the broken attempt's), in turn.
        for span, attempt, broke_on, took_over, before in (
            (continuations[0], 1, first, other, 4),
            (continuations[1], 2, other, first, 8),
        ):
            assert span.parent_id == root.span_id
            assert span.span.kind == span.span.SPAN_KIND_CLIENT
            assert span.attributes["llmgw.continuation.attempt"] == attempt
            assert span.attributes["llmgw.continuation.cause"] == "disconnect"
            assert span.attributes["llmgw.continuation.from"] == broke_on
            assert span.attributes["llmgw.replica"] == took_over
            assert span.attributes["llmgw.continuation.tokens_before"] == before
            assert span.attributes["llmgw.continuation.tokens_after"] == before + 4
        # The first continuation broke off too; the second ended the answer.
        assert continuations[0].attributes["llmgw.continuation.broken"] == "disconnect"
        assert continuations[0].span.status.code == continuations[0].span.status.STATUS_CODE_ERROR
        assert "llmgw.continuation.broken" not in continuations[1].attributes
        assert continuations[1].span.status.code != continuations[1].span.status.STATUS_CODE_ERROR
        # The replica that continued last was sent its continuation's span as parent.
        last = sims[first].stats()["last_request"]
        assert isinstance(last, dict)
        assert last["traceparent"] == f"00-{CLIENT_TRACE}-{continuations[1].span_id}-01"
        for span in receiver.spans():
            assert "Zorbulax" not in span.text(), span.name
    finally:
        server.proc.stop()
        for sim in sims.values():
            sim.proc.stop()
    server_log = _json_lines(server.proc.output())
    assert any(e["logger"] == "llmgw.router.continuation" for e in server_log), server_log
    for entry in server_log:
        assert "Zorbulax" not in json.dumps(entry), entry
