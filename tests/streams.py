"""Streams as a client reads them, for the tests of mid-stream continuation.

`stream` reads a chat or completion stream, `events_of` a stream of another API
(Messages, Responses); `records` reads the usage records a server wrote, failing
on a second record for one request; `sim_pids` finds the engines agents started
(they outlive their agents). The sims count (`--text sequence`: ` w1 w2 ...`), so
`words` is what a stream with no gap and no repeat reads.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from procs import Server

MESSAGES = [{"role": "user", "content": "Count, please."}]


def words(count: int, start: int = 1) -> list[str]:
    return [f"w{n}" for n in range(start, start + count)]


@dataclass
class Streamed:
    """One stream as the client read it."""

    status: int = 0
    replica: str = ""
    request_id: str = ""
    text: str = ""
    # The thought (`reasoning` deltas) before the text.
    reasoning: str = ""
    # Tool calls by index: their ids (every one sent), names and arguments; and how many
    # chunks carried arguments.
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    argument_chunks: int = 0
    finishes: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    usage: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    done: int = 0
    roles: int = 0


def stream(
    server: Server,
    body: dict[str, Any],
    *,
    path: str = "/v1/chat/completions",
    on_tokens: Callable[[Streamed], None] | None = None,
    after: int = 3,
    commented: threading.Event | None = None,
) -> Streamed:
    """POST a stream and read it to its end; `on_tokens` is called once `after` chunks
    with text arrived, `commented` set once an SSE comment did."""
    out = Streamed()
    chat = path.endswith("/chat/completions")
    with (
        httpx.Client(timeout=httpx.Timeout(120.0)) as client,
        client.stream("POST", server.url + path, json={**body, "stream": True}) as resp,
    ):
        out.status = resp.status_code
        out.replica = resp.headers.get("x-llmgw-replica", "")
        out.request_id = resp.headers.get("x-request-id", "")
        event = ""
        for line in resp.iter_lines():
            if line.startswith(":"):
                out.comments.append(line)
                if commented is not None:
                    commented.set()
            elif line.startswith("event:"):
                event = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    out.done += 1
                    continue
                chunk = orjson.loads(data)
                if event == "error":
                    out.errors.append(chunk)
                    continue
                out.ids.add(chunk.get("id", ""))
                if chunk.get("usage") and not chunk.get("choices"):
                    out.usage.append(chunk["usage"])
                for choice in chunk.get("choices") or []:
                    if chat:
                        delta = choice.get("delta") or {}
                        out.roles += "role" in delta
                        out.text += delta.get("content") or ""
                        out.reasoning += delta.get("reasoning") or ""
                        for call in delta.get("tool_calls") or []:
                            seen = out.calls.setdefault(
                                call["index"], {"ids": [], "name": "", "arguments": ""}
                            )
                            if "id" in call:
                                seen["ids"].append(call["id"])
                            function = call.get("function") or {}
                            seen["name"] += function.get("name") or ""
                            seen["arguments"] += function.get("arguments") or ""
                            out.argument_chunks += bool(function.get("arguments"))
                    else:
                        out.text += choice.get("text") or ""
                    if choice.get("finish_reason"):
                        out.finishes.append(choice["finish_reason"])
                said = len((out.reasoning + out.text).split()) + out.argument_chunks
                if on_tokens is not None and said == after:
                    on_tokens(out)
    return out


def records(data_dir: Path) -> dict[str, tuple[int, int, int, int]]:
    """request id -> (status, prompt tokens, completion tokens, continued) of every record."""
    with sqlite3.connect(data_dir / "llmgw.db") as db:
        rows = db.execute(
            "SELECT request_id, status, prompt_tokens, completion_tokens, continued "
            "FROM usage_records"
        ).fetchall()
    seen: dict[str, tuple[int, int, int, int]] = {}
    for request_id, status, prompt, completion, continued in rows:
        assert request_id not in seen, f"two usage records for request {request_id}"
        seen[request_id] = (int(status), int(prompt), int(completion), int(continued or 0))
    return seen


def events_of(
    server: Server,
    path: str,
    body: dict[str, Any],
    *,
    each: Callable[[dict[str, Any]], None] | None = None,
    head: Callable[[httpx.Response], None] | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """POST a stream of another API and read it to its end: its request id, and every
    event's data (with the event's name as `_event`), comments left out. `head` gets
    the response once its headers came, `each` every event as it comes."""
    found: list[dict[str, Any]] = []
    with (
        httpx.Client(timeout=httpx.Timeout(120.0)) as client,
        client.stream("POST", server.url + path, json={**body, "stream": True}) as resp,
    ):
        assert resp.status_code == 200, resp.read()
        if head is not None:
            head(resp)
        request_id = resp.headers["x-request-id"]
        event = "message"
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line[len("event:") :].strip()
            elif line.startswith("data:"):
                found.append({**orjson.loads(line[len("data:") :]), "_event": event})
                if each is not None:
                    each(found[-1])
    return request_id, found


def api_stream(
    server: Server,
    path: str,
    body: dict[str, Any],
    *,
    on_tokens: Callable[[Streamed], None] | None = None,
    after: int = 3,
) -> Streamed:
    """A Messages (`/v1/messages`) or Responses (`/v1/responses`) stream read like
    `stream` reads a chat: its text deltas, error events, the usage it ended with
    (as prompt/completion tokens), `done` once it ended (`message_stop`,
    `response.completed` or `response.incomplete`), and `ids` its message or
    response ids."""
    out = Streamed(status=200)

    def head(resp: httpx.Response) -> None:
        out.replica = resp.headers.get("x-llmgw-replica", "")
        out.request_id = resp.headers.get("x-request-id", "")

    def each(event: dict[str, Any]) -> None:
        kind = event.get("type")
        usage: dict[str, Any] | None = None
        if kind == "error" or event["_event"] == "error":
            out.errors.append(event)
        elif kind == "message_start":
            out.ids.add(event["message"]["id"])
        elif kind == "content_block_delta" and event["delta"]["type"] == "text_delta":
            out.text += event["delta"]["text"]
        elif kind == "message_delta":
            usage = event["usage"]
        elif kind == "message_stop":
            out.done += 1
        elif kind in ("response.created", "response.completed", "response.incomplete"):
            out.ids.add(event["response"]["id"])
            if kind != "response.created":
                usage = event["response"]["usage"]
                out.done += 1
        elif kind == "response.output_text.delta":
            out.text += event["delta"]
        if usage is not None:
            out.usage.append(
                {
                    "prompt_tokens": usage["input_tokens"],
                    "completion_tokens": usage["output_tokens"],
                }
            )
        if on_tokens is not None and "delta" in event and len(out.text.split()) == after:
            on_tokens(out)

    events_of(server, path, body, each=each, head=head)
    return out


def sim_pids(port: str) -> list[int]:
    """Processes whose command line is `llmgw sim ... --port PORT` (engines outlive agents)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sim" in argv and any(
            a == b"--port" and b == port.encode() for a, b in itertools.pairwise(argv)
        ):
            pids.append(int(entry.name))
    return pids
