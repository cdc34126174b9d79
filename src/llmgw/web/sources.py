"""What the dashboard reads and changes, as the composition root hands it over.

The dashboard sits beside the control plane and the router in the layers and
imports neither: it takes callables returning the *same JSON-able dicts the
admin API returns* (so a page never disagrees with `GET /admin/api/...`), the
key service and the usage repository directly (their packages are below this
one), and the router's metrics history.

Actions (drain, model writes, activation) raise `ActionError` with a message
for the operator; the adapters in the composition root translate the control
plane's own exceptions into it. Anything else they raise is a bug and is not
caught here.

Not guaranteed: that two reads of one page see the same moment; each source is
read once per render, one after the other.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from llmgw.auth import KeyService, TeamAccess
from llmgw.metrics import HistoryPoint
from llmgw.store import KEEP, ApiKey, Keep, Team, UsageDimension, UsageRepository, UsageRow

Json = dict[str, Any]


class ActionError(Exception):
    """An operator's action was refused; `message` says why and what to do.

    `status` is the HTTP status the page answers with (400 for bad input, 404
    for something that is not there, 409 for a conflict, 503 when the store is
    down).
    """

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class KeyManager(Protocol):
    """`llmgw.auth.KeyService` satisfies this."""

    async def list(self, *, include_revoked: bool = False) -> builtins.list[ApiKey]: ...

    async def create(
        self,
        *,
        name: str,
        models: Sequence[str] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        budget_tokens: int | None = None,
        period: str | None = None,
        expires_at: datetime | None = None,
        admin_role: str | None = None,
        user_rpm: int | None = None,
        user_tpm: int | None = None,
        user_budget_tokens: int | None = None,
    ) -> tuple[ApiKey, str]: ...

    async def resolve(self, ref: str) -> ApiKey: ...

    async def update(
        self,
        ref: str,
        *,
        name: str | Keep = KEEP,
        models: Sequence[str] | Keep | None = KEEP,
        rpm: int | Keep | None = KEEP,
        tpm: int | Keep | None = KEEP,
        budget_tokens: int | Keep | None = KEEP,
        period: str | Keep | None = KEEP,
        expires_at: datetime | Keep | None = KEEP,
        admin_role: str | Keep | None = KEEP,
        user_rpm: int | Keep | None = KEEP,
        user_tpm: int | Keep | None = KEEP,
        user_budget_tokens: int | Keep | None = KEEP,
    ) -> ApiKey: ...

    async def revoke(self, ref: str) -> ApiKey: ...

    async def rotate(self, ref: str) -> tuple[ApiKey, str]: ...


class UsageSource(Protocol):
    """`llmgw.store.UsageRepository` satisfies this."""

    async def query(
        self,
        *,
        key_id: str | None = None,
        model: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        group_by: Sequence[UsageDimension] = ("key", "model"),
        top: int | None = None,
    ) -> list[UsageRow]: ...


class TeamNames(Protocol):
    """`llmgw.store.TeamRepository` satisfies this."""

    async def list(self) -> builtins.list[Team]: ...


class TeamFinder(Protocol):
    """`llmgw.store.TeamRepository` satisfies this."""

    async def find(self, ref: str) -> Team | None: ...


@dataclass(frozen=True, slots=True)
class TeamPageSources:
    """What the team pages (`llmgw.web.team_page`) read and change."""

    access: TeamAccess
    teams: TeamFinder
    keys: KeyService
    usage: UsageRepository


class HistorySource(Protocol):
    """`llmgw.metrics.MetricsHistory` satisfies this."""

    window: float

    def now(self) -> float: ...

    def points(self) -> list[HistoryPoint]: ...


@dataclass(frozen=True, slots=True)
class DashboardSources:
    """Everything the dashboard shows or changes; build it in the composition root.

    Reads (synchronous, cheap, in-memory):
      nodes()           GET /admin/api/nodes -> "nodes": one `node_view` per node
      node_briefs()     what the nodes page filters and counts, per node: id, hostname,
                        state, draining, labels, fabric (cheap: no GPUs, no shards)
      node_views(ids)   the `node_view` of each of those nodes (unknown ids left out)
      models()          GET /admin/api/models: {"models": [view...], "skipped": [...]}
      model(name)       GET /admin/api/models/{name} (name or alias); None if unknown
      placement(name)   GET /admin/api/models/{name}/placement (`explain`)
      events()          GET /admin/api/events -> "events", newest first
      leader()          GET /admin/api/leader
      servers()         GET /admin/api/servers -> "servers", as this server last read them
    Actions (raise `ActionError`):
      set_draining(node_id, draining)   POST /admin/api/nodes/{id}/drain|undrain
      add_model(spec)                   POST /admin/api/models (spec: the parsed body)
      replace_model(name, spec)         PUT /admin/api/models/{name}
      remove_model(name)                DELETE /admin/api/models/{name}
      activate(name)                    POST /admin/api/models/{name}/activate
    Store-backed (their own exceptions: `KeyInputError`, `StoreError`):
      keys, usage, teams (for the team names of usage by team; None: no teams),
      team_pages (a team's keys and usage at /admin/teams/T; None: no such pages)
    Metrics:
      history           the router's last hour (requests/s, error rate, TTFT)
      wall_clock        aware UTC now, for usage ranges and key states
    Router:
      queue(name)       this router's queue and saturation for the model (None: nothing)
    Security:
      agent_listener    how the agent listener authenticates nodes: {"mode": "cluster" |
                        "own" | "insecure" | "off", "text": a sentence for the overview}
    """

    nodes: Callable[[], list[Json]]
    node_briefs: Callable[[], list[Json]]
    node_views: Callable[[Sequence[str]], list[Json]]
    models: Callable[[], Json]
    model: Callable[[str], Json | None]
    placement: Callable[[str], Json]
    events: Callable[[], list[Json]]
    leader: Callable[[], Json]
    servers: Callable[[], list[Json]]
    set_draining: Callable[[str, bool], Json]
    add_model: Callable[[object], Awaitable[Json]]
    replace_model: Callable[[str, object], Awaitable[Json]]
    remove_model: Callable[[str], Awaitable[Json]]
    activate: Callable[[str], Awaitable[Json]]
    keys: KeyManager
    usage: UsageSource
    history: HistorySource
    wall_clock: Callable[[], datetime]
    agent_listener: Json = field(default_factory=lambda: {"mode": "off", "text": ""})
    # This router's queue for a model (GET /admin/api/queue's entry); None: nothing known.
    queue: Callable[[str], Json | None] = field(default=lambda name: None)
    teams: TeamNames | None = None
    # The team pages (/admin/teams/T); None: the dashboard has none.
    team_pages: TeamPageSources | None = None
