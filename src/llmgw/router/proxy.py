"""The upstream proxy: one client request, one or more attempts at engines.

An attempt may be retried on another endpoint only while nothing has reached
the client: connection failures and engine 429/502/503/504 move on, everything
else is answered. Deadlines are per phase, enforced by one `asyncio.timeout`
that is rescheduled as the attempt moves on: connect (the upstream client's
connect timeout), first byte (engine queue + prefill; for a non-streaming answer the
first byte is the whole answer, so `total` bounds it), idle between stream
chunks, and total. A stream that fails after its first byte is handed to the
`Continuation` (`llmgw.router.continuation`), which resumes it on another replica
when it can; otherwise it ends with an SSE `error` event and is closed. It is
never retried whole.

With an `Activator` (a control plane), a request for a catalog model that finds
no replica to use waits as in an activation instead of failing: when the model
has no replica in the pool, when none of its replicas passes health checks, and
when every replica it tried died before the first byte (connection refused or
lost). It waits until a replica it has not just seen fail is in the pool (a
replica that failed is tried again after a short pause, since the failure may
have been its own), up to the activation timeout, with SSE comments keeping a
stream alive; a stream whose headers went out while it waited names its replica
in an SSE comment (`: llmgw replica ID`), since the `x-llmgw-replica` header
was sent before a replica was chosen.

A request already sent to an engine whose node then misses its heartbeats (a
frozen or cut-off node: nothing closes the connection) is moved as soon as the
control plane says so (`EndpointPool.abandon`), if no byte of the answer has
reached the client yet; a stream that began is continued then, when it can be.

A request of another client API (Messages, Responses) carries both its
translation and its own body (`ParsedRequest.native`); each attempt sends the
body as is to the API's own path when the endpoint serves that API natively
(`Endpoint.native_apis`), the translation otherwise, and reads the usage from
whichever answer comes back. A request only a native engine can serve is
routed among those only.

Errors name replicas by id, never by address: the router's own messages are
made without the URL (the upstream client's errors carry none), an engine's
error answer has the endpoint's URL, host:port and host replaced by
`<replica ID>`, and each failure is logged with the URL for operators (the admin
API and the dashboard show it too).

With a tracer (tracing on), the request's trace gets a span for its wait in
the queue, for the wait for an activation (linked to the activation's own trace
by the control plane), for each routing choice (the chosen replica and its
scores), for each attempt at an engine (replica, retry reason, TTFT, tokens) and
for each continuation of a stream that broke (made by the `Continuation`);
each attempt sends the engine a `traceparent` naming its span, so an engine that
traces (vLLM with an OTLP endpoint) joins the trace. Without a tracer, a client's
own `traceparent`/`tracestate` go to the engine as they came.

Not guaranteed: an engine that received a request and then failed may have
done work for it before the retry. Nor that an engine's own words inside a
stream that began (its SSE `error` events) carry no address: streams are
relayed as the engine wrote them. On a standby server (which does not lead the
control plane) such a request waits for its engine up to the first-byte
deadline: only the leader abandons attempts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context, get_current
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from llmgw.config import RouterConfig
from llmgw.engines import UnknownEngine, routes_of
from llmgw.engines.routes import display_name
from llmgw.metrics import RouterMetrics
from llmgw.metrics.router import RequestSeries
from llmgw.router.activation import Activator
from llmgw.router.balancer import Balancer
from llmgw.router.continuation import Continuation
from llmgw.router.endpoints import Endpoint, EndpointPool, FirstByteWait
from llmgw.router.errors import (
    DeadlineExceeded,
    EngineError,
    EngineUnreachable,
    ModelNotFound,
    ModelUnavailable,
    NoHealthyEndpoint,
    RouteNotServed,
    RouterError,
    engine_error_message,
)
from llmgw.router.ids import is_uuid, new_request_id
from llmgw.router.queue import QueueRefused, RequestQueue, Ticket
from llmgw.router.requests import ParsedRequest
from llmgw.router.saturation import Saturation
from llmgw.router.scoring import RouteRequest
from llmgw.router.sse import NativeRelay, SSERelay
from llmgw.router.upstream import (
    EVENT_STREAM,
    RECHECK_FIRST,
    RECHECK_MAX,
    RETRY_STATUSES,
    ConnectFailed,
    Disconnected,
    Response,
    Upstream,
    UpstreamError,
)
from llmgw.router.usage_scan import find_usage
from llmgw.telemetry.propagation import child_span, trace_headers
from llmgw.telemetry.spans import current_span

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("llmgw.router.proxy")

# Failures that mean the engine is gone, not busy: worth waiting for a replacement.
_ENGINE_GONE = frozenset({"connect", "disconnect", "abandoned"})
_JSON = b"application/json"
# A client's W3C trace context, passed to the engine when this gateway does not trace.
_TRACE_CONTEXT = frozenset({b"traceparent", b"tracestate"})


class _Retryable(Exception):
    """An attempt failed before anything reached the client; another endpoint may do."""

    def __init__(self, error: RouterError, kind: str, *, counts_as_failure: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.kind = kind
        self.counts_as_failure = counts_as_failure


class _NoReplicaLeft(Exception):
    """Nothing was sent, and no replica of the model can take the request now:
    none passes health checks, or each one tried lost its engine."""

    def __init__(self, error: RouterError, failed: frozenset[str]) -> None:
        super().__init__(error.message)
        self.error = error
        self.failed = failed


# nginx's code for "the client closed the connection before the answer was complete".
CLIENT_CLOSED = 499


@dataclass(slots=True)
class Outcome:
    status: int
    endpoint: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft: float | None = None
    # Seconds the request waited in the router's queue.
    queued: float = 0.0
    # Times its stream was continued on another replica.
    continued: int = 0
    # The model version its endpoint runs (a canary's or the model's own; "" without one).
    version: str = ""


class Proxy:
    def __init__(
        self,
        *,
        pool: EndpointPool,
        balancer: Balancer,
        upstream: Upstream,
        metrics: RouterMetrics,
        config: RouterConfig,
        clock: Callable[[], float],
        activator: Activator | None = None,
        activation_keepalive: float = 5.0,
        activation_timeout: float = 600.0,
        queue: RequestQueue | None = None,
        saturation: Saturation | None = None,
        tracer: Tracer | None = None,
        continuation: Continuation | None = None,
    ) -> None:
        """`activation_timeout` bounds how long a request waits for a replica in
        all (the activator's own wait included). With a `queue`, a request with a
        `Ticket` first waits its turn there while its model is saturated, and with
        `saturation` the balancer picks among replicas with room. `tracer`: spans
        for the request's steps (None: tracing off). With a `continuation`, streams
        whose engine fails mid-stream are continued."""
        self._tracer = tracer
        self._continuation = continuation
        self._queue = queue
        self._saturation = saturation
        self._activator = activator
        self._keepalive = activation_keepalive
        self._activation_timeout = activation_timeout
        self._pool = pool
        self._balancer = balancer
        self._upstream = upstream
        self._metrics = metrics
        self._attempts = config.attempts
        self._retry_after = config.retry_after
        self._first_byte = config.timeouts.first_byte
        self._idle = config.timeouts.idle
        self._total = config.timeouts.total
        self._clock = clock

    async def handle(
        self,
        req: ParsedRequest,
        request_id: bytes,
        send: Send,
        start: float,
        extra_headers: list[tuple[bytes, bytes]],
        *,
        ticket: Ticket | None = None,
    ) -> Outcome:
        """Serve `req`; RouterError when nothing was sent and the client gets an error.

        With a queue and a `ticket`, the request first waits its turn while its
        model is saturated; a stream gets SSE comments meanwhile, and once its
        headers went out every failure is an SSE `error` event."""
        queue = self._queue
        if queue is None or ticket is None:
            return await self._serve(req, request_id, send, start, extra_headers)
        started = False

        async def keepalive(waiting: int) -> None:
            nonlocal started
            if not started:
                await send(_stream_start(200, request_id, extra_headers))
                started = True
            comment = f": llmgw queued for model {req.model} ({waiting} waiting)\n\n".encode()
            await send({"type": "http.response.body", "body": comment, "more_body": True})

        activator = self._activator
        if activator is not None:
            # A queued request is demand too: target_in_flight scales up for it.
            activator.request_started(req.model)
            self._tell_if_full(activator, req.model)
        try:
            wait = queue.wait_turn(
                req.model,
                ticket,
                keepalive=keepalive if req.stream else None,
                interval=self._keepalive,
                tokens=lambda: req.prompt_tokens_estimate() + _max_tokens(req.body),
            )
            tracer = self._recording()
            if tracer is None:
                waited = await wait
            else:
                # A span only for a request that waited (or was refused): most pass at
                # once, and a span costs more than the check (bench/RESULTS.md).
                began = time.time_ns()
                try:
                    waited = await wait
                except QueueRefused as exc:
                    _queue_span(tracer, req.model, ticket, began, exc.code)
                    raise
                if waited > 0:
                    _queue_span(tracer, req.model, ticket, began, None)
        except QueueRefused as exc:
            if not started:
                raise
            await _send_error_event(send, exc)
            return Outcome(exc.status, "none")
        finally:
            # `_serve` counts it again at once (no await in between).
            if activator is not None:
                activator.request_finished(req.model)
        # No await between the queue letting the request out and its dispatch.
        try:
            if not started:
                outcome = await self._serve(req, request_id, send, start, extra_headers)
            else:
                try:
                    outcome = await self._serve(
                        req, request_id, _HeadersSent(send), start, extra_headers
                    )
                except RouterError as exc:
                    await _send_error_event(send, exc)
                    outcome = Outcome(exc.status, exc.endpoint_id or "none")
        finally:
            queue.done(req.model, ticket.key)
        outcome.queued = waited
        return outcome

    async def _serve(
        self,
        req: ParsedRequest,
        request_id: bytes,
        send: Send,
        start: float,
        extra_headers: list[tuple[bytes, bytes]],
    ) -> Outcome:
        activator = self._activator
        if activator is None:
            try:
                return await self._dispatch(req, request_id, send, start, extra_headers)
            except _NoReplicaLeft as exc:
                raise exc.error from None
        activator.request_started(req.model)
        self._tell_if_full(activator, req.model)
        try:
            if not self._pool.by_model.get(req.model) and activator.knows(req.model):
                _check_engines(req, activator.engines(req.model))
                return await self._wait_then_dispatch(
                    activator, req, request_id, send, start, extra_headers, failed=frozenset()
                )
            try:
                return await self._dispatch(req, request_id, send, start, extra_headers)
            except _NoReplicaLeft as exc:
                if not activator.knows(req.model):
                    raise exc.error from None
                return await self._wait_then_dispatch(
                    activator, req, request_id, send, start, extra_headers, failed=exc.failed
                )
        finally:
            activator.request_finished(req.model)

    def _tell_if_full(self, activator: Activator, model: str) -> None:
        """Tell the control plane when every replica of `model` is full (it may add one:
        an adapter is loaded on one more replica of its base)."""
        saturation = self._saturation
        if saturation is not None and saturation.may_saturate and saturation.room(model) <= 0:
            activator.saturated(model)

    async def _wait_then_dispatch(
        self,
        activator: Activator,
        req: ParsedRequest,
        request_id: bytes,
        send: Send,
        start: float,
        extra_headers: list[tuple[bytes, bytes]],
        *,
        failed: frozenset[str],
    ) -> Outcome:
        """Wait for a replica to use, then serve; a stream gets SSE comments meanwhile.

        Once a stream's headers went out (after the first keep-alive interval), every
        later failure is an SSE `error` event, as for any stream that already began.
        """
        deadline = self._clock() + self._activation_timeout
        started = False
        while True:
            waiting = asyncio.ensure_future(
                self._replica_for(activator, req.model, failed, deadline)
            )
            try:
                if req.stream:
                    while not waiting.done():
                        await asyncio.wait({waiting}, timeout=self._keepalive)
                        if waiting.done():
                            break
                        if not started:
                            await send(_stream_start(200, request_id, extra_headers))
                            started = True
                        comment = f": llmgw {activator.activity(req.model)}\n\n".encode()
                        await send(
                            {"type": "http.response.body", "body": comment, "more_body": True}
                        )
                try:
                    await waiting
                except ModelUnavailable as exc:
                    if not started:
                        raise
                    await _send_error_event(send, exc)
                    return Outcome(exc.status, "none")
            finally:
                # The client went away (or we were cancelled): stop waiting, not the activation.
                waiting.cancel()
            target = _HeadersSent(send) if started else send
            error: RouterError
            try:
                return await self._dispatch(req, request_id, target, start, extra_headers)
            except _NoReplicaLeft as exc:
                now = self._clock()
                if now < deadline:
                    # The replica it waited for died too: wait again, within the same bound.
                    failed = exc.failed
                    continue
                error = self._no_replica_in_time(
                    req.model, self._pool.by_model.get(req.model) or [], now, exc.error
                )
            except RouterError as exc:
                error = exc
            if not started:
                raise error
            await _send_error_event(send, error)
            return Outcome(error.status, error.endpoint_id or "none")

    async def _replica_for(
        self, activator: Activator, model: str, failed: frozenset[str], deadline: float
    ) -> None:
        """Return once the pool has a replica of `model` worth trying: one that passes
        health checks and did not just fail this request (`failed`, forgotten after
        each pause). With none in the pool, the activator starts one and waits.
        Raises ModelUnavailable (the activator's reason, or the deadline)."""
        pause = RECHECK_FIRST
        activated = False
        while True:
            now = self._clock()
            endpoints = self._pool.by_model.get(model)
            if endpoints and any(e.available(now) and e.id not in failed for e in endpoints):
                return
            if now >= deadline:
                raise self._no_replica_in_time(model, endpoints or [], now)
            # Right after an activation the pool may have lost the replica again:
            # pause before asking once more rather than spin.
            if not endpoints and not activated:
                try:
                    async with asyncio.timeout_at(deadline):
                        tracer = self._recording()
                        if tracer is None:
                            await activator.activate(model)
                        else:
                            # The control plane links this span to the activation's trace.
                            with tracer.start_as_current_span(
                                "llmgw.activation.wait", attributes={"llmgw.model": model}
                            ):
                                await activator.activate(model)
                except TimeoutError:
                    raise self._no_replica_in_time(model, [], self._clock()) from None
                activated = True
            else:
                await asyncio.sleep(min(pause, deadline - now))
                pause = min(pause * 2, RECHECK_MAX)
                activated = False
            failed = frozenset()

    def _no_replica_in_time(
        self,
        model: str,
        endpoints: list[Endpoint],
        now: float,
        last: RouterError | None = None,
    ) -> ModelUnavailable:
        if last is not None:
            state = f"last: {last.message}"
        elif endpoints:
            why = "; ".join(
                f"{e.id}: {e.last_error or 'failing health checks'}"
                for e in endpoints
                if not e.available(now)
            )
            state = f"its replicas fail ({why})" if why else "its replicas keep failing"
        else:
            state = "no replica is ready"
        return ModelUnavailable(
            f"model '{model}' has no replica to serve the request after waiting "
            f"{self._activation_timeout:g} s ({state}); retry later",
            code="activation_timeout",
            retry_after=self._retry_after,
        )

    async def _dispatch(
        self,
        req: ParsedRequest,
        request_id: bytes,
        send: Send,
        start: float,
        extra_headers: list[tuple[bytes, bytes]],
    ) -> Outcome:
        endpoints = self._pool.by_model.get(req.model)
        if endpoints is None:
            raise ModelNotFound(
                f"model '{req.model}' is not served here; GET /v1/models lists the models",
                param="model",
            )
        endpoints = _serving(req, endpoints)
        native = req.native
        if native is not None and native.required is not None:
            # Only an engine serving the API itself can take what translation cannot.
            endpoints = [e for e in endpoints if native.api in e.native_apis]
            if not endpoints:
                raise native.required
        if self._saturation is not None:
            # Replicas with room (all of them when none has room).
            endpoints = self._saturation.with_room(req.model, endpoints)
        engine_model = self._pool.aliases.get(req.model)
        if engine_model is not None:
            req.send_as(engine_model)
        route = self._balancer.route(req, req.headers, req.key_id)
        tried: list[Endpoint] = []
        failure: RouterError | None = None
        # Replicas whose engine was gone, and whether any failure was something else.
        gone: set[str] = set()
        other = False
        tracer = self._recording()
        for attempt in range(self._attempts):
            if tracer is None:
                endpoint = self._balancer.pick(endpoints, tried, route)
            else:
                endpoint = self._traced_pick(tracer, endpoints, tried, route)
            if endpoint is None:
                break
            headers = extra_headers
            if route.explanation:
                headers = [*extra_headers, (b"x-llmgw-route", route.explanation.encode())]
            if tried:
                self._metrics.retries.labels(req.model).inc()
            tried.append(endpoint)
            endpoint.in_flight += 1
            timing = _Timing(
                sent=self._clock(), trace_parent=None if tracer is None else get_current()
            )
            try:
                if tracer is None:
                    outcome = await self._attempt(
                        endpoint, req, request_id, send, start, headers, timing
                    )
                else:
                    outcome = await self._traced_attempt(
                        tracer, attempt, endpoint, req, request_id, send, start, headers, timing
                    )
            except _Retryable as exc:
                self._metrics.upstream_errors.labels(endpoint.id, exc.kind).inc()
                log.info(
                    "request %s to %s: endpoint %s at %s failed before answering (%s)",
                    request_id.decode("latin-1"),
                    req.model,
                    endpoint.id,
                    endpoint.url,
                    exc.error.message,
                    extra=_log_context(request_id, req.model, endpoint.id),
                )
                if exc.counts_as_failure:
                    endpoint.record_failure(exc.error.message)
                failure = exc.error
                failure.endpoint_id = endpoint.id
                if exc.kind in _ENGINE_GONE:
                    gone.add(endpoint.id)
                else:
                    other = True
                continue
            finally:
                endpoint.in_flight -= 1
            first = timing.first_byte
            self._balancer.served(
                route,
                endpoint,
                None if first is None else first - timing.sent,
                self._clock() - timing.sent,
            )
            return outcome
        if failure is not None:
            if other:
                raise failure
            raise _NoReplicaLeft(failure, frozenset(gone))
        raise _NoReplicaLeft(
            NoHealthyEndpoint(
                f"no healthy replica of model '{req.model}' right now "
                f"({len(endpoints)} known, none passing health checks); retry later",
                retry_after=self._retry_after,
            ),
            frozenset(),
        )

    def _recording(self) -> Tracer | None:
        """The tracer, when this request's trace is recorded (sampled); else None: an
        unsampled request's spans would record nothing and cost as much to make."""
        tracer = self._tracer
        if tracer is None or not current_span().is_recording():
            return None
        return tracer

    def _traced_pick(
        self,
        tracer: Tracer,
        endpoints: list[Endpoint],
        tried: list[Endpoint],
        route: RouteRequest,
    ) -> Endpoint | None:
        # Not the current span: nothing under it makes spans or reads the context.
        with tracer.start_span(
            "llmgw.route",
            attributes={
                "llmgw.model": route.model,
                "llmgw.route.candidates": len(endpoints) - len(tried),
            },
        ) as span:
            route.chosen_scores = {}
            endpoint = self._balancer.pick(endpoints, tried, route)
            if endpoint is None:
                span.set_attribute("llmgw.route.chosen", "none")
                return None
            chosen: dict[str, AttributeValue] = {"llmgw.route.chosen": endpoint.id}
            for name, value in route.chosen_scores.items():
                chosen[f"llmgw.route.score.{name}"] = value
            span.set_attributes(chosen)
            return endpoint

    async def _traced_attempt(
        self,
        tracer: Tracer,
        attempt: int,
        endpoint: Endpoint,
        req: ParsedRequest,
        request_id: bytes,
        send: Send,
        start: float,
        headers: list[tuple[bytes, bytes]],
        timing: _Timing,
    ) -> Outcome:
        """`_attempt` in a client span: replica, attempt number, retry reason, TTFT
        and tokens; the engine gets this span as its parent (`traceparent`)."""
        with child_span(
            tracer,
            "llmgw.upstream",
            {
                "llmgw.replica": endpoint.id,
                "llmgw.attempt": attempt + 1,
                "llmgw.engine": endpoint.engine or "unknown",
            },
            kind=SpanKind.CLIENT,
            record_exception=False,
        ) as span:
            timing.span = span
            try:
                outcome = await self._attempt(
                    endpoint, req, request_id, send, start, headers, timing
                )
            except _Retryable as exc:
                span.set_attribute("llmgw.retry_reason", exc.kind)
                span.set_status(StatusCode.ERROR, exc.error.message)
                raise
            except RouterError as exc:
                span.set_attribute("http.response.status_code", exc.status)
                span.set_status(StatusCode.ERROR, exc.message)
                raise
            answer: dict[str, AttributeValue] = {
                "http.response.status_code": outcome.status,
                "llmgw.prompt_tokens": outcome.prompt_tokens,
                "llmgw.completion_tokens": outcome.completion_tokens,
            }
            if outcome.ttft is not None:
                answer["llmgw.ttft_s"] = outcome.ttft
            span.set_attributes(answer)
            if outcome.status >= 400:
                span.set_status(StatusCode.ERROR)
            return outcome

    async def _attempt(
        self,
        endpoint: Endpoint,
        req: ParsedRequest,
        request_id: bytes,
        send: Send,
        start: float,
        extra_headers: list[tuple[bytes, bytes]],
        timing: _Timing | None = None,
    ) -> Outcome:
        total_deadline = start + self._total
        first_limit = self._first_byte if req.stream else self._total
        phase = "first byte" if req.stream else "total"
        resp: Response | None = None
        done = False
        wait: FirstByteWait | None = None
        try:
            try:
                async with asyncio.timeout_at(
                    min(self._clock() + first_limit, total_deadline)
                ) as first_byte:
                    wait = self._pool.wait_first_byte(endpoint.id, first_byte)
                    try:
                        resp = await self._post(
                            endpoint, req, request_id, None if timing is None else timing.span
                        )
                        if resp.status >= 400:
                            raise await self._engine_error(endpoint, resp)
                        streaming = req.stream and resp.content_type == EVENT_STREAM
                        # For a stream the first chunk is the first byte; otherwise the body.
                        data = await (resp.next_chunk() if streaming else resp.read())
                        if streaming and timing is not None:
                            timing.first_byte = self._clock()
                    finally:
                        self._pool.first_byte_done(wait)
            except TimeoutError as exc:
                if wait is not None and wait.abandoned:
                    raise _Retryable(
                        EngineUnreachable(
                            f"engine of endpoint '{endpoint.id}' stopped answering (its node "
                            "missed its heartbeats) before the first byte"
                        ),
                        "abandoned",
                        counts_as_failure=False,
                    ) from exc
                if self._clock() >= total_deadline:
                    phase = "total"
                self._metrics.upstream_errors.labels(
                    endpoint.id, f"timeout_{phase.replace(' ', '_')}"
                ).inc()
                endpoint.record_failure(f"no answer within the {phase} deadline")
                limit = self._total if phase == "total" else self._first_byte
                log.warning(
                    "request %s to %s: endpoint %s at %s did not answer within the %s "
                    "deadline of %gs",
                    request_id.decode("latin-1"),
                    req.model,
                    endpoint.id,
                    endpoint.url,
                    phase,
                    limit,
                    extra=_log_context(request_id, req.model, endpoint.id),
                )
                raise DeadlineExceeded(
                    f"endpoint '{endpoint.id}' did not answer within the {phase} deadline "
                    f"of {limit:g}s"
                ) from exc
            except UpstreamError as exc:
                raise _Retryable(
                    EngineUnreachable(
                        f"engine of endpoint '{endpoint.id}' failed before answering: {exc}"
                    ),
                    "disconnect",
                    counts_as_failure=True,
                ) from exc
            if streaming:
                outcome = await self._relay_stream(
                    endpoint,
                    req,
                    request_id,
                    send,
                    resp,
                    data,
                    total_deadline,
                    start,
                    extra_headers,
                    None if timing is None else timing.trace_parent,
                )
            else:
                outcome = await self._send_whole(
                    endpoint, req, request_id, send, resp, data, start, extra_headers
                )
            done = True
            return outcome
        finally:
            if resp is not None:
                if done:
                    resp.release()
                else:
                    # Closing (not pooling) the connection tells the engine to stop.
                    resp.close()

    async def _post(
        self, endpoint: Endpoint, req: ParsedRequest, request_id: bytes, span: Span | None = None
    ) -> Response:
        native = req.native
        req.served_natively = native is not None and native.api in endpoint.native_apis
        if req.served_natively:
            assert native is not None
            path, body = native.path, native.body
        else:
            path = endpoint.path_for(req.path) or req.path
            body = req.upstream_body if path == req.path else req.body_for(path)
        headers: tuple[tuple[bytes, bytes], ...] = (
            (b"Content-Type", req.content_type),
            (b"X-Request-Id", _upstream_id(request_id)),
        )
        if self._tracer is not None:
            # The attempt's span (or, not sampled, the request's): the engine's spans
            # become its children.
            headers += tuple(trace_headers(span))
        else:
            for name, value in req.headers:
                if name in _TRACE_CONTEXT:
                    headers += ((name, value),)
        try:
            return await self._upstream.request(b"POST", endpoint.url, path, body, headers)
        except (ConnectFailed, Disconnected) as exc:
            raise _Retryable(
                EngineUnreachable(f"engine of endpoint '{endpoint.id}' is unreachable: {exc}"),
                "connect",
                counts_as_failure=True,
            ) from exc

    async def _send_whole(
        self,
        endpoint: Endpoint,
        req: ParsedRequest,
        request_id: bytes,
        send: Send,
        resp: Response,
        body: bytes,
        start: float,
        extra_headers: list[tuple[bytes, bytes]],
    ) -> Outcome:
        endpoint.record_success()
        series = self._metrics.series(req.model, endpoint.id)
        prompt, completion = self._record_usage(series, find_usage(body))
        series.latency.observe(self._clock() - start)
        await send(
            {
                "type": "http.response.start",
                "status": resp.status,
                "headers": [
                    (b"content-type", resp.header(b"content-type") or _JSON),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-request-id", request_id),
                    (b"x-llmgw-replica", endpoint.id.encode()),
                    *extra_headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return Outcome(resp.status, endpoint.id, prompt, completion, version=endpoint.version)

    async def _engine_error(self, endpoint: Endpoint, resp: Response) -> RouterError | _Retryable:
        raw = self._without_address(await resp.read(), endpoint)
        error = EngineError(
            engine_error_message(resp.status, raw), status=resp.status, raw_body=raw
        )
        kind = f"status_{resp.status}"
        if resp.status in RETRY_STATUSES:
            return _Retryable(error, kind, counts_as_failure=resp.status != 429)
        self._metrics.upstream_errors.labels(endpoint.id, kind).inc()
        if resp.status >= 500:
            endpoint.record_failure(error.message)
        error.endpoint_id = endpoint.id
        return error

    def _without_address(self, raw: bytes, endpoint: Endpoint) -> bytes:
        """An engine's error answer with its address (URL, host:port, host) replaced by
        `<replica ID>`: an engine, or a proxy in front of it, may name where it runs."""
        origin = self._upstream.origin(endpoint.url)
        host = origin.host.encode()
        if host not in raw:
            return raw
        named = b"<replica " + endpoint.id.encode() + b">"
        for shown in (endpoint.url.rstrip("/").encode(), origin.host_header, host):
            raw = raw.replace(shown, named)
        log.info(
            "endpoint %s at %s answered an error naming its address; clients see the "
            "replica id instead",
            endpoint.id,
            endpoint.url,
        )
        return raw

    async def _relay_stream(
        self,
        endpoint: Endpoint,
        req: ParsedRequest,
        request_id: bytes,
        send: Send,
        resp: Response,
        data: bytes,
        total_deadline: float,
        start: float,
        extra_headers: list[tuple[bytes, bytes]],
        trace_parent: Context | None,
    ) -> Outcome:
        clock = self._clock
        idle = self._idle
        next_chunk = resp.next_chunk
        series = self._metrics.series(req.model, endpoint.id)
        relay: SSERelay | NativeRelay
        if req.served_natively:
            relay = NativeRelay()
        else:
            counting = endpoint.stream_usage is not True
            relay = SSERelay(strip_usage=not req.client_wants_usage, count_tokens=counting)
        continuation = self._continuation
        # What the client was sent, for a continuation to read back (only when one may come).
        sent: list[bytes] | None = [] if continuation and continuation.continuable(req) else None
        last = clock()
        ttft = last - start
        series.ttft.observe(ttft)
        await send(
            _stream_start(
                resp.status,
                request_id,
                [(b"x-llmgw-replica", endpoint.id.encode()), *extra_headers],
            )
        )
        # From here on the client has bytes: a failure is continued or ends the stream.
        watch: FirstByteWait | None = None
        try:
            async with asyncio.timeout_at(min(last + idle, total_deadline)) as deadline:
                if sent is not None:
                    # A node in doubt (`EndpointPool.abandon`) ends a continuable stream now.
                    watch = self._pool.wait_first_byte(endpoint.id, deadline)
                while data:
                    out = relay.feed(data)
                    if out:
                        if sent is not None:
                            sent.append(out)
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    data = await next_chunk()
                    now = clock()
                    series.inter_token.observe(now - last)
                    last = now
                    deadline.reschedule(min(now + idle, total_deadline))
        except TimeoutError:
            phase = "total" if clock() >= total_deadline else "idle"
            resp.close()
            if watch is not None:
                self._pool.first_byte_done(watch)
                if watch.abandoned and phase == "idle":
                    return await self._abandoned(
                        endpoint, req, request_id, send, relay, sent, total_deadline, resp, ttft,
                        trace_parent,
                    )  # fmt: skip
            endpoint.record_failure(f"stream exceeded the {phase} deadline")
            log.warning(
                "request %s to %s: the stream of endpoint %s at %s exceeded the %s deadline",
                request_id.decode("latin-1"),
                req.model,
                endpoint.id,
                endpoint.url,
                phase,
                extra=_log_context(request_id, req.model, endpoint.id),
            )
            if phase == "idle" and sent is not None:
                resumed = await self._continue(
                    req, send, relay, sent, endpoint, "timeout_idle", total_deadline, resp, ttft,
                    trace_parent,
                )  # fmt: skip
                if resumed is not None:
                    return resumed
            await self._end_stream_with_error(
                endpoint,
                send,
                relay,
                f"timeout_{phase}",
                DeadlineExceeded(
                    f"endpoint '{endpoint.id}' stream exceeded the {phase} deadline of "
                    f"{self._total if phase == 'total' else idle:g}s"
                ),
            )
            return self._partial(endpoint, resp, relay, ttft)
        except UpstreamError as exc:
            resp.close()
            if watch is not None:
                self._pool.first_byte_done(watch)
            endpoint.record_failure(str(exc))
            log.warning(
                "request %s to %s: the stream of endpoint %s at %s broke off: %s",
                request_id.decode("latin-1"),
                req.model,
                endpoint.id,
                endpoint.url,
                exc,
                extra=_log_context(request_id, req.model, endpoint.id),
            )
            if sent is not None:
                resumed = await self._continue(
                    req, send, relay, sent, endpoint, "disconnect", total_deadline, resp, ttft,
                    trace_parent,
                )  # fmt: skip
                if resumed is not None:
                    return resumed
            await self._end_stream_with_error(
                endpoint,
                send,
                relay,
                "disconnect",
                EngineUnreachable(f"engine of endpoint '{endpoint.id}' failed mid-stream: {exc}"),
            )
            return self._partial(endpoint, resp, relay, ttft)
        finally:
            # Cancelled (the client left) or done: no abandon can reach this stream now.
            if watch is not None:
                self._pool.first_byte_done(watch)
        endpoint.record_success()
        if not req.served_natively:
            endpoint.stream_usage = relay.usage is not None
        tail = relay.finish(prompt_tokens_estimate=req.prompt_tokens_estimate())
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        prompt, completion = self._record_usage(series, relay.usage)
        series.latency.observe(clock() - start)
        return Outcome(resp.status, endpoint.id, prompt, completion, ttft, version=endpoint.version)

    async def _abandoned(
        self,
        endpoint: Endpoint,
        req: ParsedRequest,
        request_id: bytes,
        send: Send,
        relay: SSERelay | NativeRelay,
        sent: list[bytes] | None,
        total_deadline: float,
        resp: Response,
        ttft: float,
        trace_parent: Context | None,
    ) -> Outcome:
        """A continuable stream whose node stopped answering (the control plane
        abandoned its endpoint): continued elsewhere, or ended with the error event."""
        log.warning(
            "request %s to %s: the node of endpoint %s at %s stopped answering mid-stream",
            request_id.decode("latin-1"),
            req.model,
            endpoint.id,
            endpoint.url,
            extra=_log_context(request_id, req.model, endpoint.id),
        )
        resumed = await self._continue(
            req, send, relay, sent or [], endpoint, "abandoned", total_deadline, resp, ttft,
            trace_parent,
        )  # fmt: skip
        if resumed is not None:
            return resumed
        await self._end_stream_with_error(
            endpoint,
            send,
            relay,
            "abandoned",
            EngineUnreachable(
                f"engine of endpoint '{endpoint.id}' stopped answering (its node missed its "
                "heartbeats) mid-stream"
            ),
        )
        return self._partial(endpoint, resp, relay, ttft)

    async def _continue(
        self,
        req: ParsedRequest,
        send: Send,
        relay: SSERelay | NativeRelay,
        sent: list[bytes],
        endpoint: Endpoint,
        cause: str,
        total_deadline: float,
        resp: Response,
        ttft: float,
        trace_parent: Context | None,
    ) -> Outcome | None:
        """Hand a broken stream to the continuation; None when it cannot go on.
        `trace_parent`: the request's trace context when it is traced (the parent of
        the continuation's spans)."""
        assert self._continuation is not None
        # A half-written event was never relayed: the continuation regenerates it.
        relay.abandon()
        resumed = await self._continuation.resume(
            req=req,
            send=send,
            sent=sent,
            cause=cause,
            failed=endpoint,
            total_deadline=total_deadline,
            trace_parent=trace_parent,
        )
        if resumed is None:
            return None
        self._metrics.upstream_errors.labels(endpoint.id, cause).inc()
        return Outcome(
            resp.status,
            resumed.endpoint,
            resumed.prompt_tokens,
            resumed.completion_tokens,
            ttft,
            continued=resumed.continued,
            version=endpoint.version,
        )

    @staticmethod
    def _partial(
        endpoint: Endpoint, resp: Response, relay: SSERelay | NativeRelay, ttft: float
    ) -> Outcome:
        """A stream cut short: the completion tokens relayed so far, when counted."""
        return Outcome(resp.status, endpoint.id, 0, relay.counted, ttft, version=endpoint.version)

    async def _end_stream_with_error(
        self,
        endpoint: Endpoint,
        send: Send,
        relay: SSERelay | NativeRelay,
        kind: str,
        error: RouterError,
    ) -> None:
        self._metrics.upstream_errors.labels(endpoint.id, kind).inc()
        # A half-written event would swallow the error event: drop it.
        relay.abandon()
        await _send_error_event(send, error)

    @staticmethod
    def _record_usage(series: RequestSeries, usage: dict[str, Any] | None) -> tuple[int, int]:
        """Count the engine's usage in the metrics; (prompt, completion) tokens."""
        if not usage:
            return 0, 0
        # Chat completions say prompt/completion; Messages and Responses input/output.
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        completion = completion if isinstance(completion, int) and completion > 0 else 0
        if prompt is None:
            # vLLM's rerank answers count only `total_tokens`, all of them input.
            total = usage.get("total_tokens")
            prompt = total - completion if isinstance(total, int) else 0
        prompt = prompt if isinstance(prompt, int) and prompt > 0 else 0
        if prompt:
            series.prompt_tokens.inc(prompt)
        if completion:
            series.completion_tokens.inc(completion)
        return prompt, completion


def _log_context(request_id: bytes, model: str, replica: str) -> dict[str, str]:
    """A log line's context fields (`--log-format json` writes each as its own)."""
    return {"request_id": request_id.decode("latin-1"), "model": model, "replica": replica}


def _queue_span(
    tracer: Tracer, model: str, ticket: Ticket, began: int, refused: str | None
) -> None:
    """The queue wait as a span, from `began` (ns) to now."""
    span = tracer.start_span(
        "llmgw.queue",
        start_time=began,
        attributes={"llmgw.model": model, "llmgw.priority": ticket.priority},
    )
    span.set_attribute("llmgw.queue.waited_s", (time.time_ns() - began) / 1e9)
    if refused is not None:
        span.set_attribute("llmgw.refused", refused)
        span.set_status(StatusCode.ERROR)
    span.end()


def _stream_start(
    status: int, request_id: bytes, extra_headers: list[tuple[bytes, bytes]]
) -> Message:
    return {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", request_id),
            *extra_headers,
        ],
    }


@dataclass(slots=True)
class _Timing:
    """When an attempt was sent and when its stream's first event came (router clock)."""

    sent: float
    first_byte: float | None = None
    # The request's trace context (its server span) when it is traced: a continuation's
    # spans are children of the request, not of the attempt that broke.
    trace_parent: Context | None = None
    # The attempt's span when the request is traced: the engine is sent it as parent.
    # Not made current, so no context is made, attached and detached for it.
    span: Span | None = None


async def _send_error_event(send: Send, error: RouterError) -> None:
    """End a stream whose headers were sent with an SSE `error` event."""
    event = b"event: error\ndata: " + error.body() + b"\n\n"
    await send({"type": "http.response.body", "body": event, "more_body": False})


class _HeadersSent:
    """A `send` for a stream whose response start already went out: the second one
    is not sent, and the replica it names becomes an SSE comment (`: llmgw replica ID`),
    since the client saw no `x-llmgw-replica` header."""

    __slots__ = ("_send",)

    def __init__(self, send: Send) -> None:
        self._send = send

    async def __call__(self, message: Message) -> None:
        if message["type"] != "http.response.start":
            await self._send(message)
            return
        for name, value in message.get("headers", ()):
            if name == b"x-llmgw-replica":
                comment = b": llmgw replica " + value + b"\n\n"
                await self._send({"type": "http.response.body", "body": comment, "more_body": True})


def _check_engines(req: ParsedRequest, engines: tuple[str, ...]) -> None:
    """RouteNotServed when none of `engines` (a catalog model's) serves `req`'s route:
    starting a replica for it would be in vain."""
    if not engines:
        return
    for engine in engines:
        try:
            if req.path in routes_of(engine):
                return
        except UnknownEngine:
            return
    names = ", ".join(display_name(e) for e in engines)
    raise RouteNotServed(
        f"model '{req.model}' (engine {names}) does not serve {req.path}", param="model"
    )


def _serving(req: ParsedRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
    """The endpoints whose engine serves `req`'s route; RouteNotServed naming the
    model, its engines and the route when none does."""
    serving = [e for e in endpoints if e.path_for(req.path) is not None]
    if serving or not endpoints:
        return serving
    engines = sorted({display_name(e.engine) for e in endpoints if e.engine})
    if engines:
        message = f"model '{req.model}' (engine {', '.join(engines)}) does not serve {req.path}"
    else:
        ids = ", ".join(e.id for e in endpoints)
        message = (
            f"model '{req.model}' does not serve {req.path}: its endpoints ({ids}) "
            "leave it out of their `routes`"
        )
    raise RouteNotServed(message, param="model")


def _max_tokens(body: dict[str, Any]) -> int:
    """The completion tokens a request asks for at most (0 when it does not say)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _upstream_id(request_id: bytes) -> bytes:
    """The request id for the engine: the client's when it is a UUID, else a new one.

    llama-cpp-python's server answers any X-Request-Id that is not a UUID with 400.
    """
    return request_id if is_uuid(request_id) else new_request_id()
