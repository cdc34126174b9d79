"""The raw ASGI app of `llmgw sim`: routing, the loading phase, and the small endpoints.

`create_app` wires the objects the CLI built into a `SimApp`. Routes are an exact-path
table; an unknown path gets 404 and a known path with another method 405, both with
OpenAI error bodies. Until `load_time` seconds (on the injected clock) have passed
since the app was created, every route except `/metrics` and `/sim/*` answers 503
`loading`, like an engine still loading weights.

vLLM's sleep mode is played by `llmgw.sim.sleep`: `/sleep`, `/wake_up` and
`/is_sleeping`; while the model sleeps, the routes that need its weights answer 503
`sleeping`, the others (`/health`, `/v1/models`, `/tokenize`, `/detokenize`) keep
answering, as on vLLM.

With `adapters` (`--enable-lora`) vLLM's runtime LoRA endpoints are served
(`llmgw.sim.lora`) and `/v1/models` lists the loaded adapters after the base models.

With `native_apis` the Anthropic Messages and OpenAI Responses APIs are served
too (`llmgw.sim.native`); without, those paths are 404 like on llama.cpp's server.

Not guaranteed: HEAD, OPTIONS, trailing-slash variants or query-string handling; the
path must match exactly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llmgw.engines.apis import MESSAGES, RESPONSES
from llmgw.sim.asgi import Receive, Scope, Send, read_body, send_bytes, send_error, send_json
from llmgw.sim.engine import Engine
from llmgw.sim.errors import SimError, bad_request
from llmgw.sim.extras import Extras
from llmgw.sim.faults import Faults, FaultsError
from llmgw.sim.inference import Inference
from llmgw.sim.lora import LoraAdapters
from llmgw.sim.native import NativeApis
from llmgw.sim.scheduler import Clock
from llmgw.sim.sleep import SleepMode
from llmgw.sim.stats import SimStats
from llmgw.sim.tokens import TextGenerator

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

# Routes that answer while the model sleeps (vLLM's do not need the weights).
_SERVED_ASLEEP: Final = frozenset(
    {
        "/health",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/metrics",
        "/sim/stats",
        "/sim/faults",
        "/sleep",
        "/wake_up",
        "/is_sleeping",
    }
)
_METRICS_HEADERS: Final = ((b"content-type", CONTENT_TYPE_LATEST.encode()),)


class SimApp:
    """The ASGI callable. Holds the route table and the loading deadline."""

    def __init__(
        self,
        *,
        models: Sequence[str],
        inference: Inference,
        extras: Extras,
        engine: Engine,
        stats: SimStats,
        faults: Faults,
        registry: CollectorRegistry,
        load_time: float,
        clock: Clock,
        wall_clock: Clock,
        sleep_mode: SleepMode,
        native_apis: frozenset[str] = frozenset(),
        adapters: LoraAdapters | None = None,
    ) -> None:
        self._engine = engine
        self._sleep_mode = sleep_mode
        self._adapters = adapters
        self._created = int(wall_clock())
        self._stats = stats
        self._faults = faults
        self._registry = registry
        self._clock = clock
        self._ready_at = clock() + load_time
        self._ready = load_time <= 0
        self._model_cards: list[dict[str, object]] = [
            {"id": name, "object": "model", "created": self._created, "owned_by": "llmgw-sim"}
            for name in models
        ]
        self._models_body = orjson.dumps({"object": "list", "data": self._model_cards})
        # path -> (needs the model loaded, {method: handler}); the paths that need
        # the weights (refused while the model sleeps) are in `_weights_paths`.
        self._routes: dict[str, tuple[bool, dict[str, Handler]]] = {
            "/health": (True, {"GET": self._health}),
            "/v1/models": (True, {"GET": self._models}),
            "/sleep": (True, {"POST": self._sleep}),
            "/wake_up": (True, {"POST": self._wake_up}),
            "/is_sleeping": (True, {"GET": self._is_sleeping}),
            "/v1/chat/completions": (True, {"POST": inference.chat}),
            "/v1/completions": (True, {"POST": inference.completions}),
            "/v1/embeddings": (True, {"POST": inference.embeddings}),
            "/tokenize": (True, {"POST": extras.tokenize}),
            "/detokenize": (True, {"POST": extras.detokenize}),
            "/v1/rerank": (True, {"POST": extras.rerank}),
            "/v1/score": (True, {"POST": extras.score}),
            "/v1/audio/transcriptions": (True, {"POST": extras.transcriptions}),
            "/v1/audio/translations": (True, {"POST": extras.translations}),
            "/metrics": (False, {"GET": self._metrics}),
            "/sim/stats": (False, {"GET": self._sim_stats}),
            "/sim/faults": (False, {"GET": self._get_faults, "POST": self._post_faults}),
        }
        if adapters is not None:
            self._routes["/v1/load_lora_adapter"] = (True, {"POST": adapters.load})
            self._routes["/v1/unload_lora_adapter"] = (True, {"POST": adapters.unload})
        native = NativeApis(inference=inference)
        if MESSAGES in native_apis:
            self._routes["/v1/messages"] = (True, {"POST": native.messages})
        if RESPONSES in native_apis:
            self._routes["/v1/responses"] = (True, {"POST": native.responses})
        self._awake_only = frozenset(self._routes) - _SERVED_ASLEEP

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(receive, send)
        # websocket scopes are not served: returning closes them.

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        route = self._routes.get(path)
        if route is None:
            await send_error(
                send,
                SimError(
                    404,
                    f"no route {scope['method']} {path} on llmgw sim",
                    code="not_found",
                ),
            )
            return
        needs_model, methods = route
        handler = methods.get(scope["method"])
        if handler is None:
            allowed = ", ".join(methods)
            await send_error(
                send,
                SimError(
                    405,
                    f"method {scope['method']} is not allowed on {path}; use {allowed}",
                    code="method_not_allowed",
                ),
                ((b"allow", allowed.encode()),),
            )
            return
        if needs_model and not self._ready:
            if self._clock() < self._ready_at:
                await send_error(send, SimError(503, "model is loading", code="loading"))
                return
            self._ready = True
        if path in self._awake_only and not self._sleep_mode.serving:
            await send_error(send, self._sleep_mode.refusal())
            return
        await handler(scope, receive, send)

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, b"", ())

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        adapters = self._adapters
        if adapters is None or not adapters.registered:
            await send_bytes(send, 200, self._models_body)
            return
        cards = [*self._model_cards, *adapters.cards()]
        await send_json(send, 200, {"object": "list", "data": cards})

    async def _sleep(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._sleep_mode.put_to_sleep(scope.get("query_string", b""))
        except SimError as exc:
            await send_error(send, exc)
            return
        await send_bytes(send, 200, b"", ())

    async def _wake_up(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._sleep_mode.wake_up()
        await send_bytes(send, 200, b"", ())

    async def _is_sleeping(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"is_sleeping": not self._sleep_mode.serving})

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, generate_latest(self._registry), _METRICS_HEADERS)

    async def _sim_stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        scheduler = self._engine.scheduler
        snapshot = self._stats.snapshot(running=scheduler.running, waiting=scheduler.waiting)
        memory = self._sleep_mode.memory()
        snapshot["sleep"] = {
            "phase": self._sleep_mode.phase.value,
            "level": self._sleep_mode.level,
            "sleeps": self._sleep_mode.sleeps,
            "wakes": self._sleep_mode.wakes,
            "weights_gpu_bytes": memory.gpu_bytes,
            "weights_host_bytes": memory.host_bytes,
        }
        if self._adapters is not None:
            snapshot["lora"] = self._adapters.snapshot()
        await send_json(send, 200, snapshot)

    async def _get_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self._faults.settings.model_dump())

    async def _post_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        if body is None:
            return
        try:
            try:
                patch = orjson.loads(body) if body else {}
            except orjson.JSONDecodeError as exc:
                raise bad_request(f"the request body is not valid JSON: {exc}") from exc
            if not isinstance(patch, dict):
                raise bad_request("the fault settings must be a JSON object")
            try:
                settings = self._faults.update(patch)
            except FaultsError as exc:
                raise bad_request(str(exc)) from exc
        except SimError as exc:
            await send_error(send, exc)
            return
        await send_json(send, 200, settings.model_dump())


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def create_app(
    *,
    models: Sequence[str],
    engine: Engine,
    generator: TextGenerator,
    stats: SimStats,
    faults: Faults,
    registry: CollectorRegistry,
    load_time: float,
    output_tokens: int,
    embedding_dim: int,
    clock: Clock,
    wall_clock: Clock,
    sleep_mode: SleepMode,
    native_apis: frozenset[str] = frozenset(),
    sequence: bool = False,
    reasoning_words: int = 0,
    tool_calls: bool = False,
    tool_call_words: int = 0,
    adapters: LoraAdapters | None = None,
) -> SimApp:
    """The sim's ASGI app over objects built by the caller (the CLI or a test)."""
    if not models:
        raise ValueError("create_app needs at least one model name")
    inference = Inference(
        models=models,
        engine=engine,
        generator=generator,
        stats=stats,
        faults=faults,
        output_tokens=output_tokens,
        embedding_dim=embedding_dim,
        wall_clock=wall_clock,
        sequence=sequence,
        reasoning_words=reasoning_words,
        tool_calls=tool_calls,
        tool_call_words=tool_call_words,
        adapters=adapters,
    )
    extras = Extras(
        inference=inference, engine=engine, stats=stats, faults=faults, wall_clock=wall_clock
    )
    return SimApp(
        models=models,
        inference=inference,
        extras=extras,
        engine=engine,
        stats=stats,
        faults=faults,
        registry=registry,
        load_time=load_time,
        clock=clock,
        wall_clock=wall_clock,
        sleep_mode=sleep_mode,
        native_apis=native_apis,
        adapters=adapters,
    )
