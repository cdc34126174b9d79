"""`llmgw models activate`: start a model now and show it coming up.

The activate route answers only when the activation is over (ready, or
refused), so it runs in a background thread while the model's status is
polled; each replica's change (placing, starting, loading, ready, failed) is a
progress line on stderr. The outcome is one line: "model X is ready (1
replica) after 12.3 s" (exit 0), or `error: ` with the server's reason and
the engine's last output lines (exit 1).

Not guaranteed: that the activation stops when this command does. On timeout
or Ctrl-C the server goes on with it, up to its own activation timeout.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from llmgw.cli.adminclient import EXIT_UNREACHABLE, Admin, AdminError, call, fail, request
from llmgw.cli.progress import Background, DownloadBars, Progress, ReplicaWatch, describe
from llmgw.cli.storeopts import print_json

EXIT_INTERRUPTED = 130
TAIL_LINES = 8


def _status(view: Any) -> dict[str, Any]:
    status = view.get("status", view) if isinstance(view, dict) else None
    return status if isinstance(status, dict) else {}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def summary(status: dict[str, Any]) -> str:
    """ "starting, 0/1 ready: replica m-0 loading on node-a" and the like."""
    text = (
        f"{status.get('state', 'unknown')}, "
        f"{status.get('ready_replicas', 0)}/{status.get('desired_replicas', 0)} ready"
    )
    replicas = status.get("replicas") or []
    if replicas:
        text += ": " + "; ".join(f"replica {r.get('id')} {describe(r)}" for r in replicas)
    return text


def _model_note(status: dict[str, Any]) -> str | None:
    """A line for a model-level change that replicas do not show."""
    state = status.get("state")
    if state == "backoff":
        failure = status.get("last_failure") or {}
        retry = status.get("retry_in_seconds") or 0
        return f"{failure.get('summary') or 'a replica failed'}; retrying in {retry:g} s"
    if state == "unplaceable":
        return f"cannot be placed now: {status.get('unplaceable') or 'no reason given'}"
    return None


class _Follower:
    """Prints what changed between two views of a model's status; with `bars` (a
    terminal), downloads are progress bars redrawn in place instead of a line a step."""

    def __init__(self, status: dict[str, Any], progress: Progress, *, bars: bool = False) -> None:
        self.status = status
        self.progress = progress
        self._bars = DownloadBars(progress) if bars else None
        self._state = status.get("state")
        self._watch = ReplicaWatch(label=lambda r: f"replica {r.get('id')}")
        self._watch.prime(status.get("replicas") or [])

    def observe(self, status: dict[str, Any]) -> None:
        self.status = status
        replicas = status.get("replicas") or []
        lines = self._watch.update(replicas)
        if status.get("state") != self._state:
            self._state = status.get("state")
            note = _model_note(status)
            if note:
                lines.append(note)
        if self._bars is None:
            for line in lines:
                self.progress.say(line)
            return
        # A download's steps are its bar; every other change is a line above the bars.
        self._bars.show([line for line in lines if ": downloading " not in line], replicas)


def activate_model(
    admin: Admin, name: str, path: str, *, timeout: float, poll: float, json_out: bool
) -> None:
    """Activate and follow; exits with the outcome (see the module docstring)."""
    model = request("GET", admin, path)
    canonical = str(model.get("name", name))
    progress = Progress()
    follower = _Follower(_status(model), progress, bars=sys.stderr.isatty())
    progress.say(f"activating model {canonical} (now {summary(follower.status)})")
    post: Background[Any] = Background(
        lambda: call("POST", admin, path + "/activate", timeout=timeout + 5)
    )
    poll_error = None
    try:
        while not post.wait(poll):
            if progress.elapsed() >= timeout:
                fail(
                    f"model {canonical} is not ready after {timeout:g} s "
                    f"(now {summary(follower.status)}); the server goes on until its own "
                    f"activation timeout; follow it with `llmgw models show {canonical}`",
                    EXIT_UNREACHABLE,
                )
            try:
                status = _status(call("GET", admin, path))
            except AdminError as exc:
                if exc.message != poll_error:
                    progress.say(f"cannot read the model's status: {exc.message}")
                poll_error = exc.message
                continue
            follower.observe(status)
    except KeyboardInterrupt:
        fail(
            f"stopped waiting (interrupted); the server goes on activating {canonical}: "
            f"follow it with `llmgw models show {canonical}`",
            EXIT_INTERRUPTED,
        )
    try:
        answer = post.result()
    except AdminError as exc:
        fail(exc.message, exc.code)
    # The answer is the last status: what the polls missed shows here.
    follower.observe(_status(answer))
    _outcome(canonical, answer, progress, json_out=json_out)


def _outcome(name: str, answer: Any, progress: Progress, *, json_out: bool) -> None:
    status = _status(answer)
    if json_out:
        print_json(answer)
    error = status.get("error")
    if isinstance(error, dict):
        typer.echo(f"error: {error.get('message') or 'the activation was refused'}", err=True)
        failure = status.get("last_failure")
        tail = failure.get("output_tail") if isinstance(failure, dict) else None
        if isinstance(failure, dict) and tail:
            typer.echo(f"last output of replica {failure.get('replica')}:", err=True)
            for line in tail[-TAIL_LINES:]:
                typer.echo(f"  | {line}", err=True)
        raise typer.Exit(code=EXIT_UNREACHABLE)
    ready = int(status.get("ready_replicas") or 0)
    typer.echo(
        f"model {name} is ready ({_plural(ready, 'replica')}) after {progress.elapsed():.1f} s",
        err=json_out,
    )
