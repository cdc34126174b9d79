"""A signal that writes every thread's and every asyncio task's stack to the log.

For processes without an HTTP listener of their own (the agent): `kill -USR1
PID` and the stacks appear on stderr, where the log goes. Threads are dumped by
`faulthandler` from the signal handler itself, in C, so they appear even when
the event loop is stuck; the tasks are dumped by the loop (`task_stacks`), as
soon as it runs callbacks again, and logged at warning level. The process
carries on as before.

Not guaranteed: the task dump while the loop is blocked (it comes when the
loop is free again), or output when stderr is closed.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal
from collections.abc import Callable
from typing import TextIO

from llmgw.diagnostics.stacks import render, report, task_stacks


def install_stack_dump(
    loop: asyncio.AbstractEventLoop,
    *,
    log: logging.Logger,
    file: TextIO,
    signum: int = signal.SIGUSR1,
) -> Callable[[], None]:
    """Dump stacks to `file` (threads) and `log` (tasks) on `signum`; returns the undo."""
    name = signal.Signals(signum).name

    def dump_tasks() -> None:
        log.warning(
            "%s: every thread's stack is written above (faulthandler); the asyncio tasks:\n%s",
            name,
            render(report("tasks", task_stacks())).rstrip("\n"),
        )

    # The loop's handler first: faulthandler's, registered after it, dumps the
    # threads and then chains to it.
    loop.add_signal_handler(signum, dump_tasks)
    faulthandler.register(signum, file=file, all_threads=True, chain=True)

    def uninstall() -> None:
        faulthandler.unregister(signum)
        loop.remove_signal_handler(signum)

    return uninstall
