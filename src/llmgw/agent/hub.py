"""Hub snapshots on this node's disk: one download per (repo, revision) at a time.

Before an engine whose weights are a hub reference (`org/name@sha`) starts, the
supervisor asks `Snapshots.ensure` for the local snapshot directory. A snapshot
already complete on disk is returned at once, with no network; otherwise the
real `huggingface_hub` client downloads it into the weights directory's `hub/`
cache (the layout vLLM and transformers read), honouring `HF_ENDPOINT` and a
token from the agent's environment (`HF_TOKEN`) or from `--hub-token-file`.
Every caller that needs the same (repo, revision) while it downloads awaits the
same download. A download an earlier agent left half done is resumed file by
file: the files it finished are kept and not fetched again; the client writes
each file to a process-unique `.incomplete` file, so the part of a file that
was being written is fetched again (those leftovers are removed first).

`progress(ref)` reads the bytes on disk against the snapshot's total (from the
hub's file list), for the shard's status message. `held()` lists the complete
snapshots on disk with their size and when an engine last started on each
(kept in `.llmgw-weights-used.json` in the weights directory), for the
heartbeat.

Not guaranteed: retries (a failed download raises `DownloadError`; the shard
fails with the hub's reason and the control plane retries it with backoff);
disk space checks before the download; files the hub changes under a commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.agent.errors import LaunchError
from llmgw.agent.flags import WeightsLimit
from llmgw.config.hub import HubRef

log = logging.getLogger("llmgw.agent.hub")


class DownloadError(LaunchError):
    """A snapshot could not be downloaded; the message carries the hub's reason."""


@dataclass
class _Download:
    ref: HubRef
    task: asyncio.Task[Path]
    started: float
    total: int = 0  # bytes of the snapshot, once the file list is known
    start_bytes: int = 0  # already on disk when this download began (resumed)


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a download is: bytes on disk of the total, and the rate since it began."""

    done: int
    total: int
    rate: float  # bytes per second since this download began; 0 until it can be told

    def describe(self, ref: HubRef) -> str:
        """`downloading org/name@abc1234 41% of 15.2 GB, 2 min left`."""
        if self.total <= 0:
            return f"downloading {ref.short()} (listing its files)"
        percent = min(100, int(100 * self.done / self.total))
        text = f"downloading {ref.short()} {percent}% of {_size(self.total)}"
        if self.rate > 0 and self.done < self.total:
            text += f", {_duration((self.total - self.done) / self.rate)} left"
        return text


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True, slots=True)
class Held:
    """A complete snapshot on this node's disk."""

    ref: HubRef  # the revision is the commit
    bytes: int
    last_used: float  # unix time an engine last started on it; 0: never


USED_FILE = ".llmgw-weights-used.json"
_HELD_SECONDS = 10.0


@dataclass
class Snapshots:
    """The hub snapshots of one weights directory, and the downloads under way."""

    weights_dir: Path
    environ: Mapping[str, str]
    token_file: Path | None = None
    _running: dict[HubRef, _Download] = field(default_factory=dict)
    _held: tuple[float, list[Held]] | None = None  # when scanned, what was found

    @property
    def cache_dir(self) -> Path:
        return self.weights_dir / "hub"

    def _endpoint(self) -> str | None:
        return self.environ.get("HF_ENDPOINT") or None

    def _token(self) -> str | None:
        if self.token_file is not None:
            try:
                token = self.token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise DownloadError(
                    f"cannot read the hub token file {self.token_file}: "
                    f"{exc.strerror or exc}; fix --hub-token-file"
                ) from exc
            return token or None
        return self.environ.get("HF_TOKEN") or None

    def local(self, ref: HubRef) -> Path | None:
        """The complete snapshot on disk, or None (blocking: reads the cache)."""
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        try:
            return Path(
                snapshot_download(
                    ref.repo,
                    revision=ref.revision,
                    cache_dir=self.cache_dir,
                    local_files_only=True,
                )
            )
        except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError):
            return None

    async def ensure(self, ref: HubRef) -> Path:
        """The snapshot's directory, downloading it first when it is not on disk; an
        engine is about to start on it (its last use is now)."""
        found = await asyncio.to_thread(self.local, ref)
        if found is None:
            found = await self._shared_download(ref)
        await asyncio.to_thread(self._mark_used, HubRef(ref.repo, found.name), time.time())
        self._held = None  # scanned again at the next heartbeat
        return found

    async def _shared_download(self, ref: HubRef) -> Path:
        running = self._running.get(ref)
        if running is None:
            task = asyncio.get_running_loop().create_task(
                self._download(ref), name=f"download {ref}"
            )
            running = _Download(ref=ref, task=task, started=time.monotonic())
            self._running[ref] = running
            task.add_done_callback(lambda _: self._running.pop(ref, None))
        # Shielded: one shard's start being cancelled must not end another's download.
        return await asyncio.shield(running.task)

    async def held(self) -> list[Held]:
        """Every complete snapshot on disk, with its size and last use.

        The disk is scanned at most every `_HELD_SECONDS`, and after each download or
        engine start (heartbeats ask far more often than the disk changes)."""
        now = time.monotonic()
        if self._held is None or now - self._held[0] >= _HELD_SECONDS:
            busy = frozenset(r.repo for r in self._running)
            self._held = (now, await asyncio.to_thread(self._scan, busy))
        return self._held[1]

    def _scan(self, downloading: frozenset[str]) -> list[Held]:
        used = self._used()
        found: list[Held] = []
        try:
            folders = sorted(self.cache_dir.glob("models--*--*"))
        except OSError:
            return []
        for folder in folders:
            repo = folder.name.removeprefix("models--").replace("--", "/", 1)
            if repo in downloading:
                continue
            for snapshot in sorted((folder / "snapshots").glob("*")):
                ref = HubRef(repo, snapshot.name)
                if not ref.pinned or self.local(ref) is None:
                    continue
                size = _bytes_under(snapshot, follow=True)
                found.append(Held(ref=ref, bytes=size, last_used=used.get(str(ref), 0.0)))
        return found

    async def make_room(self, limit: WeightsLimit, keep: frozenset[str]) -> list[Held]:
        """Remove the least recently used snapshots, none of repos `keep` (in use) nor
        being downloaded, while the weights are over `limit`; those removed."""
        busy = frozenset(r.repo for r in self._running)
        evicted = await asyncio.to_thread(self._evict, limit, keep | busy)
        if evicted:
            self._held = None
        return evicted

    def _evict(self, limit: WeightsLimit, keep: frozenset[str]) -> list[Held]:
        from huggingface_hub import scan_cache_dir

        held = self._scan(frozenset())
        total = sum(h.bytes for h in held)
        evicted: list[Held] = []
        candidates = [h for h in held if h.ref.repo not in keep]
        for candidate in sorted(candidates, key=lambda h: h.last_used):
            if not self._over(limit, total):
                break
            scan_cache_dir(self.cache_dir).delete_revisions(candidate.ref.revision).execute()
            total -= candidate.bytes
            evicted.append(candidate)
            log.warning(
                "removed %s (%d bytes, last used %s) from %s: the weights are over %s",
                candidate.ref.short(),
                candidate.bytes,
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(candidate.last_used))
                if candidate.last_used
                else "never",
                self.weights_dir,
                limit,
            )
        return evicted

    def _over(self, limit: WeightsLimit, total: int) -> bool:
        if limit.size is not None:
            return total > limit.size
        usage = shutil.disk_usage(self.weights_dir)
        return limit.fraction is not None and usage.used > limit.fraction * usage.total

    def _used(self) -> dict[str, float]:
        try:
            data = json.loads((self.weights_dir / USED_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}

    def _mark_used(self, ref: HubRef, when: float) -> None:
        used = self._used()
        used[str(ref)] = when
        path = self.weights_dir / USED_FILE
        partial = path.with_name(path.name + ".tmp")
        try:
            partial.write_text(json.dumps(used, sort_keys=True), encoding="utf-8")
            partial.replace(path)
        except OSError as exc:
            log.warning("cannot record the use of %s in %s: %s", ref, path, exc.strerror or exc)

    def progress(self, ref: HubRef) -> Progress | None:
        """How far the download of `ref` is; None when none is running (blocking: stat)."""
        running = self._running.get(ref)
        if running is None:
            return None
        done = _bytes_under(self.cache_dir / ("models--" + ref.repo.replace("/", "--")))
        elapsed = time.monotonic() - running.started
        fetched = done - running.start_bytes
        # The client writes in 10 MB pieces: until one landed, no rate (nor ETA) is known.
        rate = fetched / elapsed if elapsed > 0 and fetched * 100 >= running.total else 0.0
        return Progress(done=min(done, running.total or done), total=running.total, rate=rate)

    async def _download(self, ref: HubRef) -> Path:
        running = self._running[ref]
        folder = self.cache_dir / ("models--" + ref.repo.replace("/", "--"))
        # Parts an earlier agent (killed mid-file) left: this agent is the only
        # writer of its weights directory, and one download per repo runs at a time.
        await asyncio.to_thread(_remove_leftovers, folder / "blobs")
        running.start_bytes = await asyncio.to_thread(_bytes_under, folder)
        running.total = await asyncio.to_thread(self._total, ref)
        return await _in_daemon_thread(self._fetch, ref, name=f"download {ref}")

    def _total(self, ref: HubRef) -> int:
        import httpx2
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError

        api = HfApi(endpoint=self._endpoint(), token=self._token())
        try:
            info = api.model_info(ref.repo, revision=ref.revision, files_metadata=True)
        except HfHubHTTPError as exc:
            raise DownloadError(_hub_reason(ref, exc)) from exc
        except (OSError, httpx2.TransportError) as exc:
            raise DownloadError(
                f"cannot reach the hub at {api.endpoint} to download {ref}: {exc}; set "
                "HF_ENDPOINT on the agent to a reachable hub or mirror"
            ) from exc
        return sum(s.size or 0 for s in info.siblings or [])

    def _fetch(self, ref: HubRef) -> Path:
        import httpx2
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        try:
            return Path(
                snapshot_download(
                    ref.repo,
                    revision=ref.revision,
                    cache_dir=self.cache_dir,
                    endpoint=self._endpoint(),
                    token=self._token(),
                )
            )
        except HfHubHTTPError as exc:
            raise DownloadError(_hub_reason(ref, exc)) from exc
        except (LocalEntryNotFoundError, OSError, httpx2.TransportError) as exc:
            raise DownloadError(f"downloading {ref} failed: {exc}") from exc


def _hub_reason(ref: HubRef, exc: Exception) -> str:
    """The hub's own words: its error message header, else the client's first line."""
    from huggingface_hub.errors import HfHubHTTPError

    reason = ""
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        reason = exc.response.headers.get("X-Error-Message", "")
        status = exc.response.status_code
    else:
        status = 0
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    detail = f"{reason} ({first})" if reason else first
    prefix = f"the hub refused {ref}"
    return f"{prefix}: {detail}" if status else f"downloading {ref} failed: {detail}"


def _bytes_under(path: Path, *, follow: bool = False) -> int:
    """Bytes of the regular files under `path` (blobs and `.incomplete` parts); with
    `follow`, of the files its symlinks name (a snapshot's files are links to blobs)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            try:
                if follow or not os.path.islink(full):
                    total += os.path.getsize(full)
            except OSError:
                continue
    return total


async def _in_daemon_thread(fn: Callable[[HubRef], Path], ref: HubRef, *, name: str) -> Path:
    """`fn(ref)` in a daemon thread of its own: a download may take hours, and an agent
    told to stop must not wait for it (the default executor's threads are joined at
    exit). The next agent resumes what this one left."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Path] = loop.create_future()

    def settle(result: Path | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            assert result is not None
            done.set_result(result)

    def run() -> None:
        try:
            result, error = fn(ref), None
        except Exception as exc:  # handed to the awaiting task, which handles or raises it
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    thread = threading.Thread(target=run, name=name, daemon=True)
    _DOWNLOADS.add(thread)
    thread.start()
    return await done


# Download threads started by this process (dead ones are ignored).
_DOWNLOADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def exit_if_downloading(code: int) -> None:
    """End the process now, with `code`, when a download is still running.

    The hub client fetches a snapshot's files in a thread pool of its own, whose
    workers the interpreter joins at exit: an agent told to stop would otherwise
    wait for every file being fetched to end (hours for large weights). The
    agent's state is on disk and the next agent resumes the download, so nothing
    is lost by not waiting. Returns when no download is running.
    """
    running = [t.name for t in list(_DOWNLOADS) if t.is_alive()]
    if not running:
        return
    log.info("leaving %s unfinished; the next agent resumes it", ", ".join(sorted(running)))
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _remove_leftovers(blobs: Path) -> None:
    """Delete the `.incomplete` parts of files a killed download was writing."""
    try:
        parts = list(blobs.glob("*.incomplete"))
    except OSError:
        return
    for part in parts:
        part.unlink(missing_ok=True)
