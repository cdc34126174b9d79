"""Stacks of the live process: every asyncio task's coroutine chain and every thread's frames.

`task_stacks()` reads `asyncio.all_tasks()` of the running loop, so it must be
called on the event loop's thread (a request handler, a signal handler added
with `loop.add_signal_handler`). A suspended task's stack is followed through
what each coroutine awaits (`cr_await`): the coroutine the task started, the
one it awaits, and so on down to the future it is parked on, so a stream
waiting on its engine shows the proxy's frames, not only the task's first
coroutine (which is all `Task.get_stack()` gives for a suspended task).

`thread_stacks()` gives every thread that runs Python code with its frames,
then (on Linux, from /proc/self/task) the threads that run none, such as
gRPC's core threads, by name only.

`group()` folds identical stacks into one group with a count: 5,000 streams
waiting in the same place make one group. Frames are `file:line in function`,
the file shortened to its path under `sys.path` (`llmgw/router/proxy.py`).

Not guaranteed: a consistent snapshot. Other threads keep running while their
frames are read, and a chain through an awaitable this module does not know
(a C extension's future, say) ends at `<awaiting TYPE>`.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A chain longer than this is a bug somewhere else (or a cycle); stop following it.
MAX_DEPTH = 500
# Names of the members of a group shown next to it: enough to recognise them.
NAMES_SHOWN = 5


class PathNames:
    """Source file names shortened to their path under `sys.path`, remembered per file."""

    def __init__(self, roots: Iterable[str] | None = None) -> None:
        entries = sys.path if roots is None else roots
        found = {os.path.abspath(p) for p in entries if p}
        # Longest first: a site-packages directory inside a venv inside a checkout
        # wins over the checkout itself.
        self._roots = sorted(found, key=len, reverse=True)
        self._known: dict[str, str] = {}

    def short(self, filename: str) -> str:
        known = self._known.get(filename)
        if known is not None:
            return known
        name = filename
        if not filename.startswith("<"):
            for root in self._roots:
                if filename.startswith(root + os.sep):
                    name = filename[len(root) + 1 :]
                    break
        self._known[filename] = name
        return name


def frame_text(frame: types.FrameType, names: PathNames) -> str:
    code = frame.f_code
    return f"{names.short(code.co_filename)}:{frame.f_lineno} in {code.co_qualname}"


@dataclass(frozen=True, slots=True)
class Stack:
    """One task or thread: its name, its state and its frames, outermost first."""

    name: str
    state: str
    frames: tuple[str, ...]


@dataclass(slots=True)
class Group:
    """Stacks with the same frames: how many, in which states, some of their names."""

    frames: tuple[str, ...]
    count: int = 0
    states: dict[str, int] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "states": dict(self.states),
            "names": list(self.names),
            "stack": list(self.frames),
        }


def group(stacks: Iterable[Stack]) -> list[Group]:
    """Identical stacks folded together, the largest group first."""
    groups: dict[tuple[str, ...], Group] = {}
    for stack in stacks:
        found = groups.get(stack.frames)
        if found is None:
            found = groups[stack.frames] = Group(stack.frames)
        found.count += 1
        found.states[stack.state] = found.states.get(stack.state, 0) + 1
        if len(found.names) < NAMES_SHOWN:
            found.names.append(stack.name)
    return sorted(groups.values(), key=lambda g: (-g.count, g.frames))


# ---- asyncio tasks ----


def _referent(obj: object, kind: type) -> object | None:
    """The first object of `kind` that `obj` refers to (for C awaitables that hide
    their generator, such as an async generator's `asend` object)."""
    for ref in gc.get_referents(obj):
        if isinstance(ref, kind):
            return ref
    return None


def _step(obj: object) -> tuple[types.FrameType | None, object | None, str | None]:
    """(frame, what it awaits, or a last line saying what it is parked on)."""
    if isinstance(obj, types.CoroutineType):
        return obj.cr_frame, obj.cr_await, None
    if isinstance(obj, types.GeneratorType):
        return obj.gi_frame, obj.gi_yieldfrom, None
    if isinstance(obj, types.AsyncGeneratorType):
        return obj.ag_frame, obj.ag_await, None
    kind = type(obj).__name__
    if kind in ("async_generator_asend", "async_generator_athrow"):
        return None, _referent(obj, types.AsyncGeneratorType), f"<awaiting {kind}>"
    if kind == "coroutine_wrapper":  # `coro.__await__()`
        return None, _referent(obj, types.CoroutineType), f"<awaiting {kind}>"
    if kind == "FutureIter":  # awaiting a C future: name what it is
        inner = _referent(obj, asyncio.Future)
        if inner is not None:
            obj = inner
    if isinstance(obj, asyncio.Task):
        coro = obj.get_coro()
        what = getattr(coro, "__qualname__", type(coro).__name__)
        return None, None, f"<awaiting another task running {what}>"
    if isinstance(obj, asyncio.Future):
        return None, None, f"<awaiting {type(obj).__name__}>"
    if hasattr(obj, "cr_await"):
        # A compiled (Cython) coroutine, such as grpc.aio's: no Python frame, but
        # it says what it awaits.
        name = getattr(obj, "__qualname__", kind)
        return None, obj.cr_await, f"<compiled coroutine {name}>"
    return None, None, f"<awaiting {kind}>"


def coroutine_frames(coro: object, names: PathNames) -> tuple[str, ...]:
    """The frames of `coro` and of everything it awaits in turn, outermost first."""
    lines: list[str] = []
    obj: object | None = coro
    seen: set[int] = set()
    while obj is not None and len(lines) < MAX_DEPTH and id(obj) not in seen:
        seen.add(id(obj))
        frame, awaited, last = _step(obj)
        if frame is not None:
            lines.append(frame_text(frame, names))
        elif last is not None and (awaited is None or last.startswith("<compiled")):
            lines.append(last)
        if awaited is None:
            break
        obj = awaited
    return tuple(lines)


def _task_state(task: asyncio.Task[Any], current: asyncio.Task[Any] | None) -> str:
    if task is current:
        return "running"
    if task.done():
        return "cancelled" if task.cancelled() else "done"
    if task.cancelling():
        return "cancelling"
    return "pending"


def task_stacks(names: PathNames | None = None) -> list[Stack]:
    """Every task of the running loop; call it on the loop's thread."""
    names = names if names is not None else PathNames()
    current = asyncio.current_task()
    return [
        Stack(task.get_name(), _task_state(task, current), coroutine_frames(task.get_coro(), names))
        for task in asyncio.all_tasks()
    ]


# ---- threads ----


def frame_chain(frame: types.FrameType | None, names: PathNames) -> tuple[str, ...]:
    """`frame` and its callers, outermost first."""
    lines: list[str] = []
    while frame is not None and len(lines) < MAX_DEPTH:
        lines.append(frame_text(frame, names))
        frame = frame.f_back
    lines.reverse()
    return tuple(lines)


def thread_name(ident: int, threads: dict[int, threading.Thread]) -> str:
    thread = threads.get(ident)
    if thread is None:
        # Started outside `threading` (by a C extension) and never registered.
        return f"thread {ident}"
    return thread.name


def thread_stacks(names: PathNames | None = None) -> list[Stack]:
    """Every thread: those that run Python code with their stacks (the calling one
    marked `current`), then the others (`native`) by name only."""
    names = names if names is not None else PathNames()
    threads = {t.ident: t for t in threading.enumerate() if t.ident is not None}
    me = threading.get_ident()
    stacks = []
    for ident, frame in sys._current_frames().items():
        thread = threads.get(ident)
        if ident == me:
            state = "current"
        elif thread is not None and thread.daemon:
            state = "daemon"
        else:
            state = "alive"
        stacks.append(Stack(thread_name(ident, threads), state, frame_chain(frame, names)))
    return stacks + native_threads({t.native_id for t in threads.values() if t.native_id})


def native_threads(known: set[int]) -> list[Stack]:
    """Threads of this process that run no Python code (gRPC's core, uvloop's, a C
    library's), from /proc/self/task on Linux: their names, no frames."""
    found = []
    try:
        tids = [int(entry) for entry in os.listdir("/proc/self/task") if entry.isdigit()]
    except OSError:
        return []  # not Linux: only the Python threads are known
    for tid in sorted(tids):
        if tid in known:
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                comm = f.read().strip()
        except OSError:
            continue  # it ended meanwhile
        found.append(Stack(f"{comm} [{tid}]", "native", ()))
    return found


# ---- reports ----


def report(kind: str, stacks: Sequence[Stack]) -> dict[str, Any]:
    """`{kind, total, groups}`: what `/debug/tasks?format=json` answers."""
    groups = group(stacks)
    return {"kind": kind, "total": len(stacks), "groups": [g.as_dict() for g in groups]}


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def render(data: dict[str, Any]) -> str:
    """A `report()` as text for people: one block per group, largest first."""
    kind = str(data["kind"])
    singular = kind[:-1] if kind.endswith("s") else kind
    groups: list[dict[str, Any]] = data["groups"]
    lines = [
        f"{_plural(int(data['total']), singular)} in {_plural(len(groups), 'distinct stack')}, "
        "largest group first (frames outermost first, most recent call last)",
    ]
    for g in groups:
        states = ", ".join(f"{n} {s}" for s, n in sorted(g["states"].items()))
        shown = ", ".join(g["names"])
        more = ", ..." if g["count"] > len(g["names"]) else ""
        lines += ["", f"{_plural(int(g['count']), singular)} ({states}): {shown}{more}"]
        lines += [f"    {frame}" for frame in g["stack"]] or ["    (no Python frames)"]
    return "\n".join(lines) + "\n"
