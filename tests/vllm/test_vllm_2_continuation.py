"""Mid-stream continuation with real vLLM: a stream whose connection to vLLM breaks goes on.

The fleet has one vLLM replica, so the continuation goes back to it (a replica whose
connection failed once is tried again after a short pause): the router's
connections to vLLM are cut mid-stream with `ss -K` (the kernel aborts them, as a
reset or a proxy dropping them would), and the router sends vLLM the answer so far
as the final assistant message with `continue_final_message: true`. With greedy
decoding the spliced answer is the answer vLLM gives in one go: no gap, no repeat.
(It may run on past that answer's end: when vLLM's output queue backs up on a loaded
machine it sends several tokens in one chunk, the router counts chunks for the
attempt that broke, and the continuation may then be allowed a few tokens more.)
The same for a Messages stream vLLM serves natively (continued as chat, in
Anthropic's events).
"""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

import pytest
from vllm_fleet import MODEL, Fleet, data_events

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

QUESTION = [{"role": "user", "content": "Name the planets of the solar system, in order."}]
TOKENS = 24


def cut_connections(port: str) -> None:
    """Abort every TCP connection to `port` on this machine (the router's to vLLM)."""
    subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", port], check=True, timeout=30)


def read(
    fleet: Fleet, path: str, body: dict[str, Any], cut_after: int | None
) -> tuple[str, list[str]]:
    """Stream `body`; its request id and lines. With `cut_after`, the router's
    connections to vLLM are cut once that many text pieces arrived."""
    port = fleet.endpoint_url().rsplit(":", 1)[1]
    pieces = 0
    cut = threading.Event()
    lines: list[str] = []
    with (
        fleet.client(timeout=300) as client,
        client.stream("POST", path, json={**body, "stream": True}) as answer,
    ):
        assert answer.status_code == 200, answer.read()
        request_id = answer.headers["x-request-id"]
        for line in answer.iter_lines():
            if not line:
                continue
            lines.append(line)
            if line.startswith("data:") and ('"content":"' in line or '"text_delta"' in line):
                pieces += 1
            if cut_after is not None and pieces == cut_after and not cut.is_set():
                cut.set()
                cut_connections(port)
    assert cut_after is None or cut.is_set(), "the stream ended before the cut"
    return request_id, lines


def chat_text(lines: list[str]) -> tuple[str, list[dict[str, Any]], bool]:
    events, done = data_events(lines)
    text = "".join(
        (choice.get("delta") or {}).get("content") or ""
        for event in events
        for choice in event.get("choices") or []
    )
    return text, events, done


def test_a_vllm_chat_stream_cut_mid_way_is_continued_without_gap_or_repeat(
    vllm_fleet: Fleet,
) -> None:
    body = {
        "model": MODEL,
        "messages": QUESTION,
        "temperature": 0,
        "max_tokens": TOKENS,
        "stream_options": {"include_usage": True},
    }
    whole, _, _ = chat_text(read(vllm_fleet, "/v1/chat/completions", body, None)[1])
    request_id, lines = read(vllm_fleet, "/v1/chat/completions", body, cut_after=6)
    text, events, done = chat_text(lines)
    assert done, lines
    assert not [line for line in lines if line.startswith("event: error")], lines
    assert text.startswith(whole), (text, whole)
    assert len({e["id"] for e in events}) == 1
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == TOKENS, usage
    record = vllm_fleet.record(request_id)
    assert (record["completion_tokens"], record["continued"]) == (TOKENS, 1), record
    assert 'llmgw_continuations_total{cause="disconnect",model="smollm2"}' in (
        vllm_fleet.server.metrics()
    )


def test_a_native_vllm_messages_stream_cut_mid_way_is_continued(vllm_fleet: Fleet) -> None:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": TOKENS, "temperature": 0}
    _, whole_lines = read(vllm_fleet, "/v1/messages", body, None)
    request_id, lines = read(vllm_fleet, "/v1/messages", body, cut_after=6)

    def events(found: list[str]) -> list[dict[str, Any]]:
        return [json.loads(line[len("data:") :]) for line in found if line.startswith("data:")]

    def text(found: list[dict[str, Any]]) -> str:
        return "".join(
            e["delta"]["text"]
            for e in found
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
        )

    got = events(lines)
    kinds = [e["type"] for e in got]
    assert kinds.count("message_start") == 1 and kinds[-1] == "message_stop", kinds
    assert "error" not in kinds
    assert kinds.count("content_block_start") == 1, kinds
    assert text(got).startswith(text(events(whole_lines))), (got, whole_lines)
    assert got[-2]["usage"]["output_tokens"] == TOKENS
    record = vllm_fleet.record(request_id)
    assert (record["completion_tokens"], record["continued"]) == (TOKENS, 1), record
