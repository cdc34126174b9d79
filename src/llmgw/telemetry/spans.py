"""A tracer whose recorded spans cost a few microseconds: plain records, sent away to export.

The SDK's own spans cost 40-60 µs each to make on the request path (attribute
validation through abstract-base checks, a lock per attribute, a generator-based
context manager, the span processor chain) and as much again to encode in the
batch processor's thread, which shares the gateway's interpreter
(bench/RESULTS.md). This tracer implements the OpenTelemetry API (`Tracer`,
`Span`: context, propagation, `use_span` and `get_current_span` work as with
the SDK) with the SDK's own sampler (its parent-based ratio sampler decided inline,
the same way) and id generator, but a recorded span is a slotted object that,
when it ends, becomes one tuple of plain values appended to a list. `SpanSink`
marshals those lists, a batch at a time (one `marshal.dumps` for hundreds of spans,
off the request path), and hands them to another process
(`llmgw.telemetry.export`) that turns them into the SDK's `ReadableSpan`s and
sends them with the official OTLP exporter.

Not guaranteed: the SDK's span limits (attribute counts and lengths are not
capped; llmgw's spans carry a handful of short attributes), or that spans reach
the collector (see `SpanSink`).
"""

from __future__ import annotations

import contextvars
import logging
import marshal
import random
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from types import TracebackType
from typing import IO, Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    INVALID_SPAN,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TraceState,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.util.types import Attributes, AttributeValue

log = logging.getLogger("llmgw.telemetry")

_PLAIN = (str, bool, int, float)
_UNSET = StatusCode.UNSET.value
_OK = StatusCode.OK.value
_ERROR = StatusCode.ERROR.value
# `RecordedSpan._as_current` flags.
_CURRENT, _END, _RECORD, _SET_STATUS = 1, 2, 4, 8
# marshal's newest format (both ends of the pipe run this interpreter).
_MARSHAL_VERSION = 4
_TRACE_ID_LIMIT = TraceIdRatioBased.TRACE_ID_LIMIT
# Trace flags, made once: sampled or not, with the W3C "random trace id" bit or not.
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
_NOT_SAMPLED_RANDOM = TraceFlags(TraceFlags.RANDOM_TRACE_ID)
# A frame on the pipe to the export process: a 4-byte length, then one marshalled
# list of records (the pipe is written by this process only, read by a child running
# the same interpreter). One `marshal.dumps` a batch, in the sink's thread: a third
# less CPU than one `pickle.dumps` of the same list, and half to read back; a span
# encoded alone when it ended cost the request path 3-4 µs (bench/RESULTS.md).
FRAME = struct.Struct(">I")

# The key the OpenTelemetry API keeps the current span under in a context, learnt
# through the API (the one key of a context that holds only a span).
_SPAN_KEY = next(iter(set_span_in_context(INVALID_SPAN, otel_context.Context())))


def _context_var() -> contextvars.ContextVar[otel_context.Context] | None:
    """The context variable the OpenTelemetry API keeps the current context in (its
    default runtime context), learnt through the API: the variable that holds a
    context just attached. None with another runtime context (OTEL_PYTHON_CONTEXT)."""
    marker = otel_context.Context()
    token = otel_context.attach(marker)
    try:
        found = [var for var, value in contextvars.copy_context().items() if value is marker]
    finally:
        otel_context.detach(token)
    return found[0] if len(found) == 1 else None


# Read directly, the current context costs one call instead of three Python calls
# (`get_current` and the runtime context's); a traced request reads it ten times.
_CONTEXT_VAR = _context_var()

# One recorded span as the export process reads it (plain values only).
# (scope, name, trace_id, span_id, trace_flags, trace_state, parent_id, parent_remote,
#  kind, start, end, attributes, events, links, status_code, status_description)
Record = tuple[Any, ...]


def encode_frame(records: Sequence[Record]) -> bytes:
    """Records as one frame on the pipe (`llmgw.telemetry.export.frames` reads it)."""
    data = marshal.dumps(list(records), _MARSHAL_VERSION)
    return FRAME.pack(len(data)) + data


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Attributes as plain values: str, bool, int, float (exactly those types, as
    marshal wants them), or tuples of them; anything else as its text (the SDK does
    the same)."""
    if not attributes:
        return {}
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        out[key] = value if type(value) in _PLAIN else _value(value)
    return out


def _value(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return tuple(v if type(v) in _PLAIN else _scalar(v) for v in value)
    return _scalar(value)


def _scalar(value: object) -> object:
    """A subclass of a plain type (an enum of ints or texts) as that type's own value
    (what the SDK's encoder sends); anything else as its text."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    return str(value)


class SpanSink:
    """Batches of finished spans, marshalled and written from a thread to the export
    process's stdin.

    `add` is a deque append (no lock: the deque's appends and the thread's pops are
    atomic, so a span added while a batch is taken is never lost). The thread wakes every
    `delay` seconds, or as soon as `batch` spans wait, and writes what is there as
    frames of at most `batch` records; more than `max_queue` waiting spans are
    dropped (counted, logged), never waited for. When the export process is gone,
    spans are dropped."""

    def __init__(
        self,
        *,
        argv: Sequence[str],
        env: Mapping[str, str],
        delay: float,
        batch: int,
        max_queue: int,
    ) -> None:
        # Records wait as tuples: one of plain values stops being tracked by the
        # garbage collector at the first young collection it meets (its attribute
        # dict of plain values never is), so waiting records do not lengthen full
        # ones; only the rare record with events or links keeps a tracked list.
        self._spans: deque[Record] = deque()
        self._batch = batch
        self._max_queue = max_queue
        self._delay = delay
        self.dropped = 0
        self._wake = threading.Event()
        self._stopping = False
        # The export process ignores Ctrl-C (a terminal's SIGINT reaches the whole
        # group): it ends when its stdin does, after sending what it holds.
        self._proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=dict(env)
        )
        assert self._proc.stdin is not None
        self._pipe: IO[bytes] | None = self._proc.stdin
        self._thread = threading.Thread(target=self._run, name="llmgw-span-sink", daemon=True)
        self._thread.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def add(self, record: Record) -> None:
        """Queue one finished span."""
        spans = self._spans
        if len(spans) >= self._max_queue:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.warning(
                    "tracing: %d spans dropped: more than %d were waiting for the export "
                    "process (raise OTEL_BSP_MAX_QUEUE_SIZE, or sample fewer requests "
                    "with telemetry.sample_ratio)",
                    self.dropped,
                    self._max_queue,
                )
            return
        spans.append(record)
        if len(spans) == self._batch:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._flush()
        self._flush()

    def _flush(self) -> None:
        queue = self._spans
        if not queue:
            return
        # One pop at a time (the request path may append meanwhile).
        pop = queue.popleft
        spans = [pop() for _ in range(len(queue))]
        pipe = self._pipe
        if pipe is None:
            self.dropped += len(spans)
            return
        for start in range(0, len(spans), self._batch):
            frame = self._encode(spans[start : start + self._batch])
            try:
                pipe.write(frame)
                pipe.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                self._pipe = None
                with suppress(OSError):
                    pipe.close()
                self.dropped += len(spans) - start
                log.error(
                    "tracing: the span export process (pid %d) is gone (%s, exit status "
                    "%s): spans are dropped from now on; requests are not affected",
                    self._proc.pid,
                    exc,
                    self._proc.poll(),
                )
                return

    def _encode(self, records: list[Record]) -> bytes:
        """`records` as one frame; a record marshal cannot write (a value of a type
        other than the plain ones, say a span's status description) is dropped and
        counted, not the batch."""
        try:
            return encode_frame(records)
        except ValueError:
            kept = []
            for record in records:
                try:
                    marshal.dumps(record, _MARSHAL_VERSION)
                except ValueError:
                    self.dropped += 1
                    log.warning("tracing: span %r dropped: a value is not plain data", record[1])
                else:
                    kept.append(record)
            return encode_frame(kept)

    def shutdown(self, timeout: float) -> None:
        """Send what is left, close the pipe and wait up to `timeout` seconds for the
        export process to send it on (it is killed after that)."""
        self._stopping = True
        self._wake.set()
        # The thread sends what is left; a write blocks while the export process is not
        # reading (its collector down, its exporter retrying with backoff).
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                "tracing: the span export process did not take the last spans within %gs "
                "(is the collector down?); stopped",
                timeout,
            )
            self._proc.kill()  # the blocked write fails; the thread drops the rest
            self._thread.join()
        self._flush()
        if self._pipe is not None:
            with suppress(OSError):
                self._pipe.close()
            self._pipe = None
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning(
                "tracing: the span export process did not finish within %gs; stopped", timeout
            )
            self._proc.kill()
            self._proc.wait()
        if self.dropped:
            log.warning("tracing: %d spans were dropped in all", self.dropped)


class RecordedSpan(Span):
    """A sampled span: its data in slots until it ends, then one record for the sink.

    Its `SpanContext` is built only when asked for (a child under it, a `traceparent`,
    a log line): a span nobody asks about (auth, route) never builds one."""

    __slots__ = (
        "_as_current",
        "_attributes",
        "_context",
        "_description",
        "_ended",
        "_events",
        "_flags",
        "_kind",
        "_links",
        "_name",
        "_parent_id",
        "_parent_remote",
        "_scope",
        "_sink",
        "_span_id",
        "_start",
        "_state",
        "_status",
        "_token",
        "_trace_id",
    )

    def __init__(
        self,
        sink: SpanSink,
        scope: str,
        name: str,
        trace_id: int,
        span_id: int,
        flags: TraceFlags,
        state: TraceState | None,
        parent_id: int,
        parent_remote: bool,
        kind: int,
        start: int,
        attributes: dict[str, Any],
        links: list[Any] | None,
    ) -> None:
        self._sink = sink
        self._scope = scope
        self._name = name
        self._trace_id = trace_id
        self._span_id = span_id
        self._flags = flags
        self._state = state
        self._context: SpanContext | None = None
        self._parent_id = parent_id
        self._parent_remote = parent_remote
        self._kind = kind
        self._start = start
        self._attributes = attributes
        self._events: list[Any] | None = None
        self._links = links
        self._status = _UNSET
        self._description: str | None = None
        self._ended = False
        # `start_as_current_span`'s options (_CURRENT | ...); 0: a plain `with span`.
        self._as_current = 0
        self._token: object = None

    def __enter__(self) -> RecordedSpan:
        if self._as_current & _CURRENT:
            self._token = otel_context.attach(set_span_in_context(self))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        options = self._as_current
        if not options:
            self.end()
            return
        # As the SDK's `use_span`.
        try:
            if exc_val is not None and not self._ended:
                if options & _RECORD:
                    self.record_exception(exc_val, escaped=True)
                if options & _SET_STATUS:
                    self.set_status(
                        Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}")
                    )
        finally:
            if options & _CURRENT:
                otel_context.detach(self._token)  # type: ignore[arg-type]
            if options & _END:
                self.end()

    @property
    def trace_id(self) -> int:
        return self._trace_id

    def w3c_headers(self) -> list[tuple[bytes, bytes]]:
        """`traceparent` (and `tracestate`) naming this span, as the W3C propagator
        writes them, without building its `SpanContext`."""
        headers = [
            (b"traceparent", b"00-%032x-%016x-%02x" % (self._trace_id, self._span_id, self._flags))
        ]
        state = self._state
        if state:
            headers.append((b"tracestate", state.to_header().encode("latin-1")))
        return headers

    def get_span_context(self) -> SpanContext:
        context = self._context
        if context is None:
            context = self._context = SpanContext(
                self._trace_id,
                self._span_id,
                is_remote=False,
                trace_flags=self._flags,
                trace_state=self._state,
            )
        return context

    def is_recording(self) -> bool:
        return not self._ended

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if not self._ended:
            self._attributes[key] = value if type(value) in _PLAIN else _value(value)

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if not self._ended:
            own = self._attributes
            for key, value in attributes.items():
                own[key] = value if type(value) in _PLAIN else _value(value)

    def add_event(
        self, name: str, attributes: Attributes = None, timestamp: int | None = None
    ) -> None:
        if self._ended:
            return
        if self._events is None:
            self._events = []
        self._events.append((name, timestamp or time.time_ns(), _clean(attributes)))

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        if self._ended or not context.is_valid:
            return
        if self._links is None:
            self._links = []
        self._links.append(_link(context, attributes))

    def update_name(self, name: str) -> None:
        if not self._ended:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # As the SDK: OK is final, UNSET changes nothing, a description goes with ERROR.
        if self._ended or self._status == _OK:
            return
        if isinstance(status, Status):
            code, description = status.status_code.value, status.description
        else:
            code = status.value
        if code == _UNSET:
            return
        self._status = code
        self._description = description if code == _ERROR else None

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        stack = "".join(traceback.format_exception(exception))
        found: dict[str, Any] = {
            "exception.type": type(exception).__name__,
            "exception.message": str(exception),
            "exception.stacktrace": stack,
            "exception.escaped": str(escaped),
        }
        if attributes:
            found.update(attributes)
        self.add_event("exception", found, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        state = self._state
        self._sink.add(
            (
                self._scope,
                self._name,
                self._trace_id,
                self._span_id,
                int(self._flags),
                state.to_header() if state else "",
                self._parent_id,
                self._parent_remote,
                self._kind,
                self._start,
                end_time or time.time_ns(),
                self._attributes,
                self._events or (),
                self._links or (),
                self._status,
                self._description,
            )
        )


def _link(context: SpanContext, attributes: Attributes) -> tuple[Any, ...]:
    return (context.trace_id, context.span_id, int(context.trace_flags), _clean(attributes))


class _Current(AbstractContextManager[Span]):
    """`start_as_current_span`'s context manager, as the SDK's `use_span` behaves."""

    __slots__ = ("_end", "_record", "_set_status", "_span", "_token")

    def __init__(self, span: Span, end: bool, record: bool, set_status: bool) -> None:
        self._span = span
        self._end = end
        self._record = record
        self._set_status = set_status
        self._token: object = None

    def __enter__(self) -> Span:
        self._token = otel_context.attach(set_span_in_context(self._span))
        return self._span

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self._span
        try:
            if exc is not None and span.is_recording():
                if self._record:
                    span.record_exception(exc, escaped=True)
                if self._set_status:
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        finally:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            if self._end:
                span.end()


def current_span() -> Span:
    """The current span, as `get_current_span()` answers: one read of the context
    variable and one look-up in the context for llmgw's spans (the API's answer takes
    five Python calls and an abstract-base `isinstance`, about 1 µs, and a traced
    request asks eight times)."""
    context = otel_context.get_current() if _CONTEXT_VAR is None else _CONTEXT_VAR.get()
    span = context.get(_SPAN_KEY)
    if span is None:
        return INVALID_SPAN  # as the API answers outside any span
    if type(span) is RecordedSpan or type(span) is NonRecordingSpan:
        return span
    return get_current_span()


class RecordTracer(Tracer):
    """The OpenTelemetry `Tracer` of one instrumentation scope, making `RecordedSpan`s
    for sampled traces and `NonRecordingSpan`s (ids only) for the others."""

    def __init__(self, *, scope: str, sink: SpanSink, sampler: Sampler, ids: IdGenerator) -> None:
        self._scope = scope
        self._sink = sink
        self._sampler = sampler
        self._ids = ids
        # The SDK's default id generator draws from `random.getrandbits`, a Python call
        # each: drawn here directly, the same way (zero, an invalid id, is drawn again).
        self._bits = random.getrandbits if type(ids) is RandomIdGenerator else None
        # Parent-based sampling (the default, and `telemetry.sample_ratio`): a span
        # under a local parent follows it without asking the sampler.
        self._parent_based = isinstance(sampler, ParentBased)
        self._bound = _ratio_bound(sampler)

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        ids = self._ids
        bits = self._bits
        current = current_span() if context is None else get_current_span(context)
        if type(current) is RecordedSpan and self._parent_based:
            # The common case, a child of a local recorded span: no sampler, no
            # SpanContext of the parent built.
            return RecordedSpan(
                self._sink,
                self._scope,
                name,
                current._trace_id,
                (bits(64) if bits is not None else 0) or ids.generate_span_id(),
                current._flags,
                current._state,
                current._span_id,
                False,
                kind._value_,
                start_time or time.time_ns(),
                _clean(attributes),
                [_link(link.context, link.attributes) for link in links] if links else None,
            )
        parent: SpanContext | None = current.get_span_context()
        assert parent is not None
        if parent.is_valid:
            trace_id = parent.trace_id
        else:
            parent = None
            trace_id = (bits(128) if bits is not None else 0) or ids.generate_trace_id()
        extra: Attributes = None
        bound = self._bound
        if parent is not None and not parent.is_remote and self._parent_based:
            flags = parent.trace_flags
            state: TraceState | None = parent.trace_state
        elif bound is not None:
            # The SDK's parent-based ratio sampler with its default delegates, decided
            # as it decides (a remote parent's flag, else the trace id against the
            # ratio's bound) without its result objects.
            if parent is None:
                sampled = trace_id & _TRACE_ID_LIMIT < bound
                state = None
            else:
                sampled = parent.trace_flags.sampled
                state = parent.trace_state
            flags = _SAMPLED if sampled else _NOT_SAMPLED
            random_id = (
                ids.is_trace_id_random() if parent is None else parent.trace_flags.random_trace_id
            )
            if random_id:
                flags = _SAMPLED_RANDOM if sampled else _NOT_SAMPLED_RANDOM
        else:
            result = self._sampler.should_sample(context, trace_id, name, kind, attributes, links)
            sampled = result.decision.is_sampled()  # type: ignore[no-untyped-call]
            flags = TraceFlags(TraceFlags.SAMPLED if sampled else 0)
            random_id = (
                ids.is_trace_id_random() if parent is None else parent.trace_flags.random_trace_id
            )
            if random_id:
                flags = TraceFlags(flags | TraceFlags.RANDOM_TRACE_ID)
            state = result.trace_state
            extra = result.attributes
        span_id = (bits(64) if bits is not None else 0) or ids.generate_span_id()
        if not flags.sampled:
            return NonRecordingSpan(
                SpanContext(
                    trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=state
                )
            )
        found = _clean(attributes)
        if extra:
            found.update(_clean(extra))
        return RecordedSpan(
            self._sink,
            self._scope,
            name,
            trace_id,
            span_id,
            flags,
            state,
            0 if parent is None else parent.span_id,
            parent is not None and parent.is_remote,
            kind._value_,
            start_time or time.time_ns(),
            found,
            [_link(link.context, link.attributes) for link in links] if links else None,
        )

    def start_child(
        self,
        name: str,
        attributes: Attributes = None,
        kind: SpanKind = SpanKind.INTERNAL,
        record_exception: bool = True,
    ) -> AbstractContextManager[Span]:
        """A span under the current one that does not become current itself (no
        context made, attached and detached), for work under which nothing makes
        spans or reads the current span; an exception leaving it is recorded and sets
        its status (with `record_exception`), as with `start_as_current_span`."""
        span = self.start_span(name, None, kind, attributes)
        if type(span) is RecordedSpan:
            span._as_current = _END | (_RECORD | _SET_STATUS if record_exception else 0)
        return span

    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> AbstractContextManager[Span]:
        # Not the API's generator-based context manager: half the cost. A recorded
        # span is its own (no object more for the garbage collector to track).
        span = self.start_span(name, context, kind, attributes, links, start_time)
        if type(span) is RecordedSpan:
            span._as_current = (
                _CURRENT
                | (_END if end_on_exit else 0)
                | (_RECORD if record_exception else 0)
                | (_SET_STATUS if set_status_on_exception else 0)
            )
            return span
        return _Current(span, end_on_exit, record_exception, set_status_on_exception)


def _ratio_bound(sampler: Sampler) -> int | None:
    """The trace-id bound of a parent-based sampler whose root samples by ratio (or
    always, or never) and whose remote-parent delegates are the SDK's defaults (the
    default sampler, `telemetry.sample_ratio`, OTEL_TRACES_SAMPLER=parentbased_*);
    None for any other sampler, which is then asked for every root span."""
    if not isinstance(sampler, ParentBased):
        return None
    if (
        getattr(sampler, "_remote_parent_sampled", None) is not ALWAYS_ON
        or getattr(sampler, "_remote_parent_not_sampled", None) is not ALWAYS_OFF
    ):
        return None
    root = getattr(sampler, "_root", None)
    if root is ALWAYS_ON:
        return _TRACE_ID_LIMIT + 1
    if root is ALWAYS_OFF:
        return 0
    if type(root) is TraceIdRatioBased:
        return root.bound
    return None


def export_argv(*, endpoint: str, service: str) -> list[str]:
    """The command line of the export process (this interpreter, `llmgw.telemetry.export`)."""
    return [sys.executable, "-m", "llmgw.telemetry.export", endpoint, service]


def env_seconds(env: Mapping[str, str], name: str, default_ms: int) -> float:
    """An OTEL_BSP_* duration (milliseconds in the variable) in seconds."""
    return _env_int(env, name, default_ms) / 1000


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        log.warning("tracing: %s=%r is not a whole number; using %d", name, text, default)
        return default
    return value if value > 0 else default


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    """An OTEL_BSP_* count (a positive whole number), or `default`."""
    return _env_int(env, name, default)
