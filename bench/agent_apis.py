"""What the Messages and Responses APIs cost through the router, translated or native.

Starts a zero-delay `llmgw sim --native-apis messages,responses` serving two
model names and an open-mode `llmgw server` in front of it with two static
endpoints on that sim: `m1` translated (the default), `m2` with
`apis: {messages: native, responses: native}` (passed through as bytes). Then
runs closed-loop load (bench/loadgen.py) for each row in turn, rounds
alternating the rows so that drift on a shared machine hits all alike, and
straight at the sim as the baselines (its chat path, and its native Messages
and Responses handlers):

1. non-streaming (max_tokens 16, concurrency 1 and 16): p50 latency and req/s;
   the router's overhead is a row's p50 minus the p50 of what the sim runs for
   it (chat for chat and translated rows, the API's own handler for native rows);
2. streams (64 tokens, concurrency 16): SSE `data:` events and streams a second
   (tokens a second = streams x 64; the APIs frame a stream with different
   numbers of events).

The issue's target: translation costs at most 1.5x the chat route's overhead.
Prints a markdown table; `--write` puts it in bench/RESULTS.md between the
`agent-apis` markers.
Not guaranteed: numbers are comparable only between runs on the same, otherwise
idle machine; nothing is pinned to cores here.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen

HOST = "127.0.0.1"
MODEL = "m1"
NATIVE_MODEL = "m2"
PROMPT = "Write about the sea and the shore in a few words"
ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]},
    ),
    "messages": (
        "/v1/messages",
        {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]},
    ),
    "responses": ("/v1/responses", {"model": MODEL, "input": PROMPT}),
}
LIMIT = {"chat": "max_tokens", "messages": "max_tokens", "responses": "max_output_tokens"}


def _port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _payload(route: str, tokens: int, stream: bool) -> tuple[str, dict[str, Any]]:
    path, body = ROUTES[route]
    return path, {**body, LIMIT[route]: tokens, **({"stream": True} if stream else {})}


def _events(port: int, path: str, payload: dict[str, Any]) -> int:
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    conn.request("POST", path, json.dumps(payload), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    if resp.status != 200:
        raise SystemExit(f"{path} answered {resp.status}: {body[:300]!r}")
    return body.count(b"data:")


def _wait(port: int, path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"nothing answered 200 on {HOST}:{port}{path}")


# row -> (target: the sim or the router, API route, model, the sim row that is its baseline)
ROWS: dict[str, tuple[str, str, str, str]] = {
    "sim chat": ("sim", "chat", MODEL, ""),
    "sim messages": ("sim", "messages", MODEL, ""),
    "sim responses": ("sim", "responses", MODEL, ""),
    "chat": ("router", "chat", MODEL, "sim chat"),
    "messages translated": ("router", "messages", MODEL, "sim chat"),
    "responses translated": ("router", "responses", MODEL, "sim chat"),
    "messages native": ("router", "messages", NATIVE_MODEL, "sim messages"),
    "responses native": ("router", "responses", NATIVE_MODEL, "sim responses"),
}


def _run(
    port: int, route: str, model: str, *, stream: bool, concurrency: int, seconds: float
) -> Any:
    tokens = 64 if stream else 16
    path, payload = _payload(route, tokens, stream)
    payload = {**payload, "model": model}
    request = loadgen.build_request(HOST, port, path, payload)
    expect = _events(port, path, payload) if stream else 0
    return asyncio.run(
        loadgen.run_phase(
            HOST,
            port,
            request,
            concurrency=concurrency,
            warmup=0.5,
            duration=seconds,
            stream=stream,
            expect_events=expect,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds a phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write into bench/RESULTS.md")
    args = parser.parse_args()
    sim_port, port, admin = _port(), _port(), _port()
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-apis-"))
    py = sys.executable
    config = work / "llmgw.yaml"
    url = f"http://{HOST}:{sim_port}"
    config.write_text(
        "endpoints:\n"
        f"  - {{id: translated, url: '{url}', models: [{MODEL}]}}\n"
        f"  - {{id: native, url: '{url}', models: [{NATIVE_MODEL}],"
        " apis: {messages: native, responses: native}}\n"
    )
    procs = [
        subprocess.Popen(
            [py, "-m", "llmgw", "sim", "--host", HOST, "--port", str(sim_port),
             "--model", MODEL, "--model", NATIVE_MODEL, "--zero-delay",
             "--native-apis", "messages,responses"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [py, "-m", "llmgw", "server", "--config", str(config),
             "--listen", f"{HOST}:{port}", "--admin-listen", f"{HOST}:{admin}",
             "--agent-listen", f"{HOST}:{_port()}", "--insecure-agents",
             "--data-dir", str(work), "--auth-mode", "open"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
    ]  # fmt: skip
    try:
        _wait(sim_port, "/health")
        _wait(admin, "/readyz")
        rows = _measure(sim_port, port, args.seconds, args.rounds)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=15)
    table = _table(rows)
    print(table)
    if args.write:
        _write(table)


Row = dict[str, list[float]]


def _measure(sim_port: int, port: int, seconds: float, rounds: int) -> dict[str, Row]:
    rows: dict[str, Row] = {name: {} for name in ROWS}
    for _ in range(rounds):
        for name, row in rows.items():
            target, route, model, _ = ROWS[name]
            at = sim_port if target == "sim" else port
            one = _run(at, route, model, stream=False, concurrency=1, seconds=seconds)
            many = _run(at, route, model, stream=False, concurrency=16, seconds=seconds)
            streams = _run(at, route, model, stream=True, concurrency=16, seconds=seconds)
            for phase, result in (("c1", one), ("c16", many), ("stream", streams)):
                if result.error_count:
                    raise SystemExit(f"{name} {phase}: {result.errors[:3]}")
            row.setdefault("p50_c1", []).append(one.latency(50) * 1000)
            row.setdefault("rps_c16", []).append(many.rps)
            row.setdefault("p50_c16", []).append(many.latency(50) * 1000)
            row.setdefault("events", []).append(streams.events_per_s)
            row.setdefault("streams", []).append(streams.rps)
    return rows


def _table(rows: dict[str, Row]) -> str:
    med = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in rows.items()}
    chat_over = med["chat"]["p50_c1"] - med["sim chat"]["p50_c1"]
    lines = [
        f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; medians of the rounds.",
        "",
        "| row | p50 c=1 (ms) | added p50 vs its sim row (ms) | x chat's added | req/s c=16 "
        "| p50 c=16 (ms) | stream events/s c=16 | streams/s | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in med.items():
        base = ROWS[name][3]
        added = m["p50_c1"] - med[base]["p50_c1"] if base else 0.0
        ratio = "" if not base else f"{added / chat_over:.2f}" if chat_over > 0 else "n/a"
        lines.append(
            f"| {name} | {m['p50_c1']:.2f} | {f'{added:.2f}' if base else ''} "
            f"| {ratio} | {m['rps_c16']:.0f} | {m['p50_c16']:.2f} | {m['events']:.0f} "
            f"| {m['streams']:.1f} | {m['streams'] * 64:.0f} |"
        )
    return "\n".join(lines)


def _write(table: str) -> None:
    path = Path(__file__).resolve().parent / "RESULTS.md"
    text = path.read_text()
    begin, end = "<!-- agent-apis:start -->", "<!-- agent-apis:end -->"
    section = (
        f"{begin}\n## Messages and Responses: translated, native pass-through, chat completions "
        f"(`bench/agent_apis.py`)\n\n{table}\n{end}"
    )
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


if __name__ == "__main__":
    main()
