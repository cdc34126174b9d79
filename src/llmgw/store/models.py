"""Domain objects the store takes and returns: plain frozen dataclasses.

Nothing here knows about SQL; repositories map rows to these types and back, so
callers never hold ORM or Core row objects. Every datetime is timezone-aware UTC.

Not guaranteed: that an object is current. It is a snapshot of a row at the time it
was read; re-read (or use `KeyRepository.changed_since`) to observe later changes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, datetime
from enum import Enum
from typing import Literal

from llmgw.store.errors import InvalidValue

BudgetPeriod = Literal["day", "month"]
BUDGET_PERIODS: tuple[BudgetPeriod, ...] = ("day", "month")
# A key's class in the router's queue, highest first.
KeyPriority = Literal["interactive", "default", "batch"]
# What a key may do besides calling models. `debug`: the router explains its choice
# of replica (`x-llmgw-route`), which tells whether any key sent a prompt lately.
KeyScope = Literal["debug"]
KEY_SCOPES: tuple[KeyScope, ...] = ("debug",)
# What a user or an admin API key may do on the admin surface (llmgw.auth.roles):
# `admin` everything, `operator` the fleet (drain, models, activation, join tokens)
# but no keys, users or usage, `viewer` read the fleet only. None: no admin access.
AdminRole = Literal["admin", "operator", "viewer"]
ADMIN_ROLES: tuple[AdminRole, ...] = ("admin", "operator", "viewer")
# The longest model name a usage record holds; the router refuses requests naming
# a longer one, so every request it records fits.
MAX_MODEL_CHARS = 256
# The longest end user (a request's `user`) the router accepts and a usage record holds.
MAX_END_USER_CHARS = 256
KEY_PRIORITIES: tuple[KeyPriority, ...] = ("interactive", "default", "batch")

# A user's role in a team: `team-admin` manages the team's keys and sees its usage;
# `member` belongs to it (and sees its usage).
TeamRole = Literal["team-admin", "member"]
TEAM_ROLES: tuple[TeamRole, ...] = ("team-admin", "member")

UsageDimension = Literal["hour", "day", "team", "key", "end-user", "model"]
USAGE_DIMENSIONS: tuple[UsageDimension, ...] = ("hour", "day", "team", "key", "end-user", "model")


def utc_now() -> datetime:
    """The default clock of the store: the current time, timezone-aware UTC."""
    return datetime.now(UTC)


def require_aware(field: str, value: datetime | None) -> None:
    """Refuse a naive datetime: the store would have to guess its time zone."""
    if value is not None and value.tzinfo is None:
        raise InvalidValue(
            f"{field}={value.isoformat()} has no time zone; pass an aware UTC datetime"
        )


def truncate_to_hour(ts: datetime) -> datetime:
    """The start of the UTC hour containing `ts` (which must be timezone-aware)."""
    return ts.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True, slots=True)
class NewApiKey:
    """What the caller decides about a key before it exists.

    The store never sees the secret: `prefix` (its first characters, shown to
    people to tell keys apart) and `secret_hash` (SHA-256 hex of the whole
    secret) are all it keeps. `None` limits mean unlimited; `models=None` means
    every model.
    """

    name: str
    prefix: str
    secret_hash: str
    models: tuple[str, ...] | None = None
    rpm: int | None = None
    tpm: int | None = None
    budget_tokens: int | None = None
    budget_period: BudgetPeriod | None = None
    expires_at: datetime | None = None
    admin_role: AdminRole | None = None
    priority: KeyPriority = "default"
    weight: float = 1.0
    max_queue_wait: float | None = None
    scopes: tuple[KeyScope, ...] = ()
    # The team the key belongs to (its id); None: no team.
    team_id: str | None = None
    # Limits per end user of the key's application (see `ApiKey`).
    user_rpm: int | None = None
    user_tpm: int | None = None
    user_budget_tokens: int | None = None


class Keep(Enum):
    """The type of `KEEP`: a `KeyChanges` field left as stored.

    An enum with one member, so that `isinstance(value, Keep)` narrows the type
    for mypy and `None` stays free to mean "clear this limit".
    """

    KEEP = "keep"


KEEP = Keep.KEEP


@dataclass(frozen=True, slots=True)
class KeyChanges:
    """What to change in an existing key; every field left at `KEEP` stays as stored.

    `None` clears an optional limit, with the same meaning as in `NewApiKey`:
    `models=None` allows every model, `rpm`/`tpm`/`budget_tokens=None` mean no
    limit, `expires_at=None` means never. A budget needs a period and a period
    needs a budget in the key as it will be after the change, so clearing a
    budget means clearing both `budget_tokens` and `budget_period`. The secret
    cannot be changed here (that is `KeyRepository.rotate`), nor can a key be
    revoked or un-revoked.
    """

    name: str | Keep = KEEP
    models: tuple[str, ...] | Keep | None = KEEP
    rpm: int | Keep | None = KEEP
    tpm: int | Keep | None = KEEP
    budget_tokens: int | Keep | None = KEEP
    budget_period: BudgetPeriod | Keep | None = KEEP
    expires_at: datetime | Keep | None = KEEP
    admin_role: AdminRole | Keep | None = KEEP
    priority: KeyPriority | Keep = KEEP
    weight: float | Keep = KEEP
    max_queue_wait: float | Keep | None = KEEP
    scopes: tuple[KeyScope, ...] | Keep = KEEP
    team_id: str | Keep | None = KEEP
    user_rpm: int | Keep | None = KEEP
    user_tpm: int | Keep | None = KEEP
    user_budget_tokens: int | Keep | None = KEEP

    def changed(self) -> dict[str, object]:
        """The fields that are not `KEEP`, by name, with their new values."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if value is not KEEP}


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key as stored: identity, limits and lifecycle timestamps.

    `updated_at` moves on create, update, revoke and rotate; router processes poll
    `KeyRepository.changed_since` with it to refresh their caches.
    """

    id: str
    name: str
    prefix: str
    secret_hash: str
    models: tuple[str, ...] | None
    rpm: int | None
    tpm: int | None
    budget_tokens: int | None
    budget_period: BudgetPeriod | None
    expires_at: datetime | None
    # The key's role on the admin API; None: a client key, no admin access.
    admin_role: AdminRole | None
    created_at: datetime
    updated_at: datetime
    revoked_at: datetime | None
    # How its requests queue while a model is saturated (router.queue): class,
    # fair-share weight, and the longest wait in seconds (None: the router's default).
    priority: KeyPriority = "default"
    weight: float = 1.0
    max_queue_wait: float | None = None
    scopes: tuple[KeyScope, ...] = ()
    team_id: str | None = None
    # The key's team as read with the key (its limits apply to the key's requests too).
    team: Team | None = None
    # Limits of each end user of the key's application (the `user` its requests name),
    # counted per (key, end user): requests and tokens per minute, tokens per UTC day.
    # None: no limit. Requests that name no end user are held to the key's limits only.
    user_rpm: int | None = None
    user_tpm: int | None = None
    user_budget_tokens: int | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_admin(self) -> bool:
        """Whether the key has the `admin` role (may do everything)."""
        return self.admin_role == "admin"

    def is_active(self, now: datetime) -> bool:
        """Not revoked and not expired at `now`."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def allows_model(self, model: str) -> bool:
        return self.models is None or model in self.models


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One finished request, as the router reports it.

    `key_id` is None in open mode (no keys configured). `ttft_ms` is the time to
    the first token of a streamed answer, None when not streamed or when no token
    came.
    """

    ts: datetime
    request_id: str
    key_id: str | None
    model: str
    endpoint: str
    status: int
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    ttft_ms: float | None
    streamed: bool
    # Time spent in the router's queue waiting for a replica with room.
    queue_ms: float = 0.0
    # The client route (/v1/chat/completions, /v1/rerank, ...); "" in rows from before it was kept.
    route: str = ""
    # Times a stream was continued on another replica after its engine failed mid-stream.
    continued: int = 0
    # The model version that answered, for a model with a canary ("" otherwise).
    version: str = ""
    # The end user the request named (`user`; Anthropic `metadata.user_id`); "" for none.
    end_user: str = ""
    # For a request to a catalog LoRA adapter, its base model ("" for any other); kept
    # per adapter (the latest wins) for the reports, not per request.
    base: str = ""


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One row of a usage report, summed from the roll-ups.

    `hour`, `key_id`, `model` and `day` (midnight UTC) are None when the report
    is not grouped by them; `key_id` is also None for requests made without a key
    (open mode).
    """

    hour: datetime | None
    key_id: str | None
    model: str | None
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    latency_ms_sum: float
    day: datetime | None = None
    # The team the row's keys belong to now (None: no team, or not grouped by team).
    team_id: str | None = None
    # The end user (None: not grouped by end user).
    end_user: str | None = None
    # The base model of an adapter (None: not grouped by model, or not an adapter).
    base: str | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def mean_latency_ms(self) -> float:
        return self.latency_ms_sum / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class Team:
    """A team: a name, and limits that all of its keys' requests share.

    `None` limits mean unlimited; `models=None` means every model. A budget
    needs its period. `updated_at` moves on every change (and the team's keys'
    `updated_at` with it, so routers' key caches see the new limits).
    """

    id: str
    name: str
    rpm: int | None
    tpm: int | None
    budget_tokens: int | None
    budget_period: BudgetPeriod | None
    models: tuple[str, ...] | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class TeamLimits:
    """A team's limits, for creating a team or changing one (fields at `KEEP` stay)."""

    rpm: int | Keep | None = KEEP
    tpm: int | Keep | None = KEEP
    budget_tokens: int | Keep | None = KEEP
    budget_period: BudgetPeriod | Keep | None = KEEP
    models: tuple[str, ...] | Keep | None = KEEP
    name: str | Keep = KEEP

    def changed(self) -> dict[str, object]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if value is not KEEP}


@dataclass(frozen=True, slots=True)
class TeamMember:
    """A user's membership of a team."""

    team_id: str
    user_name: str
    role: TeamRole
    added_at: datetime
