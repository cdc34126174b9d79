"""Progress of long admin operations (activation, a drain, ...), as lines on stderr.

`Progress` prints `[ 12.3s] message` lines on stderr, so stdout stays clean for
`--json`; `ReplicaWatch` turns successive views of replicas (a model's
`status.replicas`, or a node's shards) into one line per change; `Background`
runs a blocking call in a thread while the caller polls.

Not guaranteed: that every change is seen. Changes between two polls show
only as the later state.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

import typer

T = TypeVar("T")

# Shard states in which no process holds the shard's GPUs any more.
ENDED_STATES = frozenset({"stopped", "failed"})


class Progress:
    """Lines on stderr, each with the seconds since the operation began."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()

    def elapsed(self) -> float:
        return self._clock() - self._start

    def say(self, message: str) -> None:
        typer.echo(f"[{self.elapsed():5.1f}s] {message}", err=True)


BAR_WIDTH = 24


def bar(share: float) -> str:
    """A text progress bar `share` (0 to 1) full: `########----------------`."""
    filled = int(BAR_WIDTH * min(1.0, max(0.0, share)))
    return "#" * filled + "-" * (BAR_WIDTH - filled)


class DownloadBars:
    """Starting replicas' weight downloads as bars at the bottom of a terminal, redrawn
    in place; the lines said meanwhile are printed above them."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._drawn = 0

    def show(self, lines: Iterable[str], replicas: Iterable[Mapping[str, Any]]) -> None:
        out = sys.stderr
        if self._drawn:
            out.write(f"\x1b[{self._drawn}F\x1b[J")  # back to the first bar; clear below
            out.flush()
        for line in lines:
            self._progress.say(line)
        rows = [r for r in replicas if isinstance(r.get("download"), Mapping)]
        for replica in rows:
            download = replica["download"]
            total = int(download.get("total_bytes") or 0)
            share = int(download.get("done_bytes") or 0) / total if total else 0.0
            out.write(f"replica {replica.get('id')} [{bar(share)}] {replica.get('message')}\n")
        out.flush()
        self._drawn = len(rows)


class Background(Generic[T]):
    """Run `fn` in a daemon thread; `wait` for it, then take its `result`.

    Daemon: a command that stops waiting (timeout, Ctrl-C) exits without it.
    """

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="llmgw-admin-call").start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # handed to the waiting thread, which re-raises it
            self._error = exc
        finally:
            self._done.set()

    def wait(self, seconds: float) -> bool:
        """True once `fn` has returned or raised."""
        return self._done.wait(seconds)

    def result(self) -> T:
        """What `fn` returned; re-raises what it raised. Call after `wait` is True."""
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set when _done without error


def _gpus(replica: Mapping[str, Any]) -> str:
    gpus = replica.get("gpus") or []
    if not gpus:
        return "no GPU"
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(str(g) for g in gpus)


def describe(replica: Mapping[str, Any]) -> str:
    """What a replica is doing, in a few words: "loading on node-a"."""
    state = str(replica.get("state"))
    node = replica.get("node") or "?"
    message = replica.get("message") or ""
    if state == "placing":
        return f"placing on {node} ({_gpus(replica)})"
    if state == "ready":
        url = replica.get("endpoint_url")
        return f"ready at {url}" if url else f"ready on {node}"
    if state == "draining":
        return f"draining on {node} (finishing its requests)"
    if state == "failed":
        return f"failed on {node}: {message or 'no reason given'}"
    if state == "starting" and message.startswith("downloading"):
        return f"starting on {node}: {message}"
    if state == "lost":
        return f"lost: node {node} stopped answering"
    if state == "in_doubt":
        return f"in doubt: node {node} is not answering; out of the routers until it does"
    return f"{state} on {node}"


def _downloaded_more(before: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """A starting replica's download moved on (its node reports each step)."""
    message = str(now.get("message") or "")
    return message.startswith("downloading") and message != before.get("message")


class ReplicaWatch:
    """One line per replica that appeared, changed state, or went away."""

    def __init__(self, *, label: Callable[[Mapping[str, Any]], str] | None = None) -> None:
        self._seen: dict[str, tuple[str, Mapping[str, Any]]] = {}
        self._label = label or (lambda r: str(r.get("id")))

    def prime(self, replicas: Iterable[Mapping[str, Any]]) -> None:
        """Remember these replicas without reporting them."""
        self.update(replicas)

    def update(self, replicas: Iterable[Mapping[str, Any]]) -> list[str]:
        lines: list[str] = []
        current: dict[str, tuple[str, Mapping[str, Any]]] = {}
        for replica in replicas:
            rid = str(replica.get("id"))
            state = str(replica.get("state"))
            current[rid] = (state, replica)
            before = self._seen.get(rid)
            if before is None or before[0] != state or _downloaded_more(before[1], replica):
                lines.append(f"{self._label(replica)} {describe(replica)}")
        for rid, (state, replica) in self._seen.items():
            if rid not in current and state not in ENDED_STATES:
                lines.append(f"{self._label(replica)} is gone from {replica.get('node') or '?'}")
        self._seen = current
        return lines
