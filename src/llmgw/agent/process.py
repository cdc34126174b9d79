"""Engine processes as the agent holds them: spawned here, or adopted from an earlier agent.

`spawn` starts an engine with posix_spawn in a new session (its own process
group, no controlling terminal), stdin from /dev/null and stdout and stderr
appended to its log file, so that it needs nothing from the agent to keep
running: no pipe to fill or to break with SIGPIPE, no parent-death signal.
`attach` takes hold of a running engine an earlier agent started.

Both are watched through a pidfd (`os.pidfd_open`, Linux 5.3+) read by the
event loop: it turns readable when the process exits. The agent reaps a
process it spawned itself and reads its exit code; an adopted one is not its
child, so its exit code cannot be read (`wait()` returns None). Where pidfds
are not available, /proc is polled instead.

Not spawned through asyncio's subprocess support on purpose: its transport
kills the child when it is closed or collected, and engines must outlive the
agent.

Not guaranteed: anything about processes the engine spawns itself, beyond
their sharing its process group (signalled as a whole by `signal_group`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from llmgw.agent.state import ProcessIdentity, read_identity

# /proc is polled this often where pidfds are not available.
_POLL_SECONDS = 0.25
# Signals the agent ignores (Python ignores SIGPIPE and SIGXFSZ) would stay
# ignored across exec; engines get the default behaviour.
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


class EngineProcess:
    """One engine process: its pid, whether this agent is its parent, and its exit."""

    def __init__(self, pid: int, *, child: bool) -> None:
        self.pid = pid
        self.child = child
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
                raise  # ESRCH: gone already (callers check identity after attaching)
        self._exit: asyncio.Future[int | None] | None = None
        self._watch: asyncio.Task[None] | None = None

    @property
    def exited(self) -> bool:
        return self._exit is not None and self._exit.done()

    async def wait(self) -> int | None:
        """Wait for the exit; the exit code (minus the signal number) of a child, else None."""
        if self._exit is None:
            loop = asyncio.get_running_loop()
            self._exit = loop.create_future()
            if self._pidfd is not None:
                loop.add_reader(self._pidfd, self._on_readable)
            else:
                self._watch = loop.create_task(self._poll())
        return await asyncio.shield(self._exit)

    def send(self, sig: signal.Signals) -> None:
        """Signal the engine's main process only (nothing once it has exited)."""
        if self.exited:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)

    def send_group(self, sig: signal.Signals) -> bool:
        """Signal the engine's process group (it leads its own); False when it is empty.

        A zombie member counts: the caller reaps its child first."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def group_alive(self) -> bool:
        """Whether a live process (not a zombie) is left in the engine's group.

        Zombies count for killpg but cannot be signalled away: an exited adopted
        engine stays one until its new parent reaps it, and some inits (in
        containers) never do.
        """
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return any(_live_members(self.pid))

    def close(self) -> None:
        """Stop watching (the process itself is left alone)."""
        if self._watch is not None:
            self._watch.cancel()
        if self._pidfd is not None:
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def _on_readable(self) -> None:
        assert self._pidfd is not None and self._exit is not None
        asyncio.get_running_loop().remove_reader(self._pidfd)
        if not self._exit.done():
            self._exit.set_result(self._reap())

    def _reap(self) -> int | None:
        """The exit code of an exited child (WNOHANG: never blocks); None otherwise."""
        if not self.child:
            return None
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return None  # reaped elsewhere: the code is lost
        return os.waitstatus_to_exitcode(status) if pid else None

    async def _poll(self) -> None:
        assert self._exit is not None
        while True:
            if self.child:
                if self._zombie_or_gone():
                    self._exit.set_result(self._reap())
                    return
            elif read_identity(self.pid) is None:
                self._exit.set_result(None)
                return
            await asyncio.sleep(_POLL_SECONDS)

    def _zombie_or_gone(self) -> bool:
        return read_identity(self.pid) is None


def _live_members(pgid: int) -> list[int]:
    """Pids of the group's processes that are not zombies (blocking: reads /proc)."""
    found: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        # fields[0] is the state (field 3), fields[2] the process group (field 5).
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X", b"x"):
            found.append(int(entry.name))
    return found


def spawn(
    program: str, argv: Sequence[str], env: Mapping[str, str], *, log_path: Path
) -> EngineProcess:
    """Start an engine detached from the agent; OSError when it cannot be executed."""
    file_actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    pid = os.posix_spawn(
        program,
        list(argv),
        dict(env),
        file_actions=file_actions,
        setsid=True,
        setsigmask=(),
        setsigdef=_DEFAULT_SIGNALS,
    )
    return EngineProcess(pid, child=True)


def attach(pid: int, *, expected: ProcessIdentity) -> EngineProcess | None:
    """Watch a running engine an earlier agent started; None when the pid is now another
    process (or none). The pidfd is opened first and the identity checked after, so a
    pid recycled in between is caught too."""
    try:
        process = EngineProcess(pid, child=False)
    except ProcessLookupError:
        return None  # no such process any more (the state file outlived the engine)
    identity = read_identity(pid)
    if identity != expected:
        process.close()
        return None
    return process
