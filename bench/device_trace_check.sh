#!/usr/bin/env bash
# Tracing's overhead on an idle machine with many cores: tracing off (A) against
# tracing on at 100% sampling (B) and at 1% (C), same run, c=64 (the issue's target:
# B/A >= 0.85 in req/s). Runs `bench/router_overhead.py --tracing` on this tree, and,
# with BEFORE_SRC set to another tree's src/ (e.g. `git archive REV src | tar -x -C
# /tmp/before`, then BEFORE_SRC=/tmp/before/src), on that tree too, alternating.
# About 75 s a run; ROUNDS runs of each tree (default 2; 4 runs ~ 5 minutes).
# Prints each run's c=64 row and the B/A of every run; writes nothing in the tree.
#
# Usage: bench/device_trace_check.sh            (from the repository root)
#        BEFORE_SRC=/tmp/before/src ROUNDS=2 bench/device_trace_check.sh
# PYTHON (default: .venv/bin/python, else python3) runs the bench; a PYTHONPATH already
# set (site-packages installed elsewhere) is kept after the tree's src/.
# INSTRUCTIONS=1 (needs valgrind) also counts the gateway's instructions a request, off
# and 100% sampled, on each tree (bench/trace_gateway_instructions.py, about 2 minutes
# a count): on an idle machine valgrind's request rate is steady, so the counts of the
# two trees compare.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
ROUNDS=${ROUNDS:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-200}  # seconds a run may take (about 75 on an idle machine)
BEFORE_SRC=${BEFORE_SRC:-}
OUT=${OUT:-$(mktemp -d /tmp/device-trace-check.XXXXXX)}
mkdir -p "$OUT"
echo "nproc $(nproc), load average $(cut -d' ' -f1-3 /proc/loadavg), $("$PYTHON" --version 2>&1)"
echo "tree $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)'), before: ${BEFORE_SRC:-none}"

run() {  # run LABEL PYTHONPATH
    local label=$1 path=$2 log="$OUT/$1.log" rc=0
    echo "== $label (start $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1 /proc/loadavg))"
    PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" timeout "$RUN_TIMEOUT" "$PYTHON" bench/router_overhead.py --tracing --no-write \
        --duration 4 --warmup 1 --features-rounds 3 --features-c 64 >"$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "   failed (exit $rc); last lines of $log:"
        tail -5 "$log" | sed 's/^/   /'
        return 0
    fi
    # The c=64 rows: the summary (c, A req/s, B req/s, B/A, C req/s, C/A, ..., µs/req),
    # then each window (c, pair, gateway, req/s, ..., µs/req, limited by); the target line.
    grep -E '^\| 64 \| ' "$log" | sed 's/^/   /' || true
    grep -m1 -E 'tracing on \(100% sampled\)' "$log" | sed 's/^/   /' || true
}

count() {  # count LABEL PYTHONPATH MODE
    local label=$1 path=$2 mode=$3
    echo "== instructions $label $mode (start $(date -u +%H:%M:%S) UTC)"
    PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" timeout 600 "$PYTHON" bench/trace_gateway_instructions.py "$mode" 20 \
        >"$OUT/instructions-$label-$mode.log" 2>&1 || echo "   failed; see $OUT/instructions-$label-$mode.log"
    head -1 "$OUT/instructions-$label-$mode.log" | sed 's/^/   /'
}

if [ "${INSTRUCTIONS:-0}" = 1 ]; then
    for mode in off 1.0; do
        count after "$PWD/src" "$mode"
        if [ -n "$BEFORE_SRC" ]; then count before "$BEFORE_SRC" "$mode"; fi
    done
fi

for round in $(seq 1 "$ROUNDS"); do
    run "after-$round" "$PWD/src"
    if [ -n "$BEFORE_SRC" ]; then
        run "before-$round" "$BEFORE_SRC"
    fi
done
echo "summary columns: | c | A (off) req/s | B (on) req/s | B/A | C (1%) req/s | C/A | A p50/p99 | B p50/p99 | C p50/p99 | A µs/req | B µs/req | C µs/req | B export µs/req | C export µs/req |"
echo "window columns: | c | pair | gateway | req/s | p50/p99 ms | gateway CPU % | µs/req | other processes % | limited by |"
echo "full logs: $OUT"
