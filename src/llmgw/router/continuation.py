"""Mid-stream continuation: a stream whose engine failed goes on from another replica.

When the upstream of a chat or completion stream fails after the client got its
first bytes (the connection broke: engine exit, reset; or the idle deadline
passed), the proxy hands the stream to `Continuation.resume`: it reads back what
the client was sent (whole SSE events only: a half-received event was never
relayed), asks another Ready replica whose engine can continue
(`llmgw.engines.continues_of`) for the rest, and splices that answer into the
client's open stream:

- chat: the text so far becomes the final assistant message, sent with
  `continue_final_message: true, add_generation_prompt: false` (vLLM's and
  SGLang's way to continue a message instead of starting a new turn);
  completions: the prompt plus the text so far;
- `max_tokens` / `max_completion_tokens` less the tokens already sent;
- each chunk of the new answer gets the first answer's `id`, `created` and
  `model`, the new answer's opening role chunk is dropped, and its usage chunk
  is held back: the stream ends with one usage chunk (when the client asked)
  counting every token the client received (`completion_tokens`) and every
  prompt token the engines processed (`prompt_tokens`: the first attempt's,
  estimated as the continuation's prompt less the tokens it already held, plus
  each continuation's prompt), then `[DONE]`.

While no replica can take the continuation (the only one died and a
replacement is starting), the stream gets `: llmgw ...` keep-alive comments,
up to the request's total deadline and the activation timeout. A continuation
that fails before its first byte (connection refused, 429/502/503/504) moves
to another replica; at most `max_attempts` continuations per request.

Not continued (the stream ends with the SSE `error` event, as before): `n > 1`
(each choice would need its own continuation, and a replica answers them
together), `logprobs` (the continued tokens' log-probabilities would be
computed on a prompt the client never sent, and `top_logprobs` of the splice
point would be wrong), `echo`, prompts given as token ids, streams that
carried tool-call deltas or reasoning content unless the replicas' parsers
write them in markup llmgw can write back (`llmgw.engines.continues_thoughts`:
`<think>...</think>`; `continues_tool_calls`: hermes' `<tool_call>{json}`; then the
thought and every call so far go back in that markup, see `splice`, and only such
replicas take it; a static endpoint names its parsers in the config), streams
that already ended (`finish_reason`), and models or endpoints whose engine
cannot continue (an endpoint without a declared `engine`: llmgw does not guess).

Messages and Responses streams are continued in their own events: one
translated from chat is continued as chat underneath; one an engine served
natively is read back by its API (`NativeRequest.resume`: its thought, text and
tool calls so far, from its blocks or items) and continued through the API's
translation on any replica that continues chat, going on in the same message
(id, the open block or item, later ones numbered after it, event numbering)
and ending with the API's own closing events and usage.

With a tracer (tracing on), each continuation is a client span,
`llmgw.continuation`, a child of the request's server span: why the stream broke
(`llmgw.continuation.cause`), the replica it broke on and the one that took it
over, the tokens the client had before and after, and how it ended; the engine is
sent that span as its parent (`traceparent`).

Not guaranteed: that an engine continues mid-word exactly as it would have
(Hugging Face chat templates strip a continued message's trailing whitespace,
and the text is tokenized anew); that a sampled (temperature > 0) answer reads
as one; exact token counts for engines that send several tokens per chunk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import orjson
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer, use_span

from llmgw.config.continuation import ContinuationConfig
from llmgw.engines import continues_of
from llmgw.metrics import RouterMetrics
from llmgw.router.activation import Activator
from llmgw.router.balancer import Balancer
from llmgw.router.endpoints import Endpoint, EndpointPool
from llmgw.router.errors import (
    DeadlineExceeded,
    EngineError,
    EngineUnreachable,
    ModelUnavailable,
    RouterError,
)
from llmgw.router.ids import new_request_id
from llmgw.router.requests import CHAT, COMPLETIONS, ParsedRequest
from llmgw.router.splice import (
    Splice,
    ToolCall,
    add_usage,
    continuation_body,
    read_back,
    remaining,
    rewrite,
)
from llmgw.router.sse import last_event_end
from llmgw.router.upstream import (
    EVENT_STREAM,
    RECHECK_FIRST,
    RECHECK_MAX,
    RETRY_STATUSES,
    Response,
    Upstream,
    UpstreamError,
)
from llmgw.telemetry.propagation import client_trace_headers, trace_headers

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("llmgw.router.continuation")

_DONE = b"data: [DONE]\n\n"


@dataclass(slots=True)
class Resumed:
    """How a continued stream ended: the replica that served last, the tokens the
    client received and the prompt tokens the engines processed, and how many
    continuations it took."""

    endpoint: str
    prompt_tokens: int
    completion_tokens: int
    continued: int


def error_event(error: RouterError) -> bytes:
    """The SSE event that ends a stream which failed after it began."""
    return b"event: error\ndata: " + error.body() + b"\n\n"


class Continuation:
    """Resumes broken chat and completion streams on other replicas."""

    def __init__(
        self,
        *,
        pool: EndpointPool,
        balancer: Balancer,
        upstream: Upstream,
        metrics: RouterMetrics,
        config: ContinuationConfig,
        clock: Callable[[], float],
        first_byte: float,
        idle: float,
        keepalive: float,
        wait_limit: float,
        activator: Activator | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        """`first_byte` and `idle` are the upstream deadlines of each continuation;
        `keepalive` the seconds between SSE comments while no replica can take it, and
        `wait_limit` how long it waits for one at most (the activation timeout).
        `tracer`: a span for each continuation (None: tracing off)."""
        self._tracer = tracer
        self._pool = pool
        self._balancer = balancer
        self._upstream = upstream
        self._metrics = metrics
        self._config = config
        self._clock = clock
        self._first_byte = first_byte
        self._idle = idle
        self._keepalive = keepalive
        self._wait_limit = wait_limit
        self._activator = activator

    def continuable(self, req: ParsedRequest) -> bool:
        """Whether `req`'s stream may be continued if its engine fails mid-stream (then
        the proxy keeps what it relays, for `resume`)."""
        if not req.stream or req.path not in (CHAT, COMPLETIONS):
            return False
        if req.served_natively and (req.native is None or req.native.resume is None):
            return False
        if not self._config.enabled_for(req.model):
            return False
        body = req.body
        n = body.get("n")
        if n is not None and n != 1:
            return False
        if body.get("logprobs") or body.get("top_logprobs") or body.get("echo"):
            return False
        if req.path == COMPLETIONS:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            return isinstance(prompt, str) and not body.get("suffix")
        return True

    async def resume(
        self,
        *,
        req: ParsedRequest,
        send: Send,
        sent: list[bytes],
        cause: str,
        failed: Endpoint,
        total_deadline: float,
        trace_parent: Context | None = None,
    ) -> Resumed | None:
        """Continue the stream whose engine `failed` (`cause`: disconnect, timeout_idle,
        abandoned) after the client was `sent` those events. None when it cannot be
        continued (the caller ends it with the error event); otherwise the stream is
        ended here, with the rest of the answer or, when no continuation succeeds, the
        error event. `trace_parent`: the request's trace context (its server span),
        the parent of each continuation's span when the request is traced."""
        if not self._can_continue(req):
            return None
        native = req.native if req.served_natively else None
        if native is not None:
            # The API's own events: read back by the API, continued through its translation.
            resumable = native.resume(b"".join(sent)) if native.resume is not None else None
            if resumable is None:
                return None
            splice = Splice(
                chat=True,
                head={"object": "chat.completion.chunk", "model": req.model},
                text=resumable.text,
                tokens=resumable.tokens,
                reasoning=resumable.reasoning,
                calls=[
                    ToolCall(index=i, id=ident, name=name, arguments=arguments)
                    for i, (ident, name, arguments) in enumerate(resumable.calls)
                ],
            )
            send = resumable.wrap(send)
        else:
            found = read_back(b"".join(sent), chat=req.path == CHAT)
            if found is None:
                return None
            splice = found
        replicas = self._pool.by_model.get(req.model) or ()
        if (splice.reasoning and not any(e.thoughts for e in replicas)) or (
            splice.calls and not any(e.tool_calls for e in replicas)
        ):
            # No replica writes a thought or a call in markup llmgw can rebuild.
            return None
        if remaining(req.body, splice.tokens) == 0:
            return None
        tried: set[str] = {failed.id}
        attempts = 0
        last = failed
        while attempts < self._config.max_attempts:
            body = continuation_body(req, splice)
            if body is None:
                break
            self._metrics.continuations.labels(req.model, cause).inc()
            attempts += 1
            splice.continued += 1
            log.info(
                "%s stream of %s broke off at endpoint %s (%s) after %d tokens; continuing "
                "on another replica (attempt %d of %d)",
                req.path,
                req.model,
                last.id,
                cause,
                splice.tokens,
                attempts,
                self._config.max_attempts,
            )
            span = self._span(trace_parent, cause, last, splice.tokens, attempts)
            if span is None:
                outcome = await self._continue_once(req, body, send, splice, tried, total_deadline)
            else:
                with use_span(span, end_on_exit=True):
                    outcome = await self._continue_once(
                        req, body, send, splice, tried, total_deadline
                    )
                    _describe(span, splice, outcome)
            if isinstance(outcome, RouterError):
                return self._resumed(req, last, splice)
            last, broken = outcome
            if broken is None:
                return self._resumed(req, last, splice)
            cause = broken
            tried = {last.id}
        error = EngineUnreachable(
            f"engine of endpoint '{last.id}' failed mid-stream and the answer could not be "
            f"continued after {attempts} continuation(s) "
            f"(router.continuation.max_attempts: {self._config.max_attempts})"
        )
        await send({"type": "http.response.body", "body": error_event(error), "more_body": False})
        return self._resumed(req, last, splice)

    async def _continue_once(
        self,
        req: ParsedRequest,
        body: bytes,
        send: Send,
        splice: Splice,
        tried: set[str],
        total_deadline: float,
    ) -> tuple[Endpoint, str | None] | RouterError:
        """One continuation: the replica that took it and the cause of its own failure
        (None: the stream ended well); or the RouterError that ended the stream when no
        replica took it (its error event was sent)."""
        try:
            endpoint, resp = await self._open(
                req,
                body,
                send,
                tried,
                total_deadline,
                thought=bool(splice.reasoning),
                call=bool(splice.calls),
            )
        except RouterError as exc:
            await send({"type": "http.response.body", "body": error_event(exc), "more_body": False})
            return exc
        splice.begin()
        endpoint.in_flight += 1
        try:
            broken = await self._relay(req, send, resp, endpoint, splice, total_deadline)
        finally:
            endpoint.in_flight -= 1
        return endpoint, broken

    def _span(
        self, parent: Context | None, cause: str, failed: Endpoint, tokens: int, attempt: int
    ) -> Span | None:
        """A continuation's span under the request's server span; None when the request
        is not traced."""
        tracer = self._tracer
        if tracer is None or parent is None:
            return None
        return tracer.start_span(
            "llmgw.continuation",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes={
                "llmgw.continuation.cause": cause,
                "llmgw.continuation.from": failed.id,
                "llmgw.continuation.tokens_before": tokens,
                "llmgw.continuation.attempt": attempt,
            },
            record_exception=False,
            set_status_on_exception=False,
        )

    def _count(self, model: str, endpoint: str, splice: Splice, usage: dict[str, Any]) -> None:
        """A continuation's usage: into the splice, and the engine's tokens into metrics."""
        add_usage(splice, usage)
        series = self._metrics.series(model, endpoint)
        for name, counter in (
            ("prompt_tokens", series.prompt_tokens),
            ("completion_tokens", series.completion_tokens),
        ):
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                counter.inc(value)

    @staticmethod
    def _resumed(req: ParsedRequest, endpoint: Endpoint, splice: Splice) -> Resumed:
        prompt = splice.prompt_tokens(req.prompt_tokens_estimate())
        return Resumed(endpoint.id, prompt, splice.completion_tokens(), splice.continued)

    async def _open(
        self,
        req: ParsedRequest,
        body: bytes,
        send: Send,
        tried: set[str],
        total_deadline: float,
        *,
        thought: bool = False,
        call: bool = False,
    ) -> tuple[Endpoint, Response]:
        """Send the continuation to a replica that can take it and return its stream's
        head; RouterError when none answers within the deadlines."""
        deadline = min(total_deadline, self._clock() + self._wait_limit)
        last_error: RouterError | None = None
        while True:
            endpoint = await self._replica(req, send, tried, deadline, last_error, (thought, call))
            path = endpoint.path_for(req.path) or req.path
            resp: Response | None = None
            opened = False
            try:
                async with asyncio.timeout_at(min(self._clock() + self._first_byte, deadline)):
                    headers: tuple[tuple[bytes, bytes], ...] = (
                        (b"Content-Type", b"application/json"),
                        (b"X-Request-Id", new_request_id()),
                    )
                    if self._tracer is not None:
                        # The current span is the continuation's (when traced).
                        headers += tuple(trace_headers())
                    else:
                        headers += tuple(client_trace_headers(req.headers))
                    resp = await self._upstream.request(b"POST", endpoint.url, path, body, headers)
                    if resp.status < 400 and resp.content_type == EVENT_STREAM:
                        opened = True
                        return endpoint, resp
                    raw = await resp.read()
            except TimeoutError:
                endpoint.record_failure("no answer to a continuation by the first-byte deadline")
                last_error = DeadlineExceeded(
                    f"endpoint '{endpoint.id}' did not answer the continuation within the "
                    f"first-byte deadline of {self._first_byte:g}s"
                )
                self._metrics.upstream_errors.labels(endpoint.id, "timeout_first_byte").inc()
                tried.add(endpoint.id)
                continue
            except UpstreamError as exc:
                endpoint.record_failure(str(exc))
                self._metrics.upstream_errors.labels(endpoint.id, "connect").inc()
                last_error = EngineUnreachable(
                    f"engine of endpoint '{endpoint.id}' is unreachable: {exc}"
                )
                tried.add(endpoint.id)
                continue
            finally:
                if resp is not None and not opened:
                    resp.close()
            self._metrics.upstream_errors.labels(endpoint.id, f"status_{resp.status}").inc()
            # The engine's own words may name its address: they go to the log only.
            log.warning(
                "endpoint %s at %s answered a continuation of %s with %d: %s",
                endpoint.id,
                endpoint.url,
                req.model,
                resp.status,
                raw[:500].decode("utf-8", "replace"),
            )
            error = EngineError(
                f"engine of endpoint '{endpoint.id}' answered the continuation with status "
                f"{resp.status}",
                status=resp.status,
            )
            if resp.status not in RETRY_STATUSES:
                # The engine refused the continuation itself: another would too.
                raise error
            last_error = error
            tried.add(endpoint.id)

    def _can_continue(self, req: ParsedRequest) -> bool:
        """Whether any engine of the model can continue `req` (its endpoints', or with
        none in the pool its catalog profiles'): if not, waiting for one is in vain."""
        engines = {e.engine for e in self._pool.by_model.get(req.model) or ()}
        activator = self._activator
        if not engines and activator is not None and activator.knows(req.model):
            engines = set(activator.engines(req.model))
        return any(req.path in continues_of(engine) for engine in engines)

    def _candidates(
        self, req: ParsedRequest, tried: set[str], needs: tuple[bool, bool] = (False, False)
    ) -> list[Endpoint]:
        """Replicas that can take the continuation now; with a thought or a tool call
        under way (`needs`), only those whose reasoning or tool parser's markup
        (`<think>`, `<tool_call>`) it was written back in."""
        thought, call = needs
        now = self._clock()
        return [
            e
            for e in self._pool.by_model.get(req.model) or ()
            if e.id not in tried
            and e.available(now)
            and e.path_for(req.path) is not None
            and req.path in continues_of(e.engine)
            and (e.thoughts or not thought)
            and (e.tool_calls or not call)
        ]

    async def _replica(
        self,
        req: ParsedRequest,
        send: Send,
        tried: set[str],
        deadline: float,
        last_error: RouterError | None,
        needs: tuple[bool, bool] = (False, False),
    ) -> Endpoint:
        """A replica to continue on, waiting (with keep-alive comments) while there is
        none; the replicas `tried` are skipped until the first pause, since a replica
        that failed once (a stale connection) may serve again."""
        pause = RECHECK_FIRST
        next_comment = self._clock() + self._keepalive
        activation: asyncio.Future[None] | None = None
        try:
            while True:
                candidates = self._candidates(req, tried, needs)
                if candidates:
                    picked = self._balancer.pick(candidates, ())
                    if picked is not None:
                        return picked
                now = self._clock()
                if now >= deadline:
                    why = f"; last: {last_error.message}" if last_error is not None else ""
                    raise ModelUnavailable(
                        f"model '{req.model}' has no replica that can continue the stream "
                        f"(its engine must be one that continues {req.path}){why}",
                        code="continuation_unavailable",
                        retry_after=5,
                    )
                activator = self._activator
                if (
                    activation is None
                    and activator is not None
                    and not self._pool.by_model.get(req.model)
                    and activator.knows(req.model)
                ):
                    activation = asyncio.ensure_future(activator.activate(req.model))
                if now >= next_comment:
                    comment = f": llmgw continuing on another replica of {req.model}\n\n"
                    await send(
                        {"type": "http.response.body", "body": comment.encode(), "more_body": True}
                    )
                    next_comment = now + self._keepalive
                await asyncio.sleep(min(pause, max(deadline - now, 0.0), next_comment - now))
                pause = min(pause * 2, RECHECK_MAX)
                tried.clear()
                if activation is not None and activation.done():
                    # Its failure (the model cannot start) shows as the deadline's error.
                    if not activation.cancelled():
                        activation.exception()
                    activation = None
        finally:
            if activation is not None:
                activation.cancel()

    async def _relay(
        self,
        req: ParsedRequest,
        send: Send,
        resp: Response,
        endpoint: Endpoint,
        splice: Splice,
        total_deadline: float,
    ) -> str | None:
        """Relay a continuation's stream into the client's; None when it ended well (the
        stream is then closed), else the cause of its failure."""
        clock = self._clock
        pending = b""
        done = False
        try:
            async with asyncio.timeout_at(min(clock() + self._idle, total_deadline)) as deadline:
                while True:
                    data = await resp.next_chunk()
                    if not data:
                        break
                    buf = pending + data
                    end = last_event_end(buf)
                    pending = buf[end:]
                    out, usage = rewrite(buf[:end], splice)
                    if usage is not None:
                        self._count(req.model, endpoint.id, splice, usage)
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    deadline.reschedule(min(clock() + self._idle, total_deadline))
            done = True
        except TimeoutError:
            if clock() >= total_deadline:
                endpoint.record_failure("continuation exceeded the total deadline")
                error = DeadlineExceeded(
                    f"endpoint '{endpoint.id}' stream exceeded the request's total deadline"
                )
                await send(
                    {"type": "http.response.body", "body": error_event(error), "more_body": False}
                )
                return None
            endpoint.record_failure("continuation exceeded the idle deadline")
            self._metrics.upstream_errors.labels(endpoint.id, "timeout_idle").inc()
            return "timeout_idle"
        except UpstreamError as exc:
            endpoint.record_failure(str(exc))
            self._metrics.upstream_errors.labels(endpoint.id, "disconnect").inc()
            return "disconnect"
        finally:
            if done:
                resp.release()
            else:
                resp.close()
        endpoint.record_success()
        tail = b""
        # A native stream's translation ends with the usage: it always gets it.
        if req.client_wants_usage or req.served_natively:
            prompt = splice.prompt_tokens(req.prompt_tokens_estimate())
            completion = splice.completion_tokens()
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            tail = (
                b"data: " + orjson.dumps({**splice.head, "choices": [], "usage": usage}) + b"\n\n"
            )
        await send({"type": "http.response.body", "body": tail + _DONE, "more_body": False})
        return None


def _describe(
    span: Span, splice: Splice, outcome: tuple[Endpoint, str | None] | RouterError
) -> None:
    """A continuation span's result: the replica that took it, the tokens the client
    has now, and how it ended (`llmgw.continuation.broken`: the cause of its own
    failure)."""
    span.set_attribute("llmgw.continuation.tokens_after", splice.tokens)
    if isinstance(outcome, RouterError):
        span.set_attribute("http.response.status_code", outcome.status)
        span.set_status(StatusCode.ERROR, outcome.message)
        return
    endpoint, broken = outcome
    span.set_attribute("llmgw.replica", endpoint.id)
    if broken is not None:
        span.set_attribute("llmgw.continuation.broken", broken)
        span.set_status(StatusCode.ERROR, f"the continuation broke off too ({broken})")
