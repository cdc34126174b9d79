"""Managing API keys: create, list, update, revoke and rotate, for the CLI and the admin API.

`KeyService` validates what people type (raising `KeyInputError` naming the
field), makes the secret, and hands the store only its hash and prefix. The
secret is returned once, by `create` and `rotate`, and kept nowhere. `update`
changes a key's name, models, limits, expiry, admin role or scopes and keeps its
secret.

Not guaranteed: that a change is visible to routers at once. Each router
process sees an update, revoke or rotate at its next poll (a few seconds). Nor
atomicity across processes beyond what the store gives: two admins creating
the same name at once get one key and one `Conflict`.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from datetime import datetime

from llmgw.auth.errors import KeyInputError, UserInputError, escape
from llmgw.auth.roles import check_role
from llmgw.auth.tokens import generate_secret, hash_secret, looks_like_secret, secret_prefix
from llmgw.store import (
    KEEP,
    KEY_SCOPES,
    AdminRole,
    ApiKey,
    BudgetPeriod,
    Keep,
    KeyChanges,
    KeyPriority,
    KeyRepository,
    KeyScope,
    NewApiKey,
    NotFound,
)

MAX_NAME = 200
PERIODS: tuple[BudgetPeriod, ...] = ("day", "month")
PRIORITIES: tuple[KeyPriority, ...] = ("interactive", "default", "batch")
_CREATE_HINTS = ("leave it out for no limit", "leave it out to allow every model")
_UPDATE_HINTS = ("clear it for no limit", "clear it to allow every model")


class KeyService:
    """Create, list, update, revoke and rotate API keys in the store."""

    def __init__(
        self,
        *,
        keys: KeyRepository,
        wall_clock: Callable[[], datetime],
        new_secret: Callable[[], str] = generate_secret,
    ) -> None:
        self._keys = keys
        self._wall_clock = wall_clock
        self._new_secret = new_secret

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
        priority: str = "default",
        weight: float = 1.0,
        max_queue_wait: float | None = None,
        scopes: Sequence[str] = (),
        team_id: str | None = None,
        user_rpm: int | None = None,
        user_tpm: int | None = None,
        user_budget_tokens: int | None = None,
    ) -> tuple[ApiKey, str]:
        """Create a key; returns it and its secret, which cannot be read again.

        `KeyInputError` for invalid arguments; the store's `Conflict` if an
        active key already has this name.
        """
        spec_name = _check_name(name)
        spec_models = _check_models(models, hint=_CREATE_HINTS[1])
        for field, value in (
            ("rpm", rpm),
            ("tpm", tpm),
            ("budget_tokens", budget_tokens),
            ("user_rpm", user_rpm),
            ("user_tpm", user_tpm),
            ("user_budget_tokens", user_budget_tokens),
        ):
            _check_limit(field, value, hint=_CREATE_HINTS[0])
        budget_period = _check_period(budget_tokens, period)
        self._check_expiry(expires_at)
        key_priority = check_priority(priority)
        _check_weight(weight)
        _check_wait(max_queue_wait)
        key_scopes = check_scopes(scopes)
        key_role = check_key_role(admin_role)
        secret = self._new_secret()
        key = await self._keys.create(
            NewApiKey(
                name=spec_name,
                prefix=secret_prefix(secret),
                secret_hash=hash_secret(secret),
                models=spec_models,
                rpm=rpm,
                tpm=tpm,
                budget_tokens=budget_tokens,
                budget_period=budget_period,
                expires_at=expires_at,
                admin_role=key_role,
                priority=key_priority,
                weight=weight,
                max_queue_wait=max_queue_wait,
                scopes=key_scopes,
                team_id=team_id,
                user_rpm=user_rpm,
                user_tpm=user_tpm,
                user_budget_tokens=user_budget_tokens,
            )
        )
        return key, secret

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
        priority: str | Keep = KEEP,
        weight: float | Keep = KEEP,
        max_queue_wait: float | Keep | None = KEEP,
        scopes: Sequence[str] | Keep = KEEP,
        team_id: str | Keep | None = KEEP,
        user_rpm: int | Keep | None = KEEP,
        user_tpm: int | Keep | None = KEEP,
        user_budget_tokens: int | Keep | None = KEEP,
    ) -> ApiKey:
        """Change the key named by `ref`, keeping its secret; returns the key after.

        An argument left at `KEEP` stays as stored; `None` clears a limit
        (`models=None`: every model; `expires_at=None`: never). Clearing
        `budget_tokens` without naming `period` clears the period too. The
        budget check sees the key's current values: a budget given alone keeps
        the stored period, and a period given alone needs a stored budget.
        `KeyInputError` for invalid arguments; the store's `NotFound`,
        `Ambiguous`, `Conflict` (a revoked key; a name another active key has)
        and `InvalidValue` (nothing to change) come through unchanged.
        """
        if isinstance(name, str):
            name = _check_name(name)
        if not isinstance(models, Keep):
            models = _check_models(models, hint=_UPDATE_HINTS[1])
        for field, value in (
            ("rpm", rpm),
            ("tpm", tpm),
            ("budget_tokens", budget_tokens),
            ("user_rpm", user_rpm),
            ("user_tpm", user_tpm),
            ("user_budget_tokens", user_budget_tokens),
        ):
            if not isinstance(value, Keep):
                _check_limit(field, value, hint=_UPDATE_HINTS[0])
        if not isinstance(expires_at, Keep):
            self._check_expiry(expires_at)
        key_priority = priority if isinstance(priority, Keep) else check_priority(priority)
        if not isinstance(weight, Keep):
            _check_weight(weight)
        if not isinstance(max_queue_wait, Keep):
            _check_wait(max_queue_wait)
        key_scopes = scopes if isinstance(scopes, Keep) else check_scopes(scopes)
        key_role = admin_role if isinstance(admin_role, Keep) else check_key_role(admin_role)
        key = await self.resolve(ref)
        budget_period: BudgetPeriod | Keep | None = KEEP
        if budget_tokens is None and isinstance(period, Keep):
            period = None  # a budget's period goes with it
        if not isinstance(budget_tokens, Keep) or not isinstance(period, Keep):
            checked = _check_period(
                key.budget_tokens if isinstance(budget_tokens, Keep) else budget_tokens,
                key.budget_period if isinstance(period, Keep) else period,
            )
            budget_period = KEEP if isinstance(period, Keep) else checked
        changes = KeyChanges(
            name=name,
            models=models,
            rpm=rpm,
            tpm=tpm,
            budget_tokens=budget_tokens,
            budget_period=budget_period,
            expires_at=expires_at,
            admin_role=key_role,
            priority=key_priority,
            weight=weight,
            max_queue_wait=max_queue_wait,
            scopes=key_scopes,
            team_id=team_id,
            user_rpm=user_rpm,
            user_tpm=user_tpm,
            user_budget_tokens=user_budget_tokens,
        )
        return await self._keys.update(key.id, changes)

    def _check_expiry(self, expires_at: datetime | None) -> None:
        if expires_at is None:
            return
        if expires_at.tzinfo is None:
            raise KeyInputError("expires_at", "needs a time zone (give it in UTC)")
        now = self._wall_clock()
        if expires_at <= now:
            raise KeyInputError(
                "expires_at",
                f"is in the past ({expires_at:%Y-%m-%d %H:%M:%S} UTC, now is "
                f"{now:%Y-%m-%d %H:%M:%S} UTC); give a future date",
            )

    async def list(
        self, *, include_revoked: bool = False, team_id: str | None = None
    ) -> builtins.list[ApiKey]:
        """Every key (of team `team_id` when given), oldest first; revoked ones only when
        asked."""
        return await self._keys.list(include_revoked=include_revoked, team_id=team_id)

    async def resolve(self, ref: str) -> ApiKey:
        """The key named by `ref`: an id, a name, a prefix, or the whole secret.

        The store's `NotFound` if nothing matches, `Ambiguous` if several keys do.
        """
        ref = ref.strip()
        if not ref:
            raise KeyInputError("ref", "is empty; give a key id, name or prefix")
        if looks_like_secret(ref):
            key = await self._keys.get_by_hash(hash_secret(ref))
            if key is not None:
                return key
        key = await self._keys.find(ref)
        if key is None:
            raise NotFound(
                f"no key has the id, name or prefix {ref!r}; "
                "`llmgw keys list --all` shows every key"
            )
        return key

    async def revoke(self, ref: str) -> ApiKey:
        """Revoke the key named by `ref`; revoking a revoked key changes nothing."""
        key = await self.resolve(ref)
        return await self._keys.revoke(key.id)

    async def rotate(self, ref: str) -> tuple[ApiKey, str]:
        """Give the key named by `ref` a new secret, keeping its id, name and limits.

        Returns the key and the new secret; the old secret stops working. The
        store's `Conflict` for a revoked key.
        """
        key = await self.resolve(ref)
        secret = self._new_secret()
        rotated = await self._keys.rotate(
            key.id, new_prefix=secret_prefix(secret), new_hash=hash_secret(secret)
        )
        return rotated, secret


def _check_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > MAX_NAME:
        raise KeyInputError("name", f"must be 1 to {MAX_NAME} characters")
    return name


def _check_limit(field: str, value: int | None, *, hint: str) -> None:
    if value is not None and value < 1:
        raise KeyInputError(field, f"must be at least 1 ({hint}), got {value}")


def _check_models(models: Sequence[str] | None, *, hint: str) -> tuple[str, ...] | None:
    if models is None:
        return None
    if isinstance(models, str):
        raise KeyInputError("models", "must be a list of model names, not one string")
    cleaned: list[str] = []
    for raw in models:
        model = raw.strip()
        if not model:
            raise KeyInputError("models", f"has an empty model name in {escape(list(models))}")
        if model not in cleaned:
            cleaned.append(model)
    if not cleaned:
        raise KeyInputError("models", f"lists no model; {hint}")
    return tuple(cleaned)


def check_priority(priority: str) -> KeyPriority:
    """`priority` as a queue class; `KeyInputError` naming the choices if it is none."""
    for known in PRIORITIES:
        if priority == known:
            return known
    raise KeyInputError(
        "priority", f"must be interactive, default or batch, got {escape(priority)}"
    )


def check_key_role(role: str | None) -> AdminRole | None:
    """`role` as a key's admin role (None: a client key); `KeyInputError` naming the
    choices for anything else."""
    try:
        return check_role(role)
    except UserInputError:
        raise KeyInputError(
            "role", f"must be admin, operator, viewer or none (a client key), got {escape(role)}"
        ) from None


def check_scopes(scopes: Sequence[str]) -> tuple[KeyScope, ...]:
    """`scopes` without repeats, in the order given; `KeyInputError` naming the
    choices for one that is none (an empty list: the key only calls models)."""
    if isinstance(scopes, str):
        raise KeyInputError("scopes", "must be a list of scopes, not one string")
    checked: list[KeyScope] = []
    for scope in scopes:
        known = next((k for k in KEY_SCOPES if k == scope), None)
        if known is None:
            raise KeyInputError(
                "scopes",
                f"takes {', '.join(KEY_SCOPES)} (an empty list: the key only calls models), "
                f"got {escape(scope)}",
            )
        if known not in checked:
            checked.append(known)
    return tuple(checked)


def _check_weight(weight: float) -> None:
    if not (0 < weight <= 1000):
        raise KeyInputError(
            "weight", f"must be more than 0 and at most 1000 (1 is an equal share), got {weight}"
        )


def _check_wait(seconds: float | None) -> None:
    if seconds is not None and not (0 <= seconds <= 86400):
        raise KeyInputError(
            "max_queue_wait",
            f"must be 0 to 86400 seconds (clear it for the router's default), got {seconds}",
        )


def _check_period(budget_tokens: int | None, period: str | None) -> BudgetPeriod | None:
    if period is not None and period not in PERIODS:
        raise KeyInputError("period", f"must be day or month, got {escape(period)}")
    if budget_tokens is not None and period is None:
        raise KeyInputError("budget_tokens", "needs {period} day|month")
    if period is not None and budget_tokens is None:
        raise KeyInputError("period", "only applies with {budget_tokens}; add it or drop {period}")
    for known in PERIODS:
        if period == known:
            return known
    return None
