"""`llmgw nodes drain NODE --wait`: follow a drain until no live shard is left on the node.

After the drain flag is set, the reconciler starts a replacement elsewhere for
each replica on the node, and drains the old one once the replacement is
ready. This polls `GET /admin/api/nodes` and prints each change on stderr: the
replacements (new shards of the same models on other nodes) coming up, the old
shards draining and going away. The outcome is "node X is drained: 3 replicas
moved (to node-b, node-c)" (exit 0), or on timeout what is still on the node
and why, e.g. the placement reason of a model that cannot move (exit 1).

Not guaranteed: that a replacement is matched to the very shard it replaces;
new shards of the same model are counted per model.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import typer

from llmgw.cli.adminclient import EXIT_UNREACHABLE, Admin, AdminError, call, fail, request
from llmgw.cli.progress import ENDED_STATES, Progress, ReplicaWatch
from llmgw.cli.storeopts import print_json

EXIT_INTERRUPTED = 130

Fleet = dict[str, dict[str, Any]]


def _fleet(admin: Admin) -> Fleet:
    return {n["id"]: n for n in call("GET", admin, "/admin/api/nodes")["nodes"]}


def shards_before_drain(admin: Admin) -> set[str]:
    """Every shard id in the fleet; read before the drain flag is set, so that a
    replacement the reconciler starts at once is not taken for an existing shard."""
    nodes = request("GET", admin, "/admin/api/nodes")["nodes"]
    return {s["id"] for n in nodes for s in n["shards"]}


def _live(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [s for s in node["shards"] if s["state"] not in ENDED_STATES]


def _replica(node_id: str, shard: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": shard["id"],
        "model": shard["model"],
        "node": node_id,
        "state": shard["state"],
        "gpus": shard.get("gpu_indices") or [],
        "endpoint_url": shard.get("endpoint_url"),
        "message": shard.get("message"),
    }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


class _Drain:
    """What the drain started from, and how the fleet looks now."""

    def __init__(self, node_id: str, fleet: Fleet, known: set[str]) -> None:
        self.node_id = node_id
        self.old = {s["id"]: s for s in _live(fleet[node_id]) if s["id"] in known}
        self.models = {s["model"] for s in self.old.values()}
        self.known = known
        self.fleet = fleet

    @property
    def node(self) -> dict[str, Any]:
        return self.fleet[self.node_id]

    def replicas(self) -> list[dict[str, Any]]:
        """The old shards still on the node, and new shards of their models elsewhere."""
        found = []
        for node_id, node in sorted(self.fleet.items()):
            for shard in node["shards"]:
                old = node_id == self.node_id and shard["id"] in self.old
                new = (
                    node_id != self.node_id
                    and shard["model"] in self.models
                    and shard["id"] not in self.known
                )
                if old or new:
                    found.append(_replica(node_id, shard))
        return found

    def replacements(self) -> list[dict[str, Any]]:
        return [r for r in self.replicas() if r["node"] != self.node_id]

    def moved(self) -> tuple[list[dict[str, Any]], int]:
        """Ready replacements that took an old shard's place, and old shards without one."""
        wanted = Counter(s["model"] for s in self.old.values())
        moved = []
        for replica in self.replacements():
            if replica["state"] == "ready" and wanted[replica["model"]] > 0:
                wanted[replica["model"]] -= 1
                moved.append(replica)
        return moved, sum(wanted.values())


def _reason(admin: Admin, drain: _Drain, shard: Mapping[str, Any]) -> str:
    """Why `shard` is still on the draining node."""
    if shard["state"] == "draining":
        return "draining: finishing its in-flight requests"
    if not drain.node["connected"]:
        return "the node is disconnected, so no stop can reach it"
    pending = [
        r for r in drain.replacements() if r["model"] == shard["model"] and r["state"] != "ready"
    ]
    if pending:
        r = pending[0]
        return f"waiting for its replacement {r['id']} on {r['node']} ({r['state']})"
    try:
        explained = call(
            "GET", admin, f"/admin/api/models/{quote(shard['model'], safe='')}/placement"
        )
    except AdminError as exc:
        if exc.status == 404:
            return f"model {shard['model']} is not in the catalog; it is stopped, not moved"
        return f"its placement cannot be read: {exc.message}"
    if not explained.get("placeable"):
        return f"no replacement can be placed: {explained.get('summary') or 'no reason given'}"
    target = (explained.get("placement") or {}).get("node") or "a node"
    return f"a replacement fits on {target}; waiting for the reconciler to start it"


def _describe_old(shard: Mapping[str, Any]) -> str:
    return f"{shard['id']} ({shard['model']})"


def wait_for_drain(
    admin: Admin,
    node_id: str,
    *,
    known: set[str],
    timeout: float,
    poll: float,
    json_out: bool,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Follow the drain of `node_id` (already flagged); exits with the outcome.

    `known`: the shard ids from `shards_before_drain`, read before the flag was set.
    """
    progress = Progress()
    try:
        drain = _Drain(node_id, _fleet(admin), known)
    except AdminError as exc:
        fail(exc.message, exc.code)
    except KeyError:
        fail(f"node {node_id} is no longer known to the server", EXIT_UNREACHABLE)
    watch = ReplicaWatch(label=lambda r: f"{r['model']}: replica {r['id']}")
    watch.prime(drain.replicas())
    if drain.old:
        olds = ", ".join(_describe_old(s) for s in drain.old.values())
        progress.say(
            f"node {node_id} is draining; waiting for "
            f"{_plural(len(drain.old), 'replica')} to move off it: {olds}"
        )
    poll_error = None
    try:
        while _live(drain.node):
            if progress.elapsed() >= timeout:
                _timed_out(admin, drain, timeout, json_out=json_out)
            sleep(poll)
            try:
                fleet = _fleet(admin)
            except AdminError as exc:
                if exc.message != poll_error:
                    progress.say(f"cannot read the nodes: {exc.message}")
                poll_error = exc.message
                continue
            if node_id not in fleet:
                fail(f"node {node_id} is no longer known to the server", EXIT_UNREACHABLE)
            drain.fleet = fleet
            for line in watch.update(drain.replicas()):
                progress.say(line)
    except KeyboardInterrupt:
        fail(
            f"stopped waiting (interrupted); node {node_id} stays draining "
            f"(`llmgw nodes show {node_id}` shows what is left)",
            EXIT_INTERRUPTED,
        )
    _drained(drain, progress, json_out=json_out)


def _json(drain: _Drain, *, drained: bool, remaining: list[dict[str, Any]]) -> dict[str, Any]:
    moved, _ = drain.moved()
    return {
        "node": drain.node,
        "drained": drained,
        "moved": [{"model": r["model"], "replica": r["id"], "to": r["node"]} for r in moved],
        "remaining": remaining,
    }


def _drained(drain: _Drain, progress: Progress, *, json_out: bool) -> None:
    moved, without = drain.moved()
    if json_out:
        print_json(_json(drain, drained=True, remaining=[]))
    if not drain.old:
        text = f"node {drain.node_id} is drained: nothing was running on it"
    else:
        text = f"node {drain.node_id} is drained: {_plural(len(moved), 'replica')} moved"
        if moved:
            text += f" (to {', '.join(sorted({r['node'] for r in moved}))})"
        if without:
            text += f", {without} stopped without a replacement"
        text += f" after {progress.elapsed():.1f} s"
    typer.echo(text, err=json_out)


def _timed_out(admin: Admin, drain: _Drain, timeout: float, *, json_out: bool) -> None:
    remaining = [
        {
            "replica": s["id"],
            "model": s["model"],
            "state": s["state"],
            "reason": _reason(admin, drain, s),
        }
        for s in _live(drain.node)
    ]
    if json_out:
        print_json(_json(drain, drained=False, remaining=remaining))
    lines = [
        f"node {drain.node_id} is not drained after {timeout:g} s; still on it:",
        *(f"  {r['replica']} ({r['model']}, {r['state']}): {r['reason']}" for r in remaining),
        f"the node stays draining: no new work goes to it (`llmgw nodes undrain "
        f"{drain.node_id}` undoes that)",
    ]
    fail("\n".join(lines), EXIT_UNREACHABLE)
