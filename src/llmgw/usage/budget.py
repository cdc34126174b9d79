"""The budget source of a router process: the store's usage plus what it has not written.

A key's budget (`llmgw.limits`) is checked against the tokens it used in the
period, read from the usage store now and then. Records this process served but
has not written yet (queued), or could not write at all (dropped: the store
refused one record, or stayed down past the retries), are not in the store; the
limiter would forget their tokens at its next read. `RecordedUsage` adds them,
from the recorder (`UsageRecorder.unwritten_tokens`), so a budget counts what
was served whether or not its records landed.

A team's budget (`key_id` "team:" and the team's id, see `llmgw.limits`) is
read as the stored tokens of every key that belongs to the team now; an end
user's ("user:KEY:END_USER") as the stored tokens of that end user of that key.

Not guaranteed: that other processes' unwritten tokens count here (each process
adds its own; Redis-shared budgets keep their own counters), nor that dropped
records count after this process restarts, nor that unwritten tokens count
towards a team's or an end user's budget (only their stored tokens do; with Redis, its shared
counter holds every admitted request).
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from llmgw.limits import TEAM_PREFIX, split_end_user


class StoredUsage(Protocol):
    """Tokens in the store (`UsageRepository` is one)."""

    async def tokens_used(self, key_id: str, since: datetime) -> int: ...

    async def team_tokens_used(self, team_id: str, since: datetime) -> int: ...

    async def end_user_tokens_used(self, key_id: str, end_user: str, since: datetime) -> int: ...


class UnwrittenUsage(Protocol):
    """Tokens served but not in the store (`UsageRecorder` is one)."""

    def unwritten_tokens(self, key_id: str, since: datetime) -> int: ...


class RecordedUsage:
    """A `BudgetSource`: the store's answer plus this process's unwritten tokens."""

    def __init__(self, *, stored: StoredUsage, unwritten: UnwrittenUsage) -> None:
        self._stored = stored
        self._unwritten = unwritten

    async def tokens_used(self, key_id: str, since: datetime) -> int:
        """Prompt + completion tokens of `key_id` (or of team "team:ID") from the hour
        containing `since` on."""
        if key_id.startswith(TEAM_PREFIX):
            return await self._stored.team_tokens_used(key_id[len(TEAM_PREFIX) :], since)
        end_user = split_end_user(key_id)
        if end_user is not None:
            return await self._stored.end_user_tokens_used(*end_user, since)
        stored = await self._stored.tokens_used(key_id, since)
        # Read after the store answered: a batch written meanwhile has left the tally.
        return stored + self._unwritten.unwritten_tokens(key_id, since)
