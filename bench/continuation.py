"""Continuation benchmark: how long a client waits when its stream's engine dies.

Per run: three counting sims (`--text sequence`, 50 ms between tokens) behind one
`llmgw server` that knows them as `sim` engines. First the time to first token of
fresh streams on that fleet (3 sequential requests, their median); then one stream
of 200 tokens: once the client has 10 tokens, the sim serving it is killed with
SIGKILL and the clock runs from the kill to the next token the client reads (the
router sees the connection break, continues on another replica, and relays its
first token). The killed sim is started again on its port before the next run.

The target (from the issue): at most a fresh request's TTFT + 100 ms when another
replica is Ready. Each run also checks the spliced text: ` w1 ... w200`, no gap, no
repeat.

With `--api messages` the streams are Anthropic Messages streams the sims serve
natively (`--native-apis messages`, as vLLM does): the router reads back the
Messages events it relayed and continues as chat through the Messages translation.

Run: `.venv/bin/python bench/continuation.py [--runs 5] [--api messages]`. Writes the
`continuation` (or `continuation-messages`) section of bench/RESULTS.md unless
`--no-write`.

Not guaranteed: the same numbers on a loaded machine (both sides of the comparison
pay for it alike); the 50 ms token gap keeps a token already on its way at the kill
from being mistaken for the continuation's first one.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import Proc, Server, free_port, llmgw
from sections import write_section

ITL = 0.05
TOKENS = 200
KILL_AFTER = 10
BODY = {
    "model": "m1",
    "messages": [{"role": "user", "content": "Count, please."}],
    "max_tokens": TOKENS,
    "stream": True,
}


PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}


def start_sim(port: int) -> Proc:
    proc = Proc(
        llmgw(
            "sim",
            *("--host", "127.0.0.1", "--port", str(port), "--model", "m1"),
            *("--text", "sequence", "--itl", str(ITL), "--itl-per-running", "0"),
            *("--native-apis", "messages"),
        )
    )
    proc.wait_http(f"http://127.0.0.1:{port}/sim/stats")
    return proc


def tokens_of(line: str) -> str:
    """The text a line of a chat or Messages stream adds."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return ""
    chunk = orjson.loads(line[len("data: ") :])
    if chunk.get("type") == "content_block_delta":
        return str(chunk["delta"].get("text") or "")
    return "".join((c.get("delta") or {}).get("content") or "" for c in chunk.get("choices", []))


def fresh_ttft(client: httpx.Client, url: str) -> float:
    start = time.monotonic()
    ttft = 0.0
    with client.stream("POST", url, json={**BODY, "max_tokens": 4}) as resp:
        for line in resp.iter_lines():
            if tokens_of(line) and not ttft:
                ttft = time.monotonic() - start
    return ttft


def killed_stream(client: httpx.Client, url: str, sims: dict[str, Proc]) -> tuple[float, str, bool]:
    """Seconds from the kill to the next token, the killed replica, and whether the
    text is the whole sequence."""
    text = ""
    killed_at = 0.0
    gap = 0.0
    victim = ""
    with client.stream("POST", url, json=BODY) as resp:
        victim = resp.headers["x-llmgw-replica"]
        for line in resp.iter_lines():
            piece = tokens_of(line)
            if not piece:
                continue
            if killed_at and not gap:
                gap = time.monotonic() - killed_at
            text += piece
            if len(text.split()) == KILL_AFTER and not killed_at:
                killed_at = time.monotonic()
                os.kill(sims[victim].popen.pid, signal.SIGKILL)
    whole = text.split() == [f"w{n}" for n in range(1, TOKENS + 1)]
    return gap, victim, whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--api", choices=sorted(PATHS), default="chat")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    native = ", apis: {messages: native}" if args.api == "messages" else ""

    ports = {name: free_port() for name in ("a", "b", "c")}
    sims = {name: start_sim(port) for name, port in ports.items()}
    config = Path(tempfile.mkdtemp(prefix="llmgw-bench-")) / "llmgw.yaml"
    config.write_text(
        "router: {health: {interval: 0.5}}\nendpoints:\n"
        + "".join(
            f"  - {{id: {n}, url: 'http://127.0.0.1:{p}', models: [m1], engine: sim{native}}}\n"
            for n, p in ports.items()
        )
    )
    server = Server("--config", str(config))
    rows: list[tuple[int, float, float, str, bool]] = []
    try:
        with httpx.Client(timeout=120) as client:
            url = server.url + PATHS[args.api]
            fresh_ttft(client, url)  # warm the router's connections
            for run in range(1, args.runs + 1):
                ttft = statistics.median(fresh_ttft(client, url) for _ in range(3))
                gap, victim, whole = killed_stream(client, url, sims)
                rows.append((run, ttft, gap, victim, whole))
                print(
                    f"run {run}: fresh TTFT {ttft * 1000:.1f} ms, kill to next token "
                    f"{gap * 1000:.1f} ms ({victim}), text whole: {whole}",
                    flush=True,
                )
                sims[victim].stop()
                sims[victim] = start_sim(ports[victim])

                def healthy(name: str = victim) -> bool:
                    return any(e["id"] == name and e["healthy"] for e in server.endpoints())

                deadline = time.monotonic() + 60
                while not healthy() and time.monotonic() < deadline:
                    time.sleep(0.1)
    finally:
        server.proc.stop()
        for proc in sims.values():
            proc.stop()

    extra = [(gap - ttft) * 1000 for _, ttft, gap, _, _ in rows]
    title = "## Continuation: from an engine's death to the next token on the client"
    option = ""
    if args.api == "messages":
        title += " (Messages, served natively)"
        option = " --api messages"
    lines = [
        title,
        "",
        f"Command: `.venv/bin/python bench/continuation.py --runs {args.runs}{option}`",
        f"({os.cpu_count()} cores, Python {platform.python_version()}, one server, three "
        f"`llmgw sim --text sequence --itl {ITL}` replicas, one stream of {TOKENS} tokens "
        f"per run; its replica SIGKILLed after {KILL_AFTER} tokens; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
        f"{os.getloadavg()[0]:.1f} at the end: a machine shared with other work).",
        "",
        "| run | fresh TTFT (ms, median of 3) | kill to next token (ms) | difference (ms) "
        "| text whole |",
        "|--:|--:|--:|--:|:--|",
    ]
    for (run, ttft, gap, _, whole), diff in zip(rows, extra, strict=True):
        lines.append(
            f"| {run} | {ttft * 1000:.1f} | {gap * 1000:.1f} | {diff:+.1f} | "
            f"{'yes' if whole else 'NO'} |"
        )
    lines += [
        "",
        f"Median difference {statistics.median(extra):+.1f} ms, worst {max(extra):+.1f} ms "
        "(target: at most +100 ms). Every run's text is the whole sequence: "
        f"{'yes' if all(r[4] for r in rows) else 'NO'}.",
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("continuation" if args.api == "chat" else f"continuation-{args.api}", body)


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
