"""What holds memory in the live process: RSS, the garbage collector, allocation sites.

`memory_report()` gives the resident set size, the collector's counts and the
types with the most live objects the collector tracks (containers: dicts,
lists, class instances, coroutines; not strings or numbers, which it does not
track). Counting them walks every tracked object, a pause of a few tens of
milliseconds per million objects on the thread that asks.

`AllocationTracer` starts and stops `tracemalloc`, which records where every
allocation came from (`frames` deep) and costs memory and CPU while it runs;
while it does, the report adds the sites holding the most memory.

Not guaranteed: that RSS and the traced total agree (memory freed to the
allocator but not to the OS, C extensions' own allocations), nor an RSS off
Linux (there it is the peak, from `getrusage`).
"""

from __future__ import annotations

import gc
import resource
import sys
import tracemalloc
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

from llmgw.diagnostics.stacks import PathNames

MAX_FRAMES = 100
DEFAULT_FRAMES = 10


class TracingError(Exception):
    """Tracing cannot change as asked (already on); the message says what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def rss() -> tuple[int, str]:
    """(bytes, how it was measured): the current RSS on Linux, else the peak."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # Kilobytes on Linux, bytes on macOS.
        return (peak if sys.platform == "darwin" else peak * 1024), "peak, from getrusage"
    return pages * resource.getpagesize(), "current, from /proc/self/statm"


def _type_name(kind: type) -> str:
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def object_counts(top: int) -> tuple[int, list[tuple[str, int]]]:
    """(objects the collector tracks, the `top` types by count)."""
    counts: Counter[str] = Counter()
    names: dict[type, str] = {}
    objects = gc.get_objects()
    for obj in objects:
        kind = type(obj)
        name = names.get(kind)
        if name is None:
            name = names[kind] = _type_name(kind)
        counts[name] += 1
    total = len(objects)
    del objects
    return total, counts.most_common(top)


class AllocationTracer:
    """Starts and stops `tracemalloc`, and reports the top allocation sites while it runs."""

    def __init__(self, *, wall_clock: Callable[[], datetime]) -> None:
        self._wall_clock = wall_clock
        self._started_at: datetime | None = None

    def state(self) -> dict[str, Any]:
        if not tracemalloc.is_tracing():
            return {"tracing": False}
        current, peak = tracemalloc.get_traced_memory()
        return {
            "tracing": True,
            "frames": tracemalloc.get_traceback_limit(),
            # None when tracing was started outside llmgw (PYTHONTRACEMALLOC, -X tracemalloc).
            "started_at": self._started_at.isoformat() if self._started_at else None,
            "traced_bytes": current,
            "traced_peak_bytes": peak,
            "tracing_overhead_bytes": tracemalloc.get_tracemalloc_memory(),
        }

    def start(self, frames: int) -> dict[str, Any]:
        if tracemalloc.is_tracing():
            raise TracingError(
                f"memory tracing is already running ({tracemalloc.get_traceback_limit()} "
                "frames per allocation); stop it first (DELETE /debug/memory/trace, or "
                "`llmgw debug memory --trace-stop`) to start it with other settings"
            )
        tracemalloc.start(frames)
        self._started_at = self._wall_clock()
        return self.state()

    def stop(self) -> dict[str, Any]:
        was = tracemalloc.is_tracing()
        tracemalloc.stop()
        self._started_at = None
        return {"tracing": False, "was_tracing": was}

    def top_sites(self, top: int, names: PathNames) -> list[dict[str, Any]]:
        """The `top` allocation sites by memory held now; empty when not tracing."""
        if not tracemalloc.is_tracing():
            return []
        snapshot = tracemalloc.take_snapshot().filter_traces(
            # tracemalloc's own bookkeeping would otherwise lead the list.
            (tracemalloc.Filter(False, tracemalloc.__file__),)
        )
        by = "traceback" if tracemalloc.get_traceback_limit() > 1 else "lineno"
        return [
            {
                "size_bytes": stat.size,
                "count": stat.count,
                "traceback": [f"{names.short(f.filename)}:{f.lineno}" for f in stat.traceback],
            }
            for stat in snapshot.statistics(by)[:top]
        ]


def memory_report(*, top: int, tracer: AllocationTracer) -> dict[str, Any]:
    """What `GET /debug/memory?format=json` answers."""
    names = PathNames()
    size, how = rss()
    tracked, types_ = object_counts(top)
    return {
        "rss_bytes": size,
        "rss_measured": how,
        "gc": {
            "counts": list(gc.get_count()),
            "thresholds": list(gc.get_threshold()),
            "collections": [s["collections"] for s in gc.get_stats()],
            "collected": [s["collected"] for s in gc.get_stats()],
            "uncollectable": [s["uncollectable"] for s in gc.get_stats()],
            "garbage": len(gc.garbage),
            "tracked_objects": tracked,
            # Objects moved out of the collector's generations (`llmgw server` freezes
            # its start-up objects); not in `tracked_objects` nor in `types`.
            "frozen": gc.get_freeze_count(),
        },
        "types": [{"type": name, "count": count} for name, count in types_],
        "tracemalloc": tracer.state(),
        "allocations": tracer.top_sites(top, names),
    }


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def render_memory(data: dict[str, Any]) -> str:
    """A `memory_report()` as text for people."""
    gc_ = data["gc"]
    lines = [
        f"RSS: {_size(data['rss_bytes'])} ({data['rss_measured']})",
        f"gc: counts {gc_['counts']} (thresholds {gc_['thresholds']}), collections per "
        f"generation {gc_['collections']}, uncollectable {gc_['uncollectable']}, "
        f"gc.garbage {gc_['garbage']}",
        f"objects the collector tracks: {gc_['tracked_objects']} (and {gc_['frozen']} "
        "frozen at start-up, not counted below)",
        "",
        "most common types (tracked objects only):",
    ]
    width = max((len(str(t["count"])) for t in data["types"]), default=1)
    lines += [f"  {t['count']:>{width}}  {t['type']}" for t in data["types"]]
    trace = data["tracemalloc"]
    lines.append("")
    if not trace["tracing"]:
        lines.append(
            "allocation tracing is off; start it with POST /debug/memory/trace?frames=N "
            "(`llmgw debug memory --trace-start`) to see the top allocation sites"
        )
        return "\n".join(lines) + "\n"
    since = f" since {trace['started_at']}" if trace["started_at"] else ""
    lines.append(
        f"allocation tracing on{since}, {trace['frames']} frames: traced "
        f"{_size(trace['traced_bytes'])} (peak {_size(trace['traced_peak_bytes'])}), "
        f"tracing itself uses {_size(trace['tracing_overhead_bytes'])}; stop it with "
        "DELETE /debug/memory/trace (`llmgw debug memory --trace-stop`)"
    )
    lines += ["", "top allocation sites (memory held now, oldest frame first):"]
    for site in data["allocations"]:
        lines.append(f"  {_size(site['size_bytes'])} in {site['count']} blocks")
        lines += [f"      {frame}" for frame in site["traceback"]]
    return "\n".join(lines) + "\n"
