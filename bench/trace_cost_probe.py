"""Where tracing's cost goes: one gateway, its CPU per request, garbage collections and
a py-spy profile of the measuring window only.

Usage: python bench/trace_cost_probe.py MODE [SECONDS]

MODE is `off` (no telemetry settings) or a sample ratio (`0.01`, `1.0`: spans go to
`bench/otlp_sink.py`). A zero-delay `llmgw sim` behind one `llmgw server
--auth-mode open`; 32 closed-loop connections (bench/loadgen.py) send non-streaming
chat completions; after a 2 s warm-up, the gateway's CPU (utime + stime) over the
window is divided by the requests answered in it, and split into the main thread's
(the event loop) and the other threads' (the span sink, the usage writer's database
thread); the gateway's garbage collections in the window (its admin listener's
`/debug/memory`, read just before and just after the window's CPU readings) are
counted per 1,000 requests, by generation. With py-spy installed next to this
interpreter, `py-spy record --format raw` samples the window into
/tmp/trace-probe-MODE.txt (wall-clock samples: they show where the time goes, not
the CPU). Nothing is pinned: run the modes alternately, several times, on the same machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen

HOST = "127.0.0.1"
CONCURRENCY = 32
WARMUP = 2.0


def _port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def start_gateway(
    mode: str,
    data: Path,
    procs: list[subprocess.Popen[bytes]],
    *,
    wrapper: tuple[str, ...] = (),
    ready_within: float = 60.0,
    poll: float = 0.1,
) -> tuple[subprocess.Popen[bytes], int, int, bytes]:
    """A sim (`--zero-delay`), the OTLP sink when `mode` is a sample ratio, and an
    `llmgw server` in front of the sim (run under `wrapper`, e.g. valgrind), every
    process added to `procs` as it starts (the caller stops them); waits until the
    gateway routes to the sim, else exits naming its log. Returns the gateway, its
    API and admin ports, and a chat request to send it."""
    python = sys.executable
    sim_port, gw_port, admin_port, sink_port = _port(), _port(), _port(), _port()
    quiet = subprocess.DEVNULL
    sim = [python, "-m", "llmgw", "sim", "--host", HOST, "--port", str(sim_port)]
    procs.append(subprocess.Popen([*sim, "--model", "m", "--zero-delay"], stderr=quiet))
    config: list[str] = []
    if mode != "off":
        sink = Path(__file__).resolve().parent / "otlp_sink.py"
        procs.append(subprocess.Popen([python, str(sink), str(sink_port)], stdout=quiet))
        path = data / "gateway.yaml"
        endpoint = f"http://{HOST}:{sink_port}"
        path.write_text(f"telemetry: {{otlp_endpoint: '{endpoint}', sample_ratio: {mode}}}\n")
        config = ["--config", str(path)]
    log = (data / "gateway.log").open("w")
    gateway = subprocess.Popen(
        [
            *wrapper, python, "-m", "llmgw", "server",
            "--endpoint", f"fast=http://{HOST}:{sim_port}=m",
            "--listen", f"{HOST}:{gw_port}", "--admin-listen", f"{HOST}:{admin_port}",
            "--data-dir", str(data), "--auth-mode", "open", "--agent-listen", "off", *config,
        ],
        stderr=log,
    )  # fmt: skip
    procs.append(gateway)
    deadline = time.monotonic() + ready_within
    while True:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{admin_port}/readyz", timeout=5) as r:
                if b'"fast"' in r.read():
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or gateway.poll() is not None:
            sys.exit(f"the gateway did not become ready; its log: {data / 'gateway.log'}")
        time.sleep(poll)
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    request = loadgen.build_request(HOST, gw_port, "/v1/chat/completions", payload)
    return gateway, gw_port, admin_port, request


def _cpu_seconds(pid: int, tid: int | None = None) -> float:
    """A process's CPU seconds (utime + stime), or one of its threads' (`tid`)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _collections(admin_port: int) -> list[int]:
    """The gateway's garbage collections so far, by generation (young, middle, full)."""
    url = f"http://{HOST}:{admin_port}/debug/memory?format=json&top=1"
    with urllib.request.urlopen(url, timeout=30) as answer:
        found: list[int] = json.loads(answer.read())["gc"]["collections"]
        return found


def _start_pyspy(pyspy: str, pid: int, seconds: float, mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            pyspy, "record", "--pid", str(pid), "--nonblocking",
            "--duration", str(max(1, int(seconds) - 1)), "--rate", "200",
            "--format", "raw", "-o", f"/tmp/trace-probe-{mode}.txt",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def main() -> None:
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    mode = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) == 3 else 8.0
    if mode != "off" and not 0.0 <= float(mode) <= 1.0:
        sys.exit(f"MODE {mode!r}: use off or a sample ratio between 0 and 1")
    python = sys.executable
    data = Path(tempfile.mkdtemp(prefix="trace-probe-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        gateway, gw_port, admin_port, request = start_gateway(mode, data, procs)
        pyspy = shutil.which("py-spy", path=str(Path(python).parent))

        async def run() -> tuple[loadgen.PhaseResult, float, float, list[int]]:
            phase = asyncio.create_task(
                loadgen.run_phase(
                    HOST, gw_port, request, concurrency=CONCURRENCY, warmup=WARMUP,
                    duration=seconds, stream=False,
                )
            )  # fmt: skip
            await asyncio.sleep(WARMUP)
            gc_before = await asyncio.to_thread(_collections, admin_port)
            before = _cpu_seconds(gateway.pid)
            loop_before = _cpu_seconds(gateway.pid, gateway.pid)
            spy = None if pyspy is None else _start_pyspy(pyspy, gateway.pid, seconds, mode)
            result = await phase
            cpu = _cpu_seconds(gateway.pid) - before
            loop_cpu = _cpu_seconds(gateway.pid, gateway.pid) - loop_before
            gc_after = await asyncio.to_thread(_collections, admin_port)
            if spy is not None:
                spy.wait()
            return result, cpu, loop_cpu, [a - b for a, b in zip(gc_after, gc_before, strict=True)]

        result, cpu, loop_cpu, collections = asyncio.run(run())
        done = result.completed
        per_k = " / ".join(f"{n * 1000 / max(done, 1):.2f}" for n in collections)
        print(
            f"{mode}: {result.rps:,.0f} req/s, errors {result.error_count}, gateway CPU "
            f"{cpu:.2f} s for {done} requests: {cpu / max(done, 1) * 1e6:.0f} µs/req (main thread "
            f"{loop_cpu / max(done, 1) * 1e6:.0f}, other threads "
            f"{(cpu - loop_cpu) / max(done, 1) * 1e6:.0f}); garbage collections per "
            f"1,000 requests (young / middle / full) {per_k}; "
            f"load average {os.getloadavg()[0]:.2f}"
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
