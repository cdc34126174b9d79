"""Values the controller hands out: Ready endpoints, failures, events, a model's state.

Plain immutable data, so views (admin API, CLI, dashboard) can read them
without reaching into the controller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from llmgw.control.catalog.model import CatalogModel
from llmgw.control.inventory import Node, Shard
from llmgw.control.reconciler.autoscale import NO_LOAD, LoadSignals
from llmgw.control.reconciler.types import Explanation, Pending


def routable(node: Node) -> bool:
    """Whether the router may send requests to this node's Ready replicas: it is
    ready (heartbeats on time). A node whose heartbeats stopped may be gone with its
    engines, and a request waits better than it fails. Its agent's stream being
    closed is not enough: engines outlive their agent, and an agent restarting (an
    upgrade) comes back within seconds; meanwhile the routers' own health checks
    and requests take a replica whose engine is really gone out of their choice
    (a connect error moves the request to another replica)."""
    return node.state == "ready"


@dataclass(frozen=True, slots=True)
class ReadyEndpoint:
    """A Ready replica as the router needs it; `engine` is its engine's name ("" when
    not known, e.g. on a standby: the catalog then names it, see `Controller`), and
    `engine_args` the arguments it runs with (they decide, for the simulator, which
    client APIs it serves natively)."""

    id: str
    url: str
    engine: str = ""
    engine_args: tuple[str, ...] = ()
    # For a model with a canary: the version this replica runs and that version's
    # weight ("" and 0 for a model with one version).
    version: str = ""
    weight: int = 0
    # Published under a LoRA adapter's names: the names of the base model whose replica
    # it is (the router keeps them first, so the replica's load stays its base's).
    base_names: tuple[str, ...] = ()


class EndpointPublisher(Protocol):
    """Where Ready replicas go (the router's endpoint pool, through an adapter)."""

    def publish(self, names: Sequence[str], endpoints: Sequence[ReadyEndpoint]) -> None:
        """`names` (a model and its aliases) are served by exactly `endpoints` now."""
        ...

    def withdraw(self, names: Sequence[str]) -> None:
        """`names` are not served at all any more."""
        ...


@dataclass(frozen=True, slots=True)
class Halt:
    """A rollout stopped because a replica of the new spec failed; kept in the store.

    `spec_key` names the spec whose rollout stopped (`rollout.spec_key`): a new
    change to the model starts a new rollout, and the halt no longer applies.
    """

    model: str
    spec_key: str
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class Rollout:
    """Where a model's rollout stands: `rolling` (replicas being replaced, `step` says
    how far) or `halted` (a new replica failed, `reason` says how; old ones serve)."""

    state: str
    step: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Failure:
    """A replica that did not make it: where, why, and the engine's last words."""

    model: str
    node_id: str
    shard_id: str
    message: str
    output_tail: tuple[str, ...]
    exit_code: int | None
    at: datetime

    def summary(self) -> str:
        """Which replica failed where, without why: for API clients, since the reason
        and the engine's output may name addresses, paths and arguments."""
        text = f"replica {self.shard_id} on node {self.node_id} failed"
        if self.exit_code is not None:
            text += f" (exit code {self.exit_code})"
        return text

    def describe(self) -> str:
        text = f"replica {self.shard_id} on node {self.node_id} failed: {self.message}"
        if self.exit_code is not None:
            text += f" (exit code {self.exit_code})"
        last = _last_words(self.output_tail)
        if last:
            text += f"; last output: {last}"
        return text


_FRAME = " \t│┃|╭╮╰╯─━═║"
# The side of a box (rich-style CLI errors): a long message inside one is wrapped
# over several lines, each between two of these.
_BOX_SIDES = ("│", "┃", "║")
# A framed message longer than this is quoted from its end, whole lines only.
_MAX_WORDS_CHARS = 600


def _says_something(text: str) -> bool:
    return any(c.isalnum() for c in text)


def _framed(line: str) -> bool:
    return line.lstrip().startswith(_BOX_SIDES)


def _last_words(lines: Sequence[str]) -> str:
    """The engine's last line that says something (CLIs often end in a box frame).

    Inside a box, a message is wrapped to the box's width: then it is the whole
    framed paragraph, joined into one line, not the fragment on its last line.
    """
    for end in range(len(lines) - 1, -1, -1):
        text = lines[end].strip(_FRAME)
        if not _says_something(text):
            continue
        if not _framed(lines[end]):
            return text
        parts = [text]
        size = len(text)
        for line in reversed(lines[:end]):
            above = line.strip(_FRAME)
            if not _framed(line) or not _says_something(above):
                break  # the box's top, or a blank line between paragraphs
            if size + len(above) + 1 > _MAX_WORDS_CHARS:
                parts.append("…")
                break
            parts.append(above)
            size += len(above) + 1
        return " ".join(reversed(parts))
    return ""


@dataclass(frozen=True, slots=True)
class Event:
    """One placement decision or state change, for operators."""

    at: datetime
    kind: str
    model: str
    node_id: str
    message: str


@dataclass(frozen=True, slots=True)
class ModelState:
    """One model's live state, as `Controller.snapshot` sees it."""

    model: CatalogModel
    desired: int
    replicas: tuple[tuple[Node, Shard], ...]
    pending: tuple[Pending, ...]
    stopping: frozenset[str]
    in_flight: int
    idle_for: float | None
    failures: int
    last_failure: Failure | None
    retry_in: float
    unplaced: Explanation | None
    activating: bool
    # The load signals for the model's load targets (see `autoscale`).
    load: LoadSignals = NO_LOAD
    # The model's rollout, when one is under way or halted (None: every replica is current).
    rollout: Rollout | None = None
    # Replicas that run a spec the catalog no longer has (being replaced, or kept by a halt).
    outdated: frozenset[str] = frozenset()
    # A model with a canary: the version each replica (and start in flight) runs, by id.
    versions: Mapping[str, str] = field(default_factory=dict)
    # Why the model's canary is stopped (a replica of it failed), or None.
    canary_halt: str | None = None
    # The model's last wake of a sleeping replica: (replica id, seconds it took).
    last_wake: tuple[str, float] | None = None

    @property
    def state(self) -> str:
        """ready / sleeping / starting / backoff / unplaceable / stopped, for people."""
        live = [s for n, s in self.replicas if s.holds_gpus and n.state != "lost"]
        if any(s.state == "ready" and routable(n) for n, s in self.replicas):
            return "ready"
        if live and not self.pending and all(s.state == "sleeping" for s in live):
            return "sleeping"
        if live or self.pending:
            return "starting"
        if self.last_failure is not None and self.retry_in > 0:
            return "backoff"
        if self.unplaced is not None:
            return "unplaceable"
        return "stopped"
