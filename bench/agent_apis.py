"""What translating the Messages and Responses APIs costs, against chat completions.

Starts a zero-delay `llmgw sim` and an open-mode `llmgw server` in front of it,
then runs closed-loop load (bench/loadgen.py) for each route in turn, rounds
alternating chat, Messages, Responses so that drift on a shared machine hits
all three alike, and once straight at the sim as the baseline:

1. non-streaming (max_tokens 16, concurrency 1 and 16): p50 latency and req/s;
   the router's overhead is a route's p50 minus the sim's own p50;
2. streams (64 tokens, concurrency 16): SSE `data:` events a second.

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


def _run(port: int, route: str, *, stream: bool, concurrency: int, seconds: float) -> Any:
    tokens = 64 if stream else 16
    path, payload = _payload("chat" if route == "sim" else route, tokens, stream)
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
    procs = [
        subprocess.Popen(
            [py, "-m", "llmgw", "sim", "--host", HOST, "--port", str(sim_port),
             "--model", MODEL, "--zero-delay"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [py, "-m", "llmgw", "server", "--endpoint", f"s=http://{HOST}:{sim_port}={MODEL}",
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
    rows: dict[str, Row] = {k: {} for k in ("sim", *ROUTES)}
    for _ in range(rounds):
        for route, row in rows.items():
            target = sim_port if route == "sim" else port
            one = _run(target, route, stream=False, concurrency=1, seconds=seconds)
            many = _run(target, route, stream=False, concurrency=16, seconds=seconds)
            streams = _run(target, route, stream=True, concurrency=16, seconds=seconds)
            for name, result in (("c1", one), ("c16", many), ("stream", streams)):
                if result.error_count:
                    raise SystemExit(f"{route} {name}: {result.errors[:3]}")
            row.setdefault("p50_c1", []).append(one.latency(50) * 1000)
            row.setdefault("rps_c16", []).append(many.rps)
            row.setdefault("p50_c16", []).append(many.latency(50) * 1000)
            row.setdefault("events", []).append(streams.events_per_s)
            row.setdefault("streams", []).append(streams.rps)
    return rows


def _table(rows: dict[str, Row]) -> str:
    med = {route: {k: statistics.median(v) for k, v in row.items()} for route, row in rows.items()}
    base = med["sim"]["p50_c1"]
    chat_over = med["chat"]["p50_c1"] - base
    lines = [
        f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; medians of the rounds.",
        "",
        "| route | p50 c=1 (ms) | overhead vs sim (ms) | x chat's overhead | req/s c=16 "
        "| p50 c=16 (ms) | stream events/s c=16 | streams/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for route, m in med.items():
        over = m["p50_c1"] - base
        ratio = "" if route == "sim" else f"{over / chat_over:.2f}" if chat_over > 0 else "n/a"
        lines.append(
            f"| {route} | {m['p50_c1']:.2f} | {'' if route == 'sim' else f'{over:.2f}'} "
            f"| {ratio} | {m['rps_c16']:.0f} | {m['p50_c16']:.2f} | {m['events']:.0f} "
            f"| {m['streams']:.1f} |"
        )
    return "\n".join(lines)


def _write(table: str) -> None:
    path = Path(__file__).resolve().parent / "RESULTS.md"
    text = path.read_text()
    begin, end = "<!-- agent-apis:start -->", "<!-- agent-apis:end -->"
    section = (
        f"{begin}\n## Messages and Responses translation vs chat completions "
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
