"""The agent's state directory and the file that lists the engines it runs.

Engines outlive their agent, so the agent writes down what it needs to find
them again: per engine its pid, the process's start time (field 22 of
/proc/PID/stat, clock ticks since boot), a hash of its command line, its port,
the full `ShardSpec`, its log file and the deadlines it runs under. A restarted
agent reads the file and re-adopts each engine that is still *the same
process*: the pid is alive (not a zombie), its start time is the recorded one
and so is its command line's hash. A pid reused by another process fails the
start-time check and is dropped from the file, never signalled.

Layout under the state directory (created 0700; `tls/` in it belongs to the
TLS code):

    engines/NODE_ID/state.json    the engines, rewritten atomically on every change
    engines/NODE_ID/lock          held (flock) by the agent for its whole life
    engines/NODE_ID/SHARD.log     each engine's stdout and stderr (SHARD.log.1: the
                                  previous run's, or the part before a rotation)

One directory per node id, so that several agents (tests, demos) may share a
state directory; two agents with the same node id and state directory are
refused (the lock), since the second would adopt the first's engines.

Not guaranteed: durability across a power loss (the file is replaced by
rename without fsync: a crashed agent leaves the page cache intact, and a
power loss takes the engines with it); adoption of an engine whose command
line changed after the agent last wrote the file (engines that rename their
process, as vLLM does, are re-read every few seconds and when they turn ready).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from llmgw.proto import agent_pb2

log = logging.getLogger("llmgw.agent.state")

STATE_VERSION = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class StateDirError(Exception):
    """The state directory cannot be used (created, locked, written); says what to do."""


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """What tells one process from a later one with the same pid."""

    start_ticks: int
    cmdline_sha256: str


EMPTY_CMDLINE = hashlib.sha256(b"").hexdigest()
"""The hash /proc shows for a process in the middle of exec (its arguments not yet
in place), never one to record."""


def cmdline_sha256(argv: Sequence[str]) -> str:
    """The hash of /proc/PID/cmdline of a process exec'd with `argv` (each argument
    followed by a NUL), computed without reading /proc: right after spawn, /proc may
    still show the empty command line of an exec in progress."""
    return hashlib.sha256(b"".join(os.fsencode(arg) + b"\0" for arg in argv)).hexdigest()


def read_identity(pid: int) -> ProcessIdentity | None:
    """The identity of a live process; None when there is none (or only a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may itself hold ") ".
    fields = stat[stat.rindex(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X", b"x"):
        return None
    return ProcessIdentity(
        start_ticks=int(fields[19]),  # field 22; fields[0] is field 3 (state)
        cmdline_sha256=hashlib.sha256(cmdline).hexdigest(),
    )


@dataclass(frozen=True, slots=True)
class EngineRecord:
    """One engine as the state file keeps it."""

    shard_id: str
    pid: int
    start_ticks: int
    cmdline_sha256: str
    port: int
    spec: agent_pb2.ShardSpec
    log_path: str
    endpoint_url: str
    probe_host: str
    ready_path: str
    load_timeout: float
    unhealthy_after: float
    drain_grace: float
    started_unix: float
    been_ready: bool

    def same_process(self, identity: ProcessIdentity | None) -> bool:
        return (
            identity is not None
            and identity.start_ticks == self.start_ticks
            and identity.cmdline_sha256 == self.cmdline_sha256
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "shard_id": self.shard_id,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "cmdline_sha256": self.cmdline_sha256,
            "port": self.port,
            "spec": json_format.MessageToDict(self.spec, preserving_proto_field_name=True),
            "log_path": self.log_path,
            "endpoint_url": self.endpoint_url,
            "probe_host": self.probe_host,
            "ready_path": self.ready_path,
            "load_timeout": self.load_timeout,
            "unhealthy_after": self.unhealthy_after,
            "drain_grace": self.drain_grace,
            "started_unix": self.started_unix,
            "been_ready": self.been_ready,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EngineRecord:
        """Raises KeyError, TypeError, ValueError or json_format.ParseError on a bad entry."""
        spec = json_format.ParseDict(data["spec"], agent_pb2.ShardSpec())
        return cls(
            shard_id=str(data["shard_id"]),
            pid=int(data["pid"]),
            start_ticks=int(data["start_ticks"]),
            cmdline_sha256=str(data["cmdline_sha256"]),
            port=int(data["port"]),
            spec=spec,
            log_path=str(data["log_path"]),
            endpoint_url=str(data["endpoint_url"]),
            probe_host=str(data["probe_host"]),
            ready_path=str(data["ready_path"]),
            load_timeout=float(data["load_timeout"]),
            unhealthy_after=float(data["unhealthy_after"]),
            drain_grace=float(data["drain_grace"]),
            started_unix=float(data["started_unix"]),
            been_ready=bool(data["been_ready"]),
        )


def prepare_state_dir(path: Path) -> Path:
    """Create the state directory (0700) if needed; its real path. `StateDirError` if not."""
    path = path.expanduser()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.stat().st_mode & 0o077:
            # It holds engine logs and, for TLS, a private key: owner only.
            path.chmod(0o700)
    except OSError as exc:
        raise StateDirError(f"cannot create {path}: {exc.strerror or exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise StateDirError(f"{path} is not writable by this user")
    return Path(os.path.realpath(path))


class EngineStore:
    """The engines directory of one node id: its lock, state file and logs."""

    def __init__(self, state_dir: Path, *, node_id: str) -> None:
        self.directory = state_dir / "engines" / _safe(node_id)
        self._state = self.directory / "state.json"
        self._lock_fd: int | None = None

    def lock(self) -> None:
        """Create the directory and hold its lock; `StateDirError` if another agent has it."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Not inherited by engines (Python opens non-inheritable): a live engine
            # must never keep the next agent out.
            fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StateDirError(f"cannot use {self.directory}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise StateDirError(
                f"{self.directory} is in use by another agent with this node id; give each "
                "agent on a machine its own --state-dir (or its own --node-id)"
            ) from exc
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def log_path(self, shard_id: str) -> Path:
        name = _safe(shard_id)
        if name != shard_id:
            # Two ids that differ only in unsafe characters must not share a log.
            name += "-" + hashlib.sha256(shard_id.encode()).hexdigest()[:8]
        return self.directory / f"{name}.log"

    def load(self) -> list[EngineRecord]:
        """The recorded engines; a missing file is none, a damaged one is set aside."""
        try:
            text = self._state.read_text()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StateDirError(f"cannot read {self._state}: {exc.strerror or exc}") from exc
        try:
            data = json.loads(text)
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {STATE_VERSION}")
            return [EngineRecord.from_json(entry) for entry in data["engines"]]
        except (ValueError, KeyError, TypeError, AttributeError, json_format.ParseError) as exc:
            aside = self._state.with_name("state.json.bad")
            with contextlib.suppress(OSError):
                self._state.replace(aside)
            log.error(
                "the engines state file %s is damaged (%s); moved it to %s and adopting "
                "nothing (engines it listed keep running unwatched: stop them by hand)",
                self._state,
                exc,
                aside,
            )
            return []

    def save(self, records: list[EngineRecord]) -> None:
        """Replace the state file atomically (write a temporary file, then rename)."""
        body = json.dumps(
            {"version": STATE_VERSION, "engines": [r.to_json() for r in records]}, indent=1
        )
        temporary = self._state.with_name("state.json.tmp")
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(body)
            temporary.replace(self._state)
        except OSError as exc:
            raise StateDirError(f"cannot write {self._state}: {exc.strerror or exc}") from exc


def _safe(name: str) -> str:
    return _UNSAFE.sub("_", name) or "_"
