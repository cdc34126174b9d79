"""The limiter's own background tasks (budget loads and refreshes, Redis probes).

Every task is tracked so `close()` can cancel and await all of them; nothing is
left pending when the event loop ends. Does not restart failed tasks and does
not swallow their exceptions: whoever awaits a task gets its error, and asyncio
reports one nobody awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class TaskSet:
    """A set of running tasks that can be cancelled and awaited together."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        if self._closed:
            coro.close()
            raise RuntimeError(f"limiter is closed; cannot start {name}")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            # A task's own failure was already delivered to whoever awaited it.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
