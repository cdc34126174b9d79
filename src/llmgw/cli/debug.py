"""`llmgw debug`: look inside a running server through its admin listener's `/debug/*`.

    llmgw debug tasks                   every asyncio task, identical stacks grouped
    llmgw debug threads                 every thread's stack
    llmgw debug memory                  RSS, gc counts, most common types (and
                                        allocation sites while tracing runs)
    llmgw debug memory --trace-start    start tracemalloc (--frames N), --trace-stop ends it
    llmgw debug profile --seconds 10 -o profile.txt
                                        a sampling CPU profile, collapsed stacks

The admin address and key are found as for every admin command (`--admin`,
LLMGW_ADMIN_URL, the admin config file; see `llmgw.cli.adminclient`). A
bad value is refused by the server, and shown here as `error: --FLAG ...`
(exit 2); an unreachable server exits 1.

Not guaranteed: a stable text layout; use `--json` in scripts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from llmgw.cli.adminclient import (
    EXIT_BAD_INPUT,
    Admin,
    AdminConfigOption,
    AdminError,
    AdminKeyOption,
    AdminOption,
    call,
    fail,
    resolve_admin,
)
from llmgw.cli.storeopts import JsonOption, print_json

debug_app = typer.Typer(
    help="Look inside a running server: asyncio tasks, threads, a CPU profile, memory.",
    no_args_is_help=True,
)

# Query parameters as the flags that set them, for the server's refusals.
_FLAGS = {
    "seconds": "--seconds",
    "interval_ms": "--interval-ms",
    "top": "--top",
    "frames": "--frames",
}
_EXAMPLES = {"seconds": "10", "interval_ms": "5", "top": "25", "frames": "10"}
# The profile's own length is added to this for the request's timeout.
PROFILE_TIMEOUT_MARGIN = 30.0


def _get(admin: Admin, path: str, *, method: str = "GET", timeout: float = 30.0) -> Any:
    """Call the admin API; a refused parameter is reported with the flag that set it."""
    try:
        return call(method, admin, path, timeout=timeout)
    except AdminError as exc:
        message = exc.message
        for param, flag in _FLAGS.items():
            if message.startswith(f"{param} "):
                message = f"{flag}{message[len(param) :]}; pass e.g. {flag} {_EXAMPLES[param]}"
                break
        fail(message, exc.code)


def _show_stacks(path: str, json_out: bool, target: Admin) -> None:
    """Print the grouped stacks at `path` (tasks or threads), as JSON or readably."""
    from llmgw.diagnostics import render

    data = _get(target, f"{path}?format=json")
    if json_out:
        print_json(data)
    else:
        typer.echo(render(data), nl=False)


@debug_app.command("tasks")
def tasks(
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Every asyncio task of the server, identical stacks grouped with a count."""
    _show_stacks("/debug/tasks", json_out, resolve_admin(admin, admin_key, admin_config))


@debug_app.command("threads")
def threads(
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Every thread's stack (the event loop's, the SQLite and gRPC workers', ...)."""
    _show_stacks("/debug/threads", json_out, resolve_admin(admin, admin_key, admin_config))


@debug_app.command("memory")
def memory(
    top: Annotated[
        int, typer.Option("--top", help="How many types (and allocation sites) to list.")
    ] = 25,
    trace_start: Annotated[
        bool,
        typer.Option(
            "--trace-start",
            help="Start tracing allocations (tracemalloc) instead; it costs memory and CPU "
            "until --trace-stop.",
        ),
    ] = False,
    trace_stop: Annotated[
        bool, typer.Option("--trace-stop", help="Stop tracing allocations instead.")
    ] = False,
    frames: Annotated[
        int | None,
        typer.Option(
            "--frames",
            help="With --trace-start: frames kept per allocation (default 10; more tells "
            "callers apart, and costs more).",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """RSS, garbage-collector counts and the most common types; allocation sites while
    tracing runs."""
    from llmgw.diagnostics import render_memory

    if trace_start and trace_stop:
        fail("--trace-start and --trace-stop contradict each other; pass one", EXIT_BAD_INPUT)
    if frames is not None and not trace_start:
        fail("--frames goes with --trace-start", EXIT_BAD_INPUT)
    target = resolve_admin(admin, admin_key, admin_config)
    if trace_start:
        query = "" if frames is None else f"?frames={frames}"
        state = _get(target, f"/debug/memory/trace{query}", method="POST")
        if json_out:
            print_json(state)
            return
        typer.echo(
            f"allocation tracing started ({state['frames']} frames per allocation); "
            "`llmgw debug memory` now lists the top allocation sites. It costs memory and "
            "CPU: stop it with `llmgw debug memory --trace-stop`."
        )
        return
    if trace_stop:
        state = _get(target, "/debug/memory/trace", method="DELETE")
        if json_out:
            print_json(state)
            return
        was = "stopped" if state["was_tracing"] else "was not running; nothing to stop"
        typer.echo(f"allocation tracing {was}")
        return
    data = _get(target, f"/debug/memory?format=json&top={top}")
    if json_out:
        print_json(data)
    else:
        typer.echo(render_memory(data), nl=False)


@debug_app.command("profile")
def profile(
    seconds: Annotated[
        float, typer.Option("--seconds", help="How long to sample (the server caps it at 60).")
    ] = 10.0,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write the collapsed stacks to this file (default: standard output).",
            show_default=False,
        ),
    ] = None,
    interval_ms: Annotated[
        float, typer.Option("--interval-ms", help="Milliseconds between samples (1 to 100).")
    ] = 5.0,
    idle: Annotated[
        bool,
        typer.Option("--idle", help="Also count threads that are only waiting."),
    ] = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """A sampling CPU profile of the running server, as collapsed stacks
    (`frame;frame;frame count`): open the file in https://www.speedscope.app, or run
    flamegraph.pl or inferno-flamegraph on it."""
    target = resolve_admin(admin, admin_key, admin_config)
    query = f"seconds={seconds:g}&interval_ms={interval_ms:g}&format=json"
    if idle:
        query += "&idle=true"
    timeout = max(seconds, 0.0) + PROFILE_TIMEOUT_MARGIN
    result = _get(target, f"/debug/profile?{query}", timeout=timeout)
    collapsed: str = result["collapsed"]
    summary = (
        f"{result['samples']} samples over {result['seconds']:g} s, every "
        f"{result['interval_ms']:g} ms; {result['stacks']} distinct stacks; the sampler "
        f"used {result['sampler_cpu_seconds'] / max(result['seconds'], 1e-9):.1%} of a core"
    )
    if output is None:
        typer.echo(collapsed, nl=False)
        typer.echo(summary, err=True)
        return
    try:
        output.write_text(collapsed, encoding="utf-8")
    except OSError as exc:
        fail(f"--output {output}: cannot write it: {exc.strerror}", EXIT_BAD_INPUT)
    typer.echo(
        f"wrote {output}: {summary}. Open it in https://www.speedscope.app (drop the file "
        f"on the page), or `flamegraph.pl {output} > profile.svg`."
    )
