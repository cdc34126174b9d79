"""Tracing settings, the JSON log format, the access log and the `--log-format` flag."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from opentelemetry.context import attach, detach
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    Tracer,
    TraceState,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from otlp_receiver import OtlpReceiver
from procs import wait_for

from llmgw.config import ConfigError, TelemetryConfig, load_server_config
from llmgw.router.access_log import AccessLog
from llmgw.telemetry.export import frames
from llmgw.telemetry.logs import JsonFormatter, log_format
from llmgw.telemetry.propagation import (
    child_span,
    client_trace_headers,
    extract_context,
    trace_headers,
)
from llmgw.telemetry.spans import SpanSink, encode_frame
from llmgw.telemetry.tracing import Tracing, TracingError, build_tracing


def _built(config: TelemetryConfig, env: dict[str, str]) -> str | None:
    tracing = build_tracing(config, service="llmgw-test", env=env)
    if tracing is None:
        return None
    try:
        return tracing.endpoint
    finally:
        tracing.shutdown()


def test_tracing_is_off_without_an_endpoint_and_when_the_sdk_is_disabled() -> None:
    assert _built(TelemetryConfig(), {}) is None
    on = TelemetryConfig(otlp_endpoint="http://127.0.0.1:4318")
    assert _built(on, {"OTEL_SDK_DISABLED": "true"}) is None


def test_the_endpoint_comes_from_the_config_then_the_standard_variables() -> None:
    config = TelemetryConfig(otlp_endpoint="http://collector:4318")
    assert _built(config, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4318"}) == (
        "http://collector:4318/v1/traces"
    )
    # A URL with a path is taken as it is.
    exact = TelemetryConfig(otlp_endpoint="https://collector/otlp/v1/traces")
    assert _built(exact, {}) == "https://collector/otlp/v1/traces"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318/"}
    assert _built(TelemetryConfig(), env) == "http://base:4318/v1/traces"
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "http://traces:4318/v1/traces"
    assert _built(TelemetryConfig(), env) == "http://traces:4318/v1/traces"


def test_a_bad_endpoint_in_the_environment_names_the_setting() -> None:
    with pytest.raises(TracingError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        build_tracing(
            TelemetryConfig(), service="x", env={"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}
        )


def test_the_service_name_and_sample_ratio_are_honoured() -> None:
    config = TelemetryConfig(otlp_endpoint="http://127.0.0.1:4318", sample_ratio=0.0)
    tracing = build_tracing(config, service="llmgw-server", env={"OTEL_SERVICE_NAME": "gw-eu"})
    assert tracing is not None
    try:
        assert tracing.provider.resource.attributes["service.name"] == "gw-eu"
        span = tracing.tracer("t").start_span("x")
        assert not span.is_recording()  # ratio 0: not sampled
        span.end()
        # A client's sampled traceparent is kept (parent-based sampling).
        parent = extract_context(
            [(b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]
        )
        child = tracing.tracer("t").start_span("y", context=parent)
        assert child.is_recording()
        child.end()
    finally:
        tracing.shutdown()


@pytest.mark.parametrize(
    ("config", "env"),
    [
        (TelemetryConfig(otlp_endpoint="http://127.0.0.1:4318", sample_ratio=0.25), {}),
        (
            TelemetryConfig(otlp_endpoint="http://127.0.0.1:4318"),
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.6"},
        ),
        (
            TelemetryConfig(otlp_endpoint="http://127.0.0.1:4318"),
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.4"},
        ),
    ],
)
def test_sampling_decides_as_the_sdks_sampler_for_every_trace(
    config: TelemetryConfig, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK reads OTEL_TRACES_SAMPLER from the process's environment.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    tracing = build_tracing(config, service="llmgw-test", env=env)
    assert tracing is not None
    try:
        sampler = tracing.provider.sampler
        tracer = tracing.tracer("t")
        sampled = 0
        for _ in range(2000):
            span = tracer.start_span("root")
            context = span.get_span_context()
            expected = sampler.should_sample(None, context.trace_id, "root").decision
            assert span.is_recording() == expected.is_sampled(), hex(context.trace_id)
            assert context.trace_flags.sampled == span.is_recording()
            sampled += span.is_recording()
            if span.is_recording():
                # A sampled trace's children follow it.
                # (Not ended: nothing is exported to the collector that is not there.)
                child = tracer.start_span("child", context=set_span_in_context(span))
                assert child.get_span_context().trace_id == context.trace_id
        assert 0 < sampled < 2000
        # A client's flag decides for its trace under a parent-based sampler.
        for flag, recorded in ((b"01", True), (b"00", False)):
            parent = extract_context(
                [(b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-" + flag)]
            )
            span = tracer.start_span("y", context=parent)
            if isinstance(sampler, ParentBased):
                assert span.is_recording() is recorded
    finally:
        tracing.shutdown()


def test_a_child_span_is_not_current_and_the_engine_gets_the_propagators_traceparent() -> None:
    with OtlpReceiver() as receiver:
        tracing = build_tracing(TelemetryConfig(otlp_endpoint=receiver.url), service="t", env={})
        assert tracing is not None
        _child_span_and_headers(tracing.tracer("t"), tracing)
        spans = {s.name: s for s in receiver.spans()}
    # The child not made current is still the root's child, its exception recorded.
    assert spans["auth"].parent_id == spans["root"].span_id
    assert spans["auth"].events() == ["exception"]
    assert spans["auth"].span.status.message == "ValueError: refused"


def _child_span_and_headers(tracer: Tracer, tracing: Tracing) -> None:
    try:
        parent = extract_context(
            [
                (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                (b"tracestate", b"vendor=abc"),
            ]
        )
        with tracer.start_as_current_span("root", context=parent) as root:
            with pytest.raises(ValueError), child_span(tracer, "auth") as auth:
                assert get_current_span() is root
                raise ValueError("refused")
            assert not auth.is_recording()  # ended on the way out
            with tracer.start_as_current_span("upstream") as upstream:
                carrier: dict[str, str] = {}
                TraceContextTextMapPropagator().inject(carrier)
                assert trace_headers() == [
                    (name.encode(), value.encode()) for name, value in carrier.items()
                ]
                context = upstream.get_span_context()
                assert carrier["traceparent"] == (
                    f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
                )
                assert carrier["tracestate"] == "vendor=abc"
    finally:
        tracing.shutdown()


def test_an_unsampled_or_absent_trace_gets_the_propagators_headers() -> None:
    # A request the sampler left out still sends its (not sampled) trace upstream,
    # written here as the W3C propagator writes it; no trace, no headers.
    propagator = TraceContextTextMapPropagator()
    for flags, state in ((0x00, "vendor=abc,other=x"), (0x01, ""), (0x02, "k=v")):
        span = NonRecordingSpan(
            SpanContext(
                0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True,
                trace_flags=TraceFlags(flags), trace_state=TraceState.from_header([state]),
            )
        )  # fmt: skip
        carrier: dict[str, str] = {}
        propagator.inject(carrier, set_span_in_context(span))
        expected = [(name.encode(), value.encode()) for name, value in carrier.items()]
        assert trace_headers(span) == expected
        token = attach(set_span_in_context(span))
        try:
            assert trace_headers() == expected
        finally:
            detach(token)
    assert trace_headers(INVALID_SPAN) == []
    assert trace_headers() == []


def test_a_frame_of_records_reads_back_as_written() -> None:
    # Records sharing their texts, as a request's spans do (pickled once a frame, a
    # text shared by records is written once and read back into each).
    records = [
        (name, name, 0xABC, span_id, 1, "", 0, False, 2, 10, 20,
         {"llmgw.model": "m", "llmgw.replica": f"r{span_id}", "llmgw.name": name},
         (("placed", 15, {"node": "n1"}),), (), 0, None)
        for span_id, name in enumerate(["llmgw.auth", "llmgw.route", "llmgw.upstream"] * 3, 1)
    ]  # fmt: skip
    frame = encode_frame(records)
    stream = io.BytesIO(frame + frame[:-1])
    # The second frame is cut off (the gateway died while writing it): dropped.
    assert list(frames(stream)) == [records]


def test_bad_telemetry_settings_in_a_config_file_name_the_field_and_file(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text("telemetry: {otlp_endpoint: 'collector:4318'}\n")
    with pytest.raises(ConfigError) as caught:
        load_server_config(path, {})
    assert "telemetry.otlp_endpoint" in str(caught.value)
    assert str(path) in str(caught.value)
    path.write_text("telemetry: {sample_ratio: 1.5}\n")
    with pytest.raises(ConfigError, match=r"telemetry\.sample_ratio"):
        load_server_config(path, {})


def test_json_log_lines_carry_the_context_fields_and_the_current_trace() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("llmgw.test.json")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    tracer = TracerProvider().get_tracer("t")
    try:
        logger.info("replica %s is ready", "m-1", extra={"model": "m", "replica": "m-1"})
        with tracer.start_as_current_span("s") as span:
            logger.warning("inside")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    first, inside, failed = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "replica m-1 is ready"
    assert first["level"] == "info" and first["logger"] == "llmgw.test.json"
    assert first["model"] == "m" and first["replica"] == "m-1"
    assert first["time"].endswith("+00:00")
    assert "trace_id" not in first
    assert inside["trace_id"] == f"{span.get_span_context().trace_id:032x}"
    assert "ValueError: boom" in failed["exception"]


def test_a_log_format_other_than_human_or_json_is_refused() -> None:
    assert log_format(" JSON ", source="--log-format") == "json"
    with pytest.raises(ValueError, match="--log-format 'xml': use human or json"):
        log_format("xml", source="--log-format")
    for argv in (["--log-format", "xml", "version"], ["server", "--log-format", "xml"]):
        result = subprocess.run(
            [sys.executable, "-m", "llmgw", *argv],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert "'xml': use human or json" in result.stderr
        assert "Traceback" not in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "llmgw", "version"],
        capture_output=True, text=True, timeout=60, check=False,
        env={"LLMGW_LOG_FORMAT": "yaml", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 2 and "LLMGW_LOG_FORMAT" in result.stderr


def test_the_access_log_samples_successes_and_always_writes_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    draws = iter([0.9, 0.1])
    log = AccessLog(sample=0.5, rng=lambda: next(draws))
    fields = {
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "m",
        "replica": "r-1",
        "key_id": "k1",
        "latency": 0.012,
        "trace_id": None,
    }
    with caplog.at_level(logging.INFO, logger="llmgw.access"):
        log.write(status=200, request_id="a", **fields)  # 0.9: left out
        log.write(status=200, request_id="b", **fields)  # 0.1: written
        log.write(status=503, request_id="c", **fields)  # errors: always
    written = [r.request_id for r in caplog.records]  # type: ignore[attr-defined]
    assert written == ["b", "c"]
    assert "replica=r-1" in caplog.records[0].getMessage()


def test_only_the_trace_context_of_a_clients_headers_is_passed_on() -> None:
    headers = [(b"authorization", b"Bearer sk-x"), (b"traceparent", b"00-a-b-01")]
    assert client_trace_headers(headers) == [(b"traceparent", b"00-a-b-01")]


def test_spans_reach_the_collector_through_the_export_process_with_all_they_say() -> None:
    with OtlpReceiver() as receiver:
        tracing = build_tracing(
            TelemetryConfig(otlp_endpoint=receiver.url),
            service="llmgw-test",
            env={"OTEL_BSP_SCHEDULE_DELAY": "50"},
        )
        assert tracing is not None
        tracer = tracing.tracer("llmgw.test")
        other = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(1))
        try:
            with tracer.start_as_current_span(
                "root", kind=SpanKind.SERVER, attributes={"n": 3, "on": True, "ids": ["a", "b"]}
            ) as root:
                root.set_attribute("ratio", 0.5)
                root.add_link(other, {"why": "activation"})
                with pytest.raises(ValueError), tracer.start_as_current_span("child") as child:
                    child.add_event("placed", {"node": "n1"})
                    raise ValueError("no room")
                # Not the current span: a span started now is the root's child, not its.
                tracer.start_span("sibling").end()
        finally:
            tracing.shutdown()
        spans = {s.name: s for s in receiver.spans()}
    assert set(spans) == {"root", "child", "sibling"}
    root_span, child_span = spans["root"], spans["child"]
    assert {s.service for s in spans.values()} == {"llmgw-test"}
    assert {s.scope for s in spans.values()} == {"llmgw.test"}
    assert root_span.parent_id == ""
    assert root_span.span.kind == root_span.span.SPAN_KIND_SERVER
    assert root_span.attributes == {"n": 3, "on": True, "ids": ["a", "b"], "ratio": 0.5}
    assert root_span.links() == [(f"{0xABC:032x}", f"{0xDEF:016x}")]
    for name in ("child", "sibling"):
        assert spans[name].parent_id == root_span.span_id
        assert spans[name].trace_id == root_span.trace_id
    # An exception leaving a current span: recorded, and the span's status says so.
    assert child_span.events() == ["placed", "exception"]
    assert child_span.span.status.code == child_span.span.status.STATUS_CODE_ERROR
    assert child_span.span.status.message == "ValueError: no room"
    assert root_span.span.start_time_unix_nano <= child_span.span.start_time_unix_nano
    assert child_span.span.end_time_unix_nano <= root_span.span.end_time_unix_nano


def test_a_span_that_cannot_be_encoded_is_dropped_not_its_batch() -> None:
    class Text(str):
        pass

    sink = SpanSink(
        argv=[sys.executable, "-c", "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"],
        env=dict(os.environ),
        delay=3600.0,
        batch=1 << 20,
        max_queue=1 << 20,
    )
    good = ("s", "good", 1, 2, 1, "", 0, False, 3, 10, 20, {"a": "b"}, (), (), 0, None)
    bad = ("s", "bad", 1, 3, 1, "", 0, False, 3, 10, 20, {}, (), (), 2, Text("boom"))
    frame = sink._encode([good, bad, good])
    sink.shutdown(5)
    assert list(frames(io.BytesIO(frame))) == [[good, good]]
    assert sink.dropped == 1


def test_shutdown_stops_an_export_process_that_does_not_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An export process stuck sending to a collector that is down reads nothing: the
    # last batch (more than a pipe holds) cannot be written. Shutdown stops it after
    # its timeout instead of waiting for it for ever.
    sink = SpanSink(
        argv=[sys.executable, "-c", "import time; time.sleep(600)"],
        env=dict(os.environ),
        delay=3600.0,
        batch=1 << 20,
        max_queue=1 << 20,
    )
    for i in range(1, 5001):  # about 1 MB, each record its own
        sink.add(("s", "llmgw.upstream", 1, i, 1, "", 0, False, 3, 10, 20, {"a": f"{i:0200d}"}, (), (), 0, None))  # fmt: skip
    finished = threading.Event()

    def stop() -> None:
        sink.shutdown(0.5)
        finished.set()

    with caplog.at_level(logging.WARNING, logger="llmgw.telemetry"):
        threading.Thread(target=stop, daemon=True).start()
        wait_for(finished.is_set, "the sink's shutdown to return", 60)
    assert sink._proc.returncode == -signal.SIGKILL
    assert sink.dropped == 5000
    messages = [r.getMessage() for r in caplog.records]
    assert any("did not take the last spans" in m for m in messages), messages


def test_spans_are_dropped_not_requests_when_the_export_process_is_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracing = build_tracing(
        TelemetryConfig(otlp_endpoint="http://127.0.0.1:9"),
        service="llmgw-test",
        env={"OTEL_BSP_SCHEDULE_DELAY": "50"},
    )
    assert tracing is not None
    pid = tracing.sink.pid
    os.kill(pid, signal.SIGKILL)

    def dead() -> bool:  # exited (its end of the pipe closed), not yet reaped
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"

    wait_for(dead, "the export process to exit", 30)
    tracer = tracing.tracer("llmgw.test")
    with caplog.at_level(logging.WARNING, logger="llmgw.telemetry"):
        for _ in range(3):
            with tracer.start_as_current_span("lost"):
                pass
        tracing.shutdown()
    assert tracing.sink.dropped == 3
    messages = [r.getMessage() for r in caplog.records]
    assert any("export process" in m and "spans are dropped" in m for m in messages), messages
