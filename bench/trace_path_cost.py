"""The tracing calls one traced request makes, alone: CPU µs per request on this thread.

Usage: python bench/trace_path_cost.py [REQUESTS] [--profile]
       python bench/trace_path_cost.py --replay RATIO REQUESTS
       python bench/trace_path_cost.py --kept RATIO REQUESTS

Replays, REQUESTS times, the tracing calls the gateway makes for one non-streaming
chat completion when tracing is on (`llmgw.router.app` and `llmgw.router.proxy`:
the server span made current with its attributes, the sampled checks, the auth,
route and upstream spans, the engine's `traceparent`, the attributes set after the
answer) through llmgw's tracer and a real `SpanSink` whose export process only
reads the pipe (`cat`), so the sink thread's flushes run as in the gateway. Prints
the CPU time per request of the calling thread (`time.thread_time`) and of the
whole process (the sink thread's pickling and writes too), the median of 5 rounds,
for 100% sampled, 1% sampled, and the `is None` check of tracing off;
with `--profile`, a cProfile of the 100% sampled rounds. No I/O, no event loop: it
measures the request path's tracing code, not the garbage collections or cache
misses that its objects cause in a gateway under load (bench/trace_cost_probe.py).

`--replay RATIO REQUESTS` only replays REQUESTS requests sampled at RATIO and prints
nothing: run it under `valgrind --tool=callgrind` with REQUESTS and with 0, and the
difference of the two instruction totals divided by REQUESTS is the instructions a
request, a count this shared machine's load does not move (bench/RESULTS.md).

`--kept RATIO REQUESTS` prints what REQUESTS replayed requests leave for the garbage
collector while their spans wait for the sink's next batch (no flush in between):
the objects it counts that are still alive, per request (its young generation's
count, with collections off), and its young collections per 1,000 requests (on).
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import statistics
import sys
import time

from opentelemetry.context import get_current
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.util.types import AttributeValue

from llmgw.telemetry.propagation import child_span, span_trace_id, trace_headers
from llmgw.telemetry.spans import RecordTracer, SpanSink, current_span


def _recording(tracer: Tracer | None) -> Tracer | None:
    if tracer is None or not current_span().is_recording():
        return None
    return tracer


def one_request(tracer: Tracer | None) -> None:
    """The calls of app.py's `_observed`, `_authenticate`, `_complete`, and proxy.py's
    queue check, `_traced_pick`, `_traced_attempt` and `_post`, in their order."""
    if tracer is None:
        return
    method, path = "POST", "/v1/chat/completions"
    with tracer.start_as_current_span(
        f"{method} {path}",
        context=None,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method, "http.route": path},
    ) as span:
        t = f"{span_trace_id(span):032x}"
        request_id = f"{t[:8]}-{t[8:12]}-{t[12:16]}-{t[16:20]}-{t[20:]}".encode()
        span.set_attribute("llmgw.request_id", request_id.decode("latin-1"))
        auth = _recording(tracer)
        if auth is not None:
            with child_span(auth, "llmgw.auth") as child:
                child.set_attribute("llmgw.key_id", "k1")
        current_span().set_attributes(
            {"llmgw.model": "m", "llmgw.stream": False, "llmgw.key_id": "k1"}
        )
        _recording(tracer)  # the queue's check
        route = _recording(tracer)
        if route is None:
            trace_headers(None)  # `_post`: the request's (not sampled) span goes upstream
        else:
            with route.start_span(
                "llmgw.route",
                attributes={"llmgw.model": "m", "llmgw.route.candidates": 1},
            ) as child:
                chosen: dict[str, AttributeValue] = {"llmgw.route.chosen": "fast"}
                for name, value in (("prefix", 0.0), ("load", 1.0)):
                    chosen[f"llmgw.route.score.{name}"] = value
                child.set_attributes(chosen)
            get_current()
            with child_span(
                route,
                "llmgw.upstream",
                {"llmgw.replica": "fast", "llmgw.attempt": 1, "llmgw.engine": "unknown"},
                kind=SpanKind.CLIENT,
                record_exception=False,
            ) as child:
                trace_headers(child)
                child.set_attributes(
                    {
                        "http.response.status_code": 200,
                        "llmgw.prompt_tokens": 9,
                        "llmgw.completion_tokens": 16,
                    }
                )
        span.set_attributes({"http.response.status_code": 200, "llmgw.replica": "fast"})


def _tracer(ratio: float) -> tuple[Tracer, SpanSink]:
    sink = SpanSink(
        argv=["sh", "-c", "cat > /dev/null"], env={}, delay=0.2, batch=512, max_queue=1 << 20
    )
    provider = TracerProvider(
        resource=Resource.create({}), sampler=ParentBased(TraceIdRatioBased(ratio))
    )
    tracer = RecordTracer(
        scope="llmgw.router", sink=sink, sampler=provider.sampler, ids=provider.id_generator
    )
    return tracer, sink


def _round(tracer: Tracer | None, requests: int) -> tuple[float, float]:
    """CPU µs a request: this thread's, and the whole process's (the sink thread's
    pickling and writing of the spans too; measured up to its next flush)."""
    begin, begin_all = time.thread_time(), time.process_time()
    for _ in range(requests):
        one_request(tracer)
    mine = time.thread_time() - begin
    time.sleep(0.25)  # the sink thread's next flush (every 0.2 s)
    idle = time.thread_time() - begin - mine
    everything = time.process_time() - begin_all - idle
    return mine / requests * 1e6, everything / requests * 1e6


def _replay(ratio: float, requests: int) -> None:
    tracer, sink = _tracer(ratio)
    try:
        for _ in range(requests):
            one_request(tracer)
    finally:
        sink.shutdown(5)


def _kept(ratio: float, requests: int) -> None:
    tracer, sink = _tracer(ratio)
    # No flush while measuring (neither on time nor on a full batch): spans wait, as
    # they do between two batches.
    sink._delay = 3600.0
    sink._batch = 1 << 40
    try:
        for _ in range(200):
            one_request(tracer)
        gc.collect()
        gc.disable()
        before = gc.get_count()[0]
        for _ in range(requests):
            one_request(tracer)
        alive = gc.get_count()[0] - before
        gc.enable()
        gc.collect()
        young = gc.get_stats()[0]["collections"]
        for _ in range(requests):
            one_request(tracer)
        young = gc.get_stats()[0]["collections"] - young
        print(
            f"sampled {ratio:g}: {alive / requests:.2f} objects the collector counts left "
            f"alive a request; {young * 1000 / requests:.2f} young collections per 1,000 "
            f"requests (threshold {gc.get_threshold()[0]})"
        )
    finally:
        sink.shutdown(5)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--kept"]:
        if len(argv) != 3:
            sys.exit(__doc__)
        _kept(float(argv[1]), int(argv[2]))
        return 0
    if argv[:1] == ["--replay"]:
        if len(argv) != 3:
            sys.exit(__doc__)
        _replay(float(argv[1]), int(argv[2]))
        return 0
    profile = "--profile" in argv
    args = [a for a in argv if a != "--profile"]
    requests = int(args[0]) if args else 20_000
    on, on_sink = _tracer(1.0)
    sampled, sampled_sink = _tracer(0.01)
    try:
        for name, tracer in (("off", None), ("1%", sampled), ("100%", on)):
            _round(tracer, requests // 10)  # warm-up
            rounds = [_round(tracer, requests) for _ in range(5)]
            mine = [r[0] for r in rounds]
            everything = [r[1] for r in rounds]
            print(
                f"{name}: {statistics.median(mine):.1f} µs/request on the request's thread "
                f"(rounds {', '.join(f'{r:.1f}' for r in mine)}), "
                f"{statistics.median(everything):.1f} with the sink thread"
            )
        if profile:
            profiler = cProfile.Profile()
            profiler.runcall(_round, on, requests)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    finally:
        on_sink.shutdown(5)
        sampled_sink.shutdown(5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
