"""The client-facing ASGI app: `/v1/*`, `/healthz`, and `/admin` handed to the admin portal.

A hand-written ASGI app rather than a framework's router: this is the hot path
and every request pays for each layer. Routing is a dict lookup; errors of
every kind become OpenAI-shaped bodies here and nowhere else. While a request
is proxied, a watcher waits for the client to disconnect and cancels the
upstream work at once.
With a tracer (tracing on), each API request is one trace: a server span named
for its route (model, key id, request id, status; never a prompt or a key's
secret), continuing the client's W3C `traceparent`, with child spans for the
key check and the limits, and the proxy's own. A request without an
`x-request-id` and without a client's trace then gets its trace id as request
id (in UUID form), so a complaint quoting it leads to the trace; every span
carries the request id too. Without a tracer this costs one check.

Not guaranteed: requests arriving with `Transfer-Encoding: chunked` are only
checked against the body limit as they are read.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Mapping, MutableMapping
from datetime import datetime
from typing import Any, Protocol

import orjson
from opentelemetry.trace import SpanKind, StatusCode, Tracer, get_current_span

from llmgw.auth import Authenticator, AuthError, Principal, token_from_headers
from llmgw.limits import Admission, KeyLimits, Limiter, LimitExceeded
from llmgw.metrics import RouterMetrics
from llmgw.router.access_log import AccessLog
from llmgw.router.apis import ClientApi, engine_routes
from llmgw.router.apis import count_tokens as counting
from llmgw.router.apis.messages import MessagesApi
from llmgw.router.apis.responses import ResponsesApi
from llmgw.router.end_users import end_user_of
from llmgw.router.endpoints import EndpointPool
from llmgw.router.errors import (
    BodyTooLarge,
    ClientClosed,
    MethodNotAllowed,
    ModelNotFound,
    Refused,
    RouteNotFound,
    RouterError,
    StoreUnavailableError,
)
from llmgw.router.ids import new_request_id
from llmgw.router.proxy import CLIENT_CLOSED, Outcome, Proxy
from llmgw.router.queue import Ticket, ticket_for
from llmgw.router.requests import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    ParsedRequest,
    named_model,
    parse_request,
)
from llmgw.store import StoreError, UsageRecord
from llmgw.telemetry.propagation import child_span, extract_context, span_trace_id
from llmgw.telemetry.spans import current_span

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("llmgw.router")

_POST_ROUTES = frozenset({CHAT, COMPLETIONS, EMBEDDINGS, *engine_routes.ROUTES})
_COUNT_TOKENS = "/v1/messages/count_tokens"
# A client's request id is echoed in headers and written to the usage store:
# visible ASCII only, at most 128 characters; any other gets a fresh id.
_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class UsageSink(Protocol):
    def record(self, rec: UsageRecord) -> None: ...


class RouterApp:
    """ASGI callable for the API listener."""

    def __init__(
        self,
        *,
        proxy: Proxy,
        pool: EndpointPool,
        metrics: RouterMetrics,
        authenticator: Authenticator,
        limiter: Limiter,
        usage: UsageSink,
        max_body_bytes: int,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
        started_at: int,
        admin_portal: ASGIApp | None = None,
        model_names: Callable[[str], Collection[str]] | None = None,
        queue_wait: float | None = None,
        apis: Mapping[str, ClientApi] | None = None,
        token_counter: counting.TokenCounter | None = None,
        tracer: Tracer | None = None,
        access_log: AccessLog | None = None,
    ) -> None:
        """`admin_portal` answers every `/admin` and `/admin/...` path (the login and
        admin pages); without one those paths are 404 like any unknown route.
        `model_names` gives every name of the model a name stands for (its own and
        its aliases), so a key allowed one of them may use them all. `apis` maps
        paths to the other client APIs served (default: Anthropic Messages and
        OpenAI Responses). `token_counter` answers `/v1/messages/count_tokens`.
        `tracer`: trace API requests (None: tracing off). `access_log`: write a line
        per API request (None: off)."""
        self._proxy = proxy
        self._pool = pool
        self._metrics = metrics
        self._auth = authenticator
        self._limiter = limiter
        self._usage = usage
        self._max_body = max_body_bytes
        self._clock = clock
        self._wall_clock = wall_clock
        self._created = started_at
        self._admin_portal = admin_portal
        self._model_names = model_names or _only_itself
        # The router's default wait budget; None: requests never queue.
        self._queue_wait = queue_wait
        self._apis: Mapping[str, ClientApi] = (
            apis
            if apis is not None
            else {"/v1/messages": MessagesApi(), "/v1/responses": ResponsesApi()}
        )
        self._token_counter = token_counter
        self._tracer = tracer
        self._access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await _lifespan(receive, send)
            return
        request_id = b""
        content_length = -1
        authorization: bytes | None = None
        api_key: bytes | None = None
        traced = False
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                if _REQUEST_ID.fullmatch(value):
                    request_id = value
            elif name == b"content-length" and value.isdigit():
                content_length = int(value)
            elif name == b"authorization":
                authorization = value
            elif name == b"x-api-key":
                api_key = value
            elif name == b"traceparent":
                traced = True
        path: str = scope["path"]
        if (self._tracer is not None or self._access_log is not None) and (
            path.startswith("/v1/") or path in _POST_ROUTES
        ):
            await self._observed(
                scope, receive, send, request_id, content_length, authorization, api_key, traced
            )
            return
        if not request_id:
            request_id = new_request_id()
        await self._route(scope, receive, send, request_id, content_length, authorization, api_key)

    async def _observed(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        given_id: bytes,
        content_length: int,
        authorization: bytes | None,
        api_key: bytes | None,
        traced: bool,
    ) -> None:
        """An API request traced and/or access-logged (see the module docstring); the
        headers `__call__` read come with it, not read twice (`traced`: the client
        sent a `traceparent`)."""
        exchange = _Exchange(self._clock())
        method: str = scope["method"]
        path: str = scope["path"]

        async def observing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                for name, value in message.get("headers", ()):
                    if name == b"x-llmgw-replica":
                        exchange.replica = value.decode("latin-1")
            await send(message)

        request_id = given_id
        if self._tracer is None:
            request_id = request_id or new_request_id()
            try:
                await self._route(
                    scope, receive, observing_send, request_id, content_length,
                    authorization, api_key, exchange,
                )  # fmt: skip
            finally:
                self._log_access(method, path, request_id, exchange, None)
            return
        # No `traceparent`, no trace to continue (the propagator ignores a lone
        # `tracestate`): the span starts a trace without a context looked through.
        parent = extract_context(scope["headers"]) if traced else None
        with self._tracer.start_as_current_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "http.route": path},
        ) as span:
            trace_id = f"{span_trace_id(span):032x}"
            if not request_id:
                # A trace begun here is this request's alone: its id is the request id.
                # A client's trace may hold many requests, each gets an id of its own.
                continued = (
                    parent is not None and get_current_span(parent).get_span_context().is_valid
                )
                request_id = new_request_id() if continued else _as_uuid(trace_id)
            span.set_attribute("llmgw.request_id", request_id.decode("latin-1"))
            try:
                await self._route(
                    scope, receive, observing_send, request_id, content_length,
                    authorization, api_key, exchange,
                )  # fmt: skip
            finally:
                # One call for the answer's attributes (a call a span costs more than
                # the dict it takes).
                if exchange.replica is None:
                    span.set_attribute("http.response.status_code", exchange.status)
                else:
                    span.set_attributes(
                        {
                            "http.response.status_code": exchange.status,
                            "llmgw.replica": exchange.replica,
                        }
                    )
                if exchange.status >= 500:
                    span.set_status(StatusCode.ERROR)
                self._log_access(method, path, request_id, exchange, trace_id)

    def _log_access(
        self,
        method: str,
        path: str,
        request_id: bytes,
        exchange: _Exchange,
        trace_id: str | None,
    ) -> None:
        if self._access_log is None:
            return
        self._access_log.write(
            method=method,
            path=path,
            status=exchange.status,
            model=exchange.model,
            replica=exchange.replica,
            key_id=exchange.key_id,
            request_id=request_id.decode("latin-1"),
            latency=self._clock() - exchange.started,
            trace_id=trace_id,
        )

    async def _route(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: bytes,
        content_length: int,
        authorization: bytes | None,
        api_key: bytes | None,
        exchange: _Exchange | None = None,
    ) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            if path in _POST_ROUTES:
                if method != "POST":
                    raise MethodNotAllowed(
                        f"{method} {path} is not allowed; use POST", allowed="POST"
                    )
                principal = await self._authenticate(authorization, api_key)
                await self._complete(
                    path,
                    receive,
                    send,
                    request_id,
                    content_length,
                    principal,
                    headers=scope["headers"],
                    exchange=exchange,
                )
            elif path == _COUNT_TOKENS and self._token_counter is not None:
                await self._count_tokens(
                    self._token_counter, scope, receive, send, request_id, content_length
                )
            elif path in self._apis:
                await self._other_api(
                    self._apis[path], scope, receive, send, request_id, content_length, exchange
                )
            elif path == "/v1/models" or path.startswith("/v1/models/"):
                if method not in ("GET", "HEAD"):
                    raise MethodNotAllowed(
                        f"{method} {path} is not allowed; use GET", allowed="GET"
                    )
                principal = await self._authenticate(authorization, api_key)
                await self._models(path, send, request_id, principal)
            elif path == "/healthz":
                await _send_json(send, 200, {"status": "ok"}, request_id)
            elif self._admin_portal is not None and (
                path == "/admin" or path.startswith("/admin/")
            ):
                await self._admin_portal(scope, receive, send)
            else:
                raise RouteNotFound(
                    f"no route {method} {path}; this server serves /v1/*, /tokenize and /detokenize"
                )
        except RouterError as exc:
            await _send_error(send, exc, request_id)

    async def _other_api(
        self,
        api: ClientApi,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: bytes,
        content_length: int,
        exchange: _Exchange | None = None,
    ) -> None:
        """A request of another client API: its own request and error shapes."""
        path: str = scope["path"]
        authorization: bytes | None = None
        api_key: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"x-api-key":
                api_key = value
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed(
                    f"{scope['method']} {path} is not allowed; use POST", allowed="POST"
                )
            principal = await self._authenticate(authorization, api_key)
            await self._complete(
                path,
                receive,
                send,
                request_id,
                content_length,
                principal,
                api,
                headers=scope["headers"],
                exchange=exchange,
            )
        except RouterError as exc:
            await _send_error(send, exc, request_id, api.error_body(exc))

    async def _count_tokens(
        self,
        counter: counting.TokenCounter,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: bytes,
        content_length: int,
    ) -> None:
        """A Messages prompt's token count (errors in the Messages API's shape)."""
        api = self._apis.get("/v1/messages") or MessagesApi()
        headers = dict(scope["headers"])
        model = "none"
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed(
                    f"{scope['method']} {_COUNT_TOKENS} is not allowed; use POST", allowed="POST"
                )
            principal = await self._authenticate(
                headers.get(b"authorization"), headers.get(b"x-api-key")
            )
            if content_length > self._max_body:
                raise BodyTooLarge(self._too_large(content_length))
            req = counting.parse(await self._read_body(receive))
            model = req.model if req.model in self._pool.by_model else "unknown"
            try:
                principal.check_model(req.model, self._model_names(req.model))
            except AuthError as exc:
                raise _refused(exc) from None
            tokens, estimated = await counter.count(req)
        except RouterError as exc:
            self._metrics.request_counter.inc(model, "none", exc.status)
            await _send_error(send, exc, request_id, api.error_body(exc))
            return
        self._metrics.request_counter.inc(model, "none", 200)
        extra = [(b"x-llmgw-estimated", b"true")] if estimated else []
        await _send_json(send, 200, {"input_tokens": tokens}, request_id, extra)

    async def _authenticate(self, authorization: bytes | None, api_key: bytes | None) -> Principal:
        tracer = _recording(self._tracer)
        try:
            if tracer is None:
                return await self._auth.authenticate(token_from_headers(authorization, api_key))
            with child_span(tracer, "llmgw.auth") as span:
                principal = await self._auth.authenticate(
                    token_from_headers(authorization, api_key)
                )
                # The key's id, never its secret.
                if principal.key_id is not None:
                    span.set_attribute("llmgw.key_id", principal.key_id)
                return principal
        except AuthError as exc:
            self._metrics.request_counter.inc("none", "none", exc.status)
            raise _refused(exc) from None

    async def _complete(
        self,
        path: str,
        receive: Receive,
        send: Send,
        request_id: bytes,
        content_length: int,
        principal: Principal,
        api: ClientApi | None = None,
        *,
        headers: list[tuple[bytes, bytes]] | None = None,
        exchange: _Exchange | None = None,
    ) -> None:
        start = self._clock()
        model = "none"
        asked: str | None = None
        streamed = False
        try:
            if content_length > self._max_body:
                raise BodyTooLarge(self._too_large(content_length))
            raw = await self._read_body(receive)
            try:
                req = _parse(path, raw, api, headers)
            except RouterError:
                asked = named_model(raw)
                raise
            asked, streamed = req.model, req.stream
            # Routing reads the session header, `x-llmgw-route` (for keys that may
            # debug only) and the key.
            req.headers, req.key_id = headers or [], principal.key_id
            req.may_debug = principal.may_debug
            model = req.model if req.model in self._pool.by_model else "unknown"
            if exchange is not None:
                exchange.model, exchange.key_id = req.model, principal.key_id
                if self._tracer is not None:
                    _describe_span(req, principal)
            try:
                principal.check_model(req.model, self._model_names(req.model))
            except AuthError as exc:
                raise _refused(exc) from None
            req.end_user = end_user_of(req.body)
            ticket = self._ticket(principal, headers)
        except RouterError as exc:
            self._count(path, model, "none", exc.status)
            # Every request of a key is recorded, refused ones too (bad body: 400,
            # model not allowed: 403), so a key's usage shows what it was refused.
            self._record_refused(asked, streamed, principal, request_id, start, exc.status, path)
            raise
        limits = principal.limits
        team_limits = principal.team_limits
        user_limits = principal.end_user_limits(req.end_user) if req.end_user else None
        admission: Admission | None = None
        team_admission: Admission | None = None
        user_admission: Admission | None = None
        if limits is not None:
            try:
                admission = await self._admit(limits, req)
                if team_limits is not None:
                    team_admission = await self._admit_team(limits, admission, team_limits, req)
                if user_limits is not None:
                    user_admission = await self._admit_end_user(
                        (limits, admission), (team_limits, team_admission), user_limits, req
                    )
            except LimitExceeded as exc:
                self._record(req, principal, request_id, start, exc.status, "none", None, path)
                self._count(path, model, "none", exc.status)
                raise Refused(
                    exc.message,
                    status=exc.status,
                    type_=exc.type,
                    code=exc.code,
                    extra_headers=exc.headers,
                ) from None
            except StoreError as exc:
                raise StoreUnavailableError(
                    f"cannot check the key's budget: the store is unavailable ({exc}); retry"
                ) from exc
        if api is not None:
            send = api.responder(req, send)
        outcome: Outcome | None = None
        try:
            outcome = await self._proxy_watching_disconnect(
                req, request_id, send, start, receive, admission, ticket
            )
        except RouterError as exc:
            self._count(path, model, exc.endpoint_id or "none", exc.status)
            self._record(req, principal, request_id, start, exc.status, exc.endpoint_id, None, path)
            raise
        else:
            self._count(path, model, outcome.endpoint, outcome.status, outcome.version)
            if exchange is not None:
                # As the usage record says: 499 for a client that went away first.
                exchange.status = outcome.status
                if outcome.endpoint != "none":
                    exchange.replica = outcome.endpoint
            # Recorded before the budget is settled: the budget source counts the
            # record's tokens from here on, written or not.
            self._record(
                req, principal, request_id, start, outcome.status, outcome.endpoint, outcome, path
            )
        finally:
            if limits is not None and admission is not None:
                used = outcome.prompt_tokens + outcome.completion_tokens if outcome else 0
                await self._limiter.settle(limits, admission, used)
                if team_limits is not None and team_admission is not None:
                    await self._limiter.settle(team_limits, team_admission, used)
                if user_limits is not None and user_admission is not None:
                    await self._limiter.settle(user_limits, user_admission, used)

    async def _admit(self, limits: KeyLimits, req: ParsedRequest) -> Admission:
        tracer = _recording(self._tracer)
        if tracer is None:
            return await self._limiter.admit(limits, req.prompt_tokens_estimate())
        with child_span(tracer, "llmgw.limits") as span:
            try:
                return await self._limiter.admit(limits, req.prompt_tokens_estimate())
            except LimitExceeded as exc:
                span.set_attribute("llmgw.refused", exc.reason)
                raise

    async def _admit_team(
        self, limits: KeyLimits, admission: Admission, team_limits: KeyLimits, req: ParsedRequest
    ) -> Admission:
        """Admit against the key's team too; a refusal gives the key's admission back, so
        a refused request is charged to neither."""
        try:
            return await self._admit(team_limits, req)
        except (LimitExceeded, StoreError):
            await self._limiter.release(limits, admission)
            raise

    async def _admit_end_user(
        self,
        key: tuple[KeyLimits, Admission],
        team: tuple[KeyLimits | None, Admission | None],
        user_limits: KeyLimits,
        req: ParsedRequest,
    ) -> Admission:
        """Admit against the end user's limits too; a refusal gives the key's and the
        team's admissions back, so a refused request is charged to none of them."""
        try:
            return await self._admit(user_limits, req)
        except (LimitExceeded, StoreError):
            await self._limiter.release(*key)
            if team[0] is not None and team[1] is not None:
                await self._limiter.release(team[0], team[1])
            raise

    def _count(self, route: str, model: str, endpoint: str, status: int, version: str = "") -> None:
        self._metrics.request_counter.inc(model, endpoint, status, version)
        self._metrics.route_counter.inc(route, model, status)

    async def _proxy_watching_disconnect(
        self,
        req: ParsedRequest,
        request_id: bytes,
        send: Send,
        start: float,
        receive: Receive,
        admission: Admission | None,
        ticket: Ticket | None = None,
    ) -> Outcome:
        """Proxy `req`, cancelling it the moment the client goes away."""
        task = asyncio.current_task()
        assert task is not None
        gone = False
        active = True

        def on_disconnect(fut: asyncio.Future[None]) -> None:
            nonlocal gone
            if active and not fut.cancelled() and fut.exception() is None:
                gone = True
                task.cancel()

        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        watcher.add_done_callback(on_disconnect)
        extra = admission.headers if admission is not None else []
        try:
            return await self._proxy.handle(req, request_id, send, start, extra, ticket=ticket)
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()
            self._metrics.client_disconnects.labels(req.model).inc()
            log.info("client went away; request %s to %s cancelled", request_id.decode(), req.model)
            return Outcome(CLIENT_CLOSED, "none")
        finally:
            active = False
            watcher.remove_done_callback(on_disconnect)
            watcher.cancel()

    def _ticket(
        self, principal: Principal, headers: list[tuple[bytes, bytes]] | None
    ) -> Ticket | None:
        """How the request queues while its model is saturated (None: it never does);
        InvalidRequest (400) naming a bad queue header."""
        if self._queue_wait is None:
            return None
        own_wait = principal.max_queue_wait
        return ticket_for(
            key=principal.key_id or principal.name,
            priority=principal.priority,
            weight=principal.weight,
            max_wait=self._queue_wait if own_wait is None else own_wait,
            headers=headers or (),
        )

    def _record(
        self,
        req: ParsedRequest,
        principal: Principal,
        request_id: bytes,
        start: float,
        status: int,
        endpoint: str | None,
        outcome: Outcome | None,
        route: str,
    ) -> None:
        now = self._clock()
        self._usage.record(
            UsageRecord(
                ts=self._wall_clock(),
                request_id=request_id.decode("latin-1"),
                key_id=principal.key_id,
                model=req.model,
                endpoint=endpoint or "none",
                status=status,
                prompt_tokens=outcome.prompt_tokens if outcome else 0,
                completion_tokens=outcome.completion_tokens if outcome else 0,
                latency_ms=(now - start) * 1000.0,
                ttft_ms=outcome.ttft * 1000.0 if outcome and outcome.ttft is not None else None,
                streamed=req.stream,
                queue_ms=outcome.queued * 1000.0 if outcome else 0.0,
                route=route,
                continued=outcome.continued if outcome else 0,
                version=outcome.version if outcome else "",
                end_user=req.end_user,
            )
        )

    def _record_refused(
        self,
        model: str | None,
        streamed: bool,
        principal: Principal,
        request_id: bytes,
        start: float,
        status: int,
        route: str,
    ) -> None:
        """Record a request refused before routing; "none" as its model when its
        body did not name one."""
        self._usage.record(
            UsageRecord(
                ts=self._wall_clock(),
                request_id=request_id.decode("latin-1"),
                key_id=principal.key_id,
                model=model or "none",
                endpoint="none",
                status=status,
                prompt_tokens=0,
                completion_tokens=0,
                latency_ms=(self._clock() - start) * 1000.0,
                ttft_ms=None,
                streamed=streamed,
                route=route,
            )
        )

    def _too_large(self, size: int) -> str:
        return (
            f"request body of {size} bytes is over the limit of {self._max_body} bytes "
            "(router.max_body_bytes)"
        )

    async def _read_body(self, receive: Receive) -> bytes:
        message = await receive()
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            if len(body) > self._max_body:
                raise BodyTooLarge(self._too_large(len(body)))
            return body
        chunks = [body]
        size = len(body)
        while message.get("more_body", False):
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientClosed("client disconnected while sending the request body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                raise BodyTooLarge(self._too_large(size))
            chunks.append(chunk)
        return b"".join(chunks)

    async def _models(self, path: str, send: Send, request_id: bytes, principal: Principal) -> None:
        models = [m for m in self._pool.models() if principal.may_use(m, self._model_names(m))]
        if path == "/v1/models":
            data = [self._model_object(m) for m in models]
            await _send_json(send, 200, {"object": "list", "data": data}, request_id)
            return
        name = path[len("/v1/models/") :]
        if name not in self._pool.by_model or not principal.may_use(name, self._model_names(name)):
            raise ModelNotFound(f"model '{name}' is not served here", param="model")
        await _send_json(send, 200, self._model_object(name), request_id)

    def _model_object(self, name: str) -> dict[str, object]:
        return {"id": name, "object": "model", "created": self._created, "owned_by": "llmgw"}


class _Exchange:
    """What the access log and the server span say of one request, filled as it goes."""

    __slots__ = ("key_id", "model", "replica", "started", "status")

    def __init__(self, started: float) -> None:
        self.started = started
        # 500 until a response starts: a request that ends without one failed here.
        self.status = 500
        self.model: str | None = None
        self.replica: str | None = None
        self.key_id: str | None = None


def _recording(tracer: Tracer | None) -> Tracer | None:
    """`tracer` when the current request's trace is recorded (sampled), else None."""
    if tracer is None or not current_span().is_recording():
        return None
    return tracer


def _as_uuid(trace_id: str) -> bytes:
    """A trace id (32 hex digits) in UUID form, the shape request ids have."""
    t = trace_id
    return f"{t[:8]}-{t[8:12]}-{t[12:16]}-{t[16:20]}-{t[20:]}".encode()


def _describe_span(req: ParsedRequest, principal: Principal) -> None:
    """The server span's request attributes: never the prompt, never the key."""
    attributes: dict[str, str | bool] = {"llmgw.model": req.model, "llmgw.stream": req.stream}
    if principal.key_id is not None:
        attributes["llmgw.key_id"] = principal.key_id
    current_span().set_attributes(attributes)


def _parse(
    path: str, raw: bytes, api: ClientApi | None, headers: list[tuple[bytes, bytes]] | None
) -> ParsedRequest:
    """The request to proxy, parsed by the client API or route it came in on."""
    if api is not None:
        return api.parse(raw)
    if path in engine_routes.ROUTES:
        content_type = next((v for n, v in headers or () if n == b"content-type"), None)
        return engine_routes.parse(path, raw, content_type)
    return parse_request(path, raw)


def _only_itself(name: str) -> tuple[str, ...]:
    return (name,)


def _refused(exc: AuthError) -> Refused:
    return Refused(exc.message, status=exc.status, type_=exc.type, code=exc.code)


async def _send_json(
    send: Send,
    status: int,
    payload: object,
    request_id: bytes,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = orjson.dumps(payload)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", request_id),
                (b"x-llmgw-replica", b"none"),
                *(extra_headers or ()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_error(
    send: Send, exc: RouterError, request_id: bytes, body: bytes | None = None
) -> None:
    """Answer with `exc`; `body` in another API's error shape, else OpenAI's."""
    if body is None:
        body = exc.body()
    replica = (exc.endpoint_id or "none").encode()
    await send(
        {
            "type": "http.response.start",
            "status": exc.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", request_id),
                (b"x-llmgw-replica", replica),
                *exc.headers(),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
