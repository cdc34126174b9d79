"""The values the router hands the limiter and gets back: limits, admissions, budget source.

These are plain data and one Protocol; no behaviour lives here. `KeyLimits`
validates itself on construction so a bad limit fails where it is built (the
auth layer), not on some later request.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

BudgetPeriod = Literal["day", "month"]
# The start of a team's `KeyLimits.key_id` (then the team's id): keys and teams never
# share counters.
TEAM_PREFIX = "team:"
# The start of an end user's `KeyLimits.key_id`: "user:", the key's id, ":" and the end
# user as the request named it (see `end_user_limits`).
END_USER_PREFIX = "user:"


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """The limits of one API key. `None` means unlimited for that dimension.

    `rpm`/`tpm` are per-minute rates (>= 1); `budget_tokens` is the number of
    tokens (prompt + completion) the key may use per UTC `budget_period`.
    """

    key_id: str
    rpm: int | None
    tpm: int | None
    budget_tokens: int | None
    budget_period: BudgetPeriod | None
    # What the limits belong to, as refusals name it: a key (`key_id` is its id) or
    # a team (`key_id` is "team:" and the team's id, `label` the team's name). The
    # limiter counts every `key_id` on its own, so a team's keys share its counters.
    # An end user's limits (`key_id` "user:KEY:END_USER") are counted per key and end
    # user; `label` then says which end user of which key, as refusals name it.
    scope: Literal["key", "team", "end-user"] = "key"
    label: str = ""

    def __post_init__(self) -> None:
        for name, value in (("rpm", self.rpm), ("tpm", self.tpm)):
            if value is not None and value < 1:
                raise ValueError(
                    f"KeyLimits({self.key_id!r}): {name} must be >= 1 or None (unlimited), "
                    f"got {value}; to block a key, disable it instead"
                )
        if self.budget_tokens is not None:
            if self.budget_tokens < 0:
                raise ValueError(
                    f"KeyLimits({self.key_id!r}): budget_tokens must be >= 0 or None, "
                    f"got {self.budget_tokens}"
                )
            if self.budget_period not in ("day", "month"):
                raise ValueError(
                    f"KeyLimits({self.key_id!r}): budget_tokens is set, so budget_period "
                    f"must be 'day' or 'month', got {self.budget_period!r}"
                )

    @property
    def subject(self) -> str:
        """How refusals name the owner of these limits: "key 'key_1'", "team 'ml'",
        "end user 'u1' of API key 'app'"."""
        if self.scope == "end-user":
            return f"end user {self.label}"
        return f"{self.scope} {(self.label or self.key_id)!r}"

    @property
    def owner(self) -> str:
        """Whose budget an administrator raises: "key's", "team's", "key's end-user"."""
        return "key's end-user" if self.scope == "end-user" else f"{self.scope}'s"

    @property
    def unlimited(self) -> bool:
        return self.rpm is None and self.tpm is None and self.budget_tokens is None


def end_user_limits(
    *,
    key_id: str,
    key_name: str,
    end_user: str,
    rpm: int | None,
    tpm: int | None,
    budget_tokens: int | None,
) -> KeyLimits:
    """The limits of one end user of a key's application: its own counters (per key
    and end user), a budget per UTC day."""
    return KeyLimits(
        key_id=f"{END_USER_PREFIX}{key_id}:{end_user}",
        rpm=rpm,
        tpm=tpm,
        budget_tokens=budget_tokens,
        budget_period="day" if budget_tokens is not None else None,
        scope="end-user",
        label=f"{end_user!r} of API key {key_name!r}",
    )


def split_end_user(limits_key_id: str) -> tuple[str, str] | None:
    """(key id, end user) of an end user's `KeyLimits.key_id`; None for any other."""
    if not limits_key_id.startswith(END_USER_PREFIX):
        return None
    key_id, _, end_user = limits_key_id[len(END_USER_PREFIX) :].partition(":")
    return key_id, end_user


@dataclass(slots=True)
class Admission:
    """What `Limiter.admit` hands back for a request it let through.

    `headers` are the x-ratelimit-* headers for the successful response (empty
    when the key has no RPM/TPM limit); treat them as read-only, an unlimited
    key's admission is shared between requests. `estimated_tokens` is what
    was counted against the key at admission (0 for unlimited keys, which
    count nothing). Pass the admission back to `Limiter.settle` exactly once.
    """

    headers: list[tuple[bytes, bytes]]
    estimated_tokens: int
    # The budget period the estimate was charged to ("" when none), so that a
    # request that straddles midnight is settled against the period it used.
    period_id: str = ""
    # True when the request was counted in Redis, False when in process memory.
    shared: bool = False


class BudgetSource(Protocol):
    """Tokens a key has used since a time, as recorded by all router processes.

    Implemented by the usage store. Called once per (key, period) and then
    every `budget_refresh_s` while the key is active, never per request. For a
    team's limits `key_id` is "team:" and the team's id: the tokens of all the
    team's keys; for an end user's, "user:KEY:END_USER" (`split_end_user`).
    """

    async def tokens_used(self, key_id: str, since: datetime) -> int: ...
