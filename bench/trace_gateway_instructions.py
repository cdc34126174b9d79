"""Instructions a request in a real gateway, tracing off or on: callgrind on `llmgw server`.

Usage: python bench/trace_gateway_instructions.py MODE [SECONDS] [--cache]

MODE is `off` (no telemetry settings) or a sample ratio (`0.01`, `1.0`: spans go to the
export process and on to `bench/otlp_sink.py`). One zero-delay `llmgw sim` behind one
`llmgw server --auth-mode open` that runs under `valgrind --tool=callgrind` with
instrumentation off through start-up; 4 closed-loop connections (bench/loadgen.py)
send non-streaming chat completions; after a warm-up, instrumentation is switched on
and the counters zeroed (`callgrind_control`) as the measuring window opens, and
dumped as it closes; then the same length of time with no requests is counted too.
Prints the gateway's instructions per request answered in the window (all its
threads: the event loop, the span sink's thread, the usage writer's) less the idle
window's count (its timers, health probes and database loops: 4-5 million
instructions a second under valgrind), and the C functions with the largest
exclusive counts a request
(`callgrind_annotate`); with `--cache`, callgrind's cache simulation too (first-level
and last-level misses a request: what a tight-loop replay of the tracing calls,
bench/trace_path_cost.py, does not pay). Instruction counts do not move with the
machine's load; requests/s under valgrind mean nothing. Not exact: the timers' work
in a busy window is not the idle window's when valgrind gets little CPU (a loaded
machine; 200 requests in 20 s or fewer), and the sink's batches fall in the window or
not; compare runs with similar request counts, or use bench/trace_path_cost.py
`--replay` for the tracing calls alone. The export process and the
sink run natively, outside the count. The callgrind output stays in
/tmp/trace-instructions-MODE.out.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
from trace_cost_probe import start_gateway

HOST = "127.0.0.1"
CONCURRENCY = 4
WARMUP = 20.0  # seconds: valgrind translates the request path's code on first use


class _Window(loadgen.WindowHooks):
    def __init__(self, pid: int) -> None:
        self._pid = str(pid)

    def start(self) -> None:
        subprocess.run(
            ["callgrind_control", "-i", "on", self._pid], check=True, capture_output=True
        )
        subprocess.run(["callgrind_control", "-z", self._pid], check=True, capture_output=True)

    def end(self) -> dict[str, float]:
        subprocess.run(["callgrind_control", "-d", self._pid], check=True, capture_output=True)
        return {}


def _dump(out: Path, number: int) -> Path:
    """Callgrind's `number`th dump of the run writing `out` (callgrind_control -d)."""
    found = sorted(out.parent.glob(f"{out.name}.{number}*"))
    if not found:
        sys.exit(f"callgrind wrote no dump {number} for {out}")
    return found[0]


def _totals(dump: Path) -> tuple[list[str], list[int]]:
    """The event names and totals of one callgrind dump."""
    text = dump.read_text(errors="replace")
    head = re.search(r"^events: (.*)$", text, re.M)
    total = re.search(r"^(?:summary|totals): (.*)$", text, re.M)
    if head is None or total is None:
        sys.exit(f"{dump}: no events or totals line")
    return head.group(1).split(), [int(v) for v in total.group(1).split()]


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--cache"]
    cache = "--cache" in sys.argv[1:]
    if len(args) not in (1, 2):
        sys.exit(__doc__)
    mode = args[0]
    seconds = float(args[1]) if len(args) == 2 else 30.0
    if mode != "off" and not 0.0 <= float(mode) <= 1.0:
        sys.exit(f"MODE {mode!r}: use off or a sample ratio between 0 and 1")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind (with callgrind_control) is needed: apt-get install valgrind")
    data = Path(tempfile.mkdtemp(prefix="trace-instructions-"))
    out = Path(f"/tmp/trace-instructions-{mode}.out")
    for old in out.parent.glob(out.name + "*"):
        old.unlink()
    procs: list[subprocess.Popen[bytes]] = []
    valgrind = (
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
        *(["--cache-sim=yes"] if cache else []),
    )  # fmt: skip
    try:
        gateway, gw_port, _, request = start_gateway(
            mode, data, procs, wrapper=valgrind, ready_within=600, poll=0.5
        )
        result = asyncio.run(
            loadgen.run_phase(
                HOST, gw_port, request, concurrency=CONCURRENCY, warmup=WARMUP,
                duration=seconds, stream=False, hooks=_Window(gateway.pid), drain_timeout=60,
            )
        )  # fmt: skip
        done = result.completed
        # The same length of time with no requests: what the gateway's timers (health
        # probes, the usage writer, the sink's wake-ups) cost, taken off the window's
        # total (under valgrind a request takes long enough for them to matter).
        control = ["callgrind_control", str(gateway.pid)]
        subprocess.run([*control[:1], "-z", *control[1:]], check=True, capture_output=True)
        time.sleep(result.seconds)
        subprocess.run([*control[:1], "-d", *control[1:]], check=True, capture_output=True)
        window, idle = _dump(out, 1), _dump(out, 2)
        names, busy = _totals(window)
        _, quiet = _totals(idle)
        per = ", ".join(
            f"{name} {(b - q) / max(done, 1):,.0f}"
            for name, b, q in zip(names, busy, quiet, strict=True)
        )
        rate = ", ".join(
            f"{name} {q / result.seconds:,.0f}" for name, q in zip(names, quiet, strict=True)
        )
        print(
            f"{mode}: {done} requests in {result.seconds:.1f} s, errors {result.error_count}; "
            f"a request (less the idle rate): {per}; idle, a second: {rate}"
        )
        annotate = subprocess.run(
            ["callgrind_annotate", "--inclusive=no", str(window)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        print("  the window's largest exclusive counts, a request (idle not taken off):")
        shown = 0
        for line in annotate.stdout.splitlines():
            found = re.match(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$", line)
            if found is None or "PROGRAM TOTALS" in line or shown >= 25:
                continue
            count = int(found.group(1).replace(",", ""))
            print(f"  {count / max(done, 1):10,.0f}  {found.group(2).split('[')[0][-100:]}")
            shown += 1
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
