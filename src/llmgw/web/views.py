"""What each dashboard page shows, computed from the sources' admin-API dicts.

Each function returns the template context of one page's live part (the
fragment that refreshes itself). They only read: no source is changed here.

Not guaranteed: a consistent snapshot across sources (nodes and models are
read one after the other), or stable context names for anyone but the
package's own templates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from llmgw.web.charts import LineChart, line_chart, share
from llmgw.web.sources import DashboardSources, HistorySource, Json

NODE_STATES = ("ready", "unreachable", "lost")
MODEL_STATES = ("ready", "sleeping", "starting", "backoff", "unplaceable", "stopped")
REPLICA_STATES = (
    "placing",
    "starting",
    "loading",
    "ready",
    "sleeping",
    "in_doubt",
    "draining",
    "stopping",
    "stopped",
    "failed",
    "lost",
)
MAX_EVENTS = 500
# Long texts (an unplaceable model's reasons name every node) are cut in lists.
PROBLEM_CHARS = 240
NODES_PER_REASON = 8


def ordered_counts(counts: Mapping[str, int], order: Sequence[str]) -> list[tuple[str, int]]:
    """Every state of `order` (zeros included), then any unexpected ones."""
    known = [(state, counts.get(state, 0)) for state in order]
    extra = sorted((s, n) for s, n in counts.items() if s not in order)
    return known + extra


def gpu_memory(gpu: Mapping[str, Any]) -> tuple[int, int]:
    """(used, total) bytes of one GPU; used from the last heartbeat, else total - free."""
    total = int(gpu.get("memory_total_bytes") or 0)
    used = gpu.get("memory_used_bytes")
    if used is None:
        used = total - int(gpu.get("memory_free_bytes") or 0)
    return int(used), total


# What `status` holds for a model the controller does not know (yet): "unknown" only.
STATUS_DEFAULTS: Mapping[str, Any] = {
    "state": "unknown",
    "desired_replicas": 0,
    "ready_replicas": 0,
    "replicas": [],
    "in_flight": 0,
    "idle_seconds": None,
    "activating": False,
    "failures": 0,
    "retry_in_seconds": 0,
    "last_failure": None,
    "unplaceable": None,
}


def _status(model: Mapping[str, Any]) -> Mapping[str, Any]:
    return {**STATUS_DEFAULTS, **(model.get("status") or {})}


def _replicas(model: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    replicas: list[Mapping[str, Any]] = _status(model).get("replicas") or []
    return replicas


def problem(model: Mapping[str, Any]) -> str | None:
    """Why a model needs a look (failed replica, backoff, unplaceable), or None."""
    status = _status(model)
    failure = status.get("last_failure")
    if failure:
        return str(failure.get("summary") or failure.get("message") or "failed")
    failed = [r for r in _replicas(model) if r.get("state") == "failed"]
    if failed:
        first = failed[0]
        return f"replica {first.get('id')} on node {first.get('node')} failed: " + str(
            first.get("message") or "the engine failed"
        )
    if status.get("unplaceable"):
        return _cut(str(status["unplaceable"]))
    return None


def _cut(text: str) -> str:
    if len(text) <= PROBLEM_CHARS:
        return text
    return text[: PROBLEM_CHARS - 1].rstrip() + "\u2026"


def placement_groups(placement: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each profile's rejections grouped by reason, so 100 nodes read as a few lines."""
    profiles = []
    for verdict in placement.get("profiles") or []:
        groups: dict[str, list[str]] = {}
        for rejection in verdict.get("rejected") or []:
            groups.setdefault(str(rejection["reason"]), []).append(str(rejection["node"]))
        profiles.append(
            {
                "profile": verdict.get("profile"),
                "fits": verdict.get("fits") or [],
                "groups": [
                    {
                        "reason": reason,
                        "nodes": nodes[:NODES_PER_REASON],
                        "more": max(0, len(nodes) - NODES_PER_REASON),
                    }
                    for reason, nodes in sorted(groups.items(), key=lambda g: -len(g[1]))
                ],
            }
        )
    return profiles


def history_charts(history: HistorySource) -> list[LineChart]:
    now = history.now()
    points = history.points()
    x_range = (now - history.window, now)
    left = f"\u2212{history.window / 60:.0f} min"  # a minus sign
    return [
        line_chart(
            "Requests / s",
            [(p.at, p.requests_per_second) for p in points],
            x_range=x_range,
            fmt=lambda v: f"{v:,.2f}" if v < 10 else f"{v:,.0f}",
            left_label=left,
            right_label="now",
        ),
        line_chart(
            "Time to first token (mean)",
            [(p.at, p.ttft_seconds) for p in points],
            x_range=x_range,
            fmt=lambda v: f"{v * 1000:,.0f} ms",
            left_label=left,
            right_label="now",
            empty_text="no streamed answers yet",
            min_top=0.1,
        ),
        line_chart(
            "Error rate (5xx)",
            [(p.at, p.error_rate) for p in points],
            x_range=x_range,
            fmt=lambda v: f"{v * 100:.1f}%",
            left_label=left,
            right_label="now",
            empty_text="no requests yet",
            min_top=0.01,
        ),
    ]


def overview(sources: DashboardSources) -> dict[str, Any]:
    nodes = sources.nodes()
    models: list[Json] = sources.models().get("models", [])
    gpus = [g for n in nodes for g in n.get("gpus", [])]
    memory = [gpu_memory(g) for g in gpus]
    points = sources.history.points()
    answered = sum(p.requests for p in points)
    return {
        "node_states": ordered_counts(Counter(n["state"] for n in nodes), NODE_STATES),
        "node_count": len(nodes),
        "draining": sum(1 for n in nodes if n.get("draining")),
        "gpu_total": len(gpus),
        "gpu_in_use": sum(1 for g in gpus if g.get("in_use")),
        "memory_used": sum(u for u, _ in memory),
        "memory_total": sum(t for _, t in memory),
        "model_count": len(models),
        "model_states": ordered_counts(
            Counter(str(_status(m).get("state", "unknown")) for m in models), MODEL_STATES
        ),
        "replica_states": [
            (state, count)
            for state, count in ordered_counts(
                Counter(str(r.get("state")) for m in models for r in _replicas(m)),
                REPLICA_STATES,
            )
            if count
        ],
        "problems": [(m["name"], text) for m in models if (text := problem(m)) is not None],
        "charts": history_charts(sources.history),
        "answered": answered,
        "leader": sources.leader(),
        "servers": sources.servers(),
        "agent_listener": sources.agent_listener,
    }


def downloads(shards: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The hub downloads the shards (or replicas) wait for, one per snapshot (two
    shards on a node share one download)."""
    found: dict[tuple[str, str], Mapping[str, Any]] = {}
    for shard in shards:
        download = shard.get("download")
        if download:
            found.setdefault((str(download["repo"]), str(download["revision"])), download)
    return list(found.values())


def heard(age: object) -> str:
    """When a node was last heard from, in steps coarse enough that a node heard every
    few seconds keeps the same text (its card is not redrawn on every heartbeat)."""
    if not isinstance(age, int | float) or isinstance(age, bool):
        return "never"
    if age < 10:
        return "under 10 s ago"
    if age < 60:
        return f"{int(age) // 10 * 10} s ago"
    if age < 3600:
        return f"{int(age) // 60} min ago"
    if age < 172800:
        return f"{int(age) // 3600} h ago"
    return f"{int(age) // 86400} d ago"


def node_cards(nodes: Iterable[Json]) -> list[dict[str, Any]]:
    cards = []
    for node in sorted(nodes, key=lambda n: str(n["id"])):
        gpus = []
        for gpu in node.get("gpus", []):
            used, total = gpu_memory(gpu)
            gpus.append({**gpu, "used": used, "total": total, "share": share(used, total)})
        weights = node.get("weights") or []
        cards.append(
            {
                **node,
                "gpu_bars": gpus,
                "heard": heard(node.get("heartbeat_age_seconds")),
                "weights": weights,
                "weights_bytes": sum(int(w.get("bytes") or 0) for w in weights),
                "downloads": downloads(node.get("shards") or []),
            }
        )
    return cards


def nodes_page(sources: DashboardSources) -> dict[str, Any]:
    nodes = sources.nodes()
    return {
        "nodes": node_cards(nodes),
        "node_states": ordered_counts(Counter(n["state"] for n in nodes), NODE_STATES),
    }


def model_rows(models: Iterable[Json]) -> list[dict[str, Any]]:
    rows = []
    for model in models:
        status = _status(model)
        replicas = _replicas(model)
        rows.append(
            {
                "name": model["name"],
                "aliases": model.get("aliases") or [],
                "source": model.get("source", ""),
                "state": status.get("state", "unknown"),
                "ready": status.get("ready_replicas", 0),
                "desired": status.get("desired_replicas", 0),
                "min": model.get("min_replicas", 0),
                "max": model.get("max_replicas", 0),
                "profiles": [p.get("name") for p in model.get("profiles", [])],
                "adapters": [a.get("name") for a in model.get("adapters") or []],
                "replica_states": ordered_counts(
                    Counter(str(r.get("state")) for r in replicas), ()
                ),
                "problem": problem(model),
                "downloads": downloads(replicas),
            }
        )
    return rows


def models_page(sources: DashboardSources) -> dict[str, Any]:
    listing = sources.models()
    models: list[Json] = listing.get("models", [])
    return {
        "models": model_rows(models),
        "skipped": listing.get("skipped", []),
        "model_states": ordered_counts(
            Counter(str(_status(m).get("state", "unknown")) for m in models), MODEL_STATES
        ),
    }


def spec_text(model: Mapping[str, Any]) -> str:
    """The model's own fields (no live status) as YAML, for the edit form."""
    spec = {k: v for k, v in model.items() if k not in ("source", "status", "adapters")}
    return yaml.safe_dump(spec, sort_keys=False, default_flow_style=False, allow_unicode=True)


def model_page(sources: DashboardSources, name: str) -> dict[str, Any] | None:
    """One model's page, or None when no model has this name or alias."""
    model = sources.model(name)
    if model is None:
        return None
    status = _status(model)
    running = int(status.get("ready_replicas") or 0) > 0
    # "Why is my model not running": only asked when it is not.
    placement = None if running else sources.placement(str(model["name"]))
    return {
        "model": model,
        "status": status,
        "replicas": _replicas(model),
        "failure": status.get("last_failure"),
        "problem": problem(model),
        "running": running,
        "placement": placement,
        "placement_profiles": placement_groups(placement) if placement else [],
        "events": [e for e in sources.events() if e.get("model") == model["name"]][:20],
        "read_only": model.get("source") == "config",
        "queue": sources.queue(str(model["name"])),
    }


def events_page(
    sources: DashboardSources, *, model: str = "", kind: str = "", limit: int = MAX_EVENTS
) -> dict[str, Any]:
    events = sources.events()
    kinds = sorted({str(e.get("kind")) for e in events})
    shown = [
        e
        for e in events
        if (not model or e.get("model") == model) and (not kind or e.get("kind") == kind)
    ]
    return {
        "events": shown[:limit],
        "total": len(shown),
        "kinds": kinds,
        "model": model,
        "kind": kind,
    }
