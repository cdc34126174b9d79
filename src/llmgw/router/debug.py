"""The debug endpoints of the admin app: tasks, threads, a CPU profile, memory.

Mounted twice by `debug_routes`: under `/debug` (the admin listener's own
paths) and under `/admin/api/debug` (the same handlers, which the admin portal
on the API port passes on to logged-in admins only). The admin listener's
guards apply to both: the browser guard (Host allow-list; every path here is a
change or a secret read, so same-origin too) and `admin_guard`.

    GET    /debug/tasks[?format=json]        every asyncio task, identical stacks grouped
    GET    /debug/threads[?format=json]      every thread's stack
    GET    /debug/profile?seconds=N          collapsed stacks of N seconds of sampling
           [&interval_ms=5][&idle=true][&format=json]
    GET    /debug/memory[?top=25][&format=json]   RSS, gc, types, allocation sites
    POST   /debug/memory/trace[?frames=10]   start tracemalloc (409 when it runs)
    DELETE /debug/memory/trace               stop it

Bad parameters are a 400 naming the parameter; a second profile while one runs
is a 409. Text answers are for people and change between versions; the JSON
is what scripts should read.

Not guaranteed: cheap answers. A task dump walks every task, the memory report
every object the collector tracks, on the loop's thread or beside it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from llmgw.diagnostics import (
    DEFAULT_FRAMES,
    DEFAULT_INTERVAL,
    MAX_FRAMES,
    MAX_INTERVAL,
    MIN_INTERVAL,
    AllocationTracer,
    Profiler,
    ProfilerBusy,
    TracingError,
    memory_report,
    render,
    render_memory,
    report,
    task_stacks,
    thread_stacks,
)
from llmgw.router.errors import error_body

PREFIXES = ("/debug", "/admin/api/debug")
READS = ("/tasks", "/threads", "/profile", "/memory")
DEFAULT_PROFILE_SECONDS = 10.0
DEFAULT_TOP = 25
MAX_TOP = 500
_NO_STORE = {"cache-control": "no-store"}


def debug_paths() -> frozenset[str]:
    """The GET paths, for the browser guard's `secret_reads`: a page of another
    origin must not read stacks and allocation sites, nor start profiles."""
    return frozenset(prefix + path for prefix in PREFIXES for path in READS)


class _BadParameter(Exception):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


def _bad(exc: _BadParameter) -> Response:
    return Response(
        error_body(exc.message, "invalid_request_error", "invalid_parameter", exc.param),
        status_code=400,
        media_type="application/json",
        headers=_NO_STORE,
    )


def _conflict(message: str, code: str) -> Response:
    return Response(
        error_body(message, "invalid_request_error", code),
        status_code=409,
        media_type="application/json",
        headers=_NO_STORE,
    )


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json", headers=_NO_STORE)


def _text(text: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        text, media_type="text/plain; charset=utf-8", headers={**_NO_STORE, **(headers or {})}
    )


def _check_params(request: Request, allowed: Sequence[str]) -> None:
    for name in request.query_params:
        if name not in allowed:
            known = ", ".join(allowed) if allowed else "none"
            raise _BadParameter(
                name, f"unknown parameter {name!r} for {request.url.path} (it takes: {known})"
            )


def _format(request: Request) -> str:
    value = request.query_params.get("format", "text")
    if value not in ("text", "json"):
        raise _BadParameter("format", f"format must be text or json, got {value!r}")
    return value


def _number(request: Request, name: str, default: float, low: float, high: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not low <= value <= high:
        raise _BadParameter(name, f"{name} must be a number from {low:g} to {high:g}, got {raw!r}")
    return value


def _seconds(request: Request, cap: float) -> float:
    raw = request.query_params.get("seconds")
    if raw is None:
        return DEFAULT_PROFILE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= cap:
        raise _BadParameter(
            "seconds",
            f"seconds must be a number above 0 and at most {cap:g} (profiles are capped), "
            f"got {raw!r}",
        )
    return value


def _whole(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise _BadParameter(
            name, f"{name} must be a whole number from {low} to {high}, got {raw!r}"
        )
    return value


def _flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "false").lower()
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no"):
        return False
    raise _BadParameter(name, f"{name} must be true or false, got {raw!r}")


Handler = Callable[[Request], Any]


def _answering_bad_input(handler: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            response: Response = await handler(request)
        except _BadParameter as exc:
            return _bad(exc)
        return response

    return wrapped


def debug_routes(*, profiler: Profiler, tracer: AllocationTracer) -> list[BaseRoute]:
    """The debug endpoints under both prefixes; `profiler` and `tracer` are the
    process's own (one profile at a time, one tracemalloc)."""

    async def tasks(request: Request) -> Response:
        _check_params(request, ("format",))
        fmt = _format(request)
        data = report("tasks", task_stacks())
        return _json(data) if fmt == "json" else _text(render(data))

    async def threads(request: Request) -> Response:
        _check_params(request, ("format",))
        fmt = _format(request)
        data = report("threads", thread_stacks())
        return _json(data) if fmt == "json" else _text(render(data))

    async def profile(request: Request) -> Response:
        _check_params(request, ("seconds", "interval_ms", "idle", "format"))
        fmt = _format(request)
        seconds = _seconds(request, profiler.max_seconds)
        interval_ms = _number(
            request,
            "interval_ms",
            DEFAULT_INTERVAL * 1000,
            MIN_INTERVAL * 1000,
            MAX_INTERVAL * 1000,
        )
        idle = _flag(request, "idle")
        try:
            result = await profiler.run(seconds=seconds, interval=interval_ms / 1000, idle=idle)
        except ProfilerBusy as exc:
            return _conflict(exc.message, "profile_running")
        if fmt == "json":
            return _json(result.as_dict())
        return _text(
            result.collapsed,
            {
                "x-llmgw-profile-samples": str(result.samples),
                "x-llmgw-profile-seconds": f"{result.seconds:.3f}",
                "x-llmgw-profile-interval-ms": f"{result.interval * 1000:g}",
                "x-llmgw-profile-sampler-cpu-seconds": f"{result.sampler_cpu_seconds:.4f}",
            },
        )

    async def memory(request: Request) -> Response:
        _check_params(request, ("top", "format"))
        fmt = _format(request)
        top = _whole(request, "top", DEFAULT_TOP, 1, MAX_TOP)
        data = await asyncio.to_thread(memory_report, top=top, tracer=tracer)
        return _json(data) if fmt == "json" else _text(render_memory(data))

    async def trace(request: Request) -> Response:
        if request.method == "DELETE":
            _check_params(request, ())
            return _json(tracer.stop())
        _check_params(request, ("frames",))
        frames = _whole(request, "frames", DEFAULT_FRAMES, 1, MAX_FRAMES)
        try:
            return _json(tracer.start(frames))
        except TracingError as exc:
            return _conflict(exc.message, "already_tracing")

    routes: list[BaseRoute] = []
    for prefix in PREFIXES:
        routes += [
            Route(f"{prefix}/tasks", _answering_bad_input(tasks), methods=["GET"]),
            Route(f"{prefix}/threads", _answering_bad_input(threads), methods=["GET"]),
            Route(f"{prefix}/profile", _answering_bad_input(profile), methods=["GET"]),
            Route(f"{prefix}/memory", _answering_bad_input(memory), methods=["GET"]),
            Route(
                f"{prefix}/memory/trace", _answering_bad_input(trace), methods=["POST", "DELETE"]
            ),
        ]
    return routes
