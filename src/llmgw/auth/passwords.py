"""Password hashing for people who log in: argon2id, off the event loop.

Unlike API key secrets (random, hashed with plain SHA-256), passwords are chosen
by people and can be guessed, so each hash is salted and deliberately slow:
argon2id with argon2-cffi's defaults (RFC 9106 "low memory": 3 passes over
64 MiB, 4 lanes; about 50-100 ms). Hashing and verifying run in a worker thread
so a login never stalls the requests being proxied. The server hands in a small
thread pool of the logins' own (`executor`): then at most its few threads hash
at once (bounding the memory argon2 takes, 64 MiB each), nothing else of the
process (store drivers, file reads) waits behind a burst of logins, and at most
`max_waiting` hashes queue for a thread; one more is refused at once with
`PasswordsBusy` instead of queueing without end.

`verify_nobody` spends the same time on a stored dummy hash, for logins naming a
user that does not exist: the answer then comes as slowly as a wrong password's,
and response times do not reveal which names exist.

Not guaranteed: resistance to an attacker who can also watch this host's CPU or
memory use; that a real user logs in while a flood of logins from many
addresses keeps the pool full (they get `PasswordsBusy`, a 503, and retry).
Without `executor` (the CLI) hashing runs in asyncio's default executor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError

from llmgw.auth.errors import UserInputError

MIN_PASSWORD_LENGTH = 12
# A bound on the work one login can ask for; no real passphrase is longer.
MAX_PASSWORD_LENGTH = 1024
# Hashes that may wait for a thread of the pool before more are refused.
MAX_WAITING = 64

_T = TypeVar("_T")


class PasswordsBusy(Exception):
    """Too many password hashes are waiting for the pool; retry in a moment."""

    def __init__(self, waiting: int) -> None:
        super().__init__(
            f"too many logins are being checked at once ({waiting} waiting); retry in a few seconds"
        )


def check_password(password: str) -> None:
    """`UserInputError` unless `password` is acceptable as a new password."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise UserInputError(
            f"the password is too short: it needs at least {MIN_PASSWORD_LENGTH} characters "
            f"(got {len(password)}); a few unrelated words make a strong one"
        )
    if len(password) > MAX_PASSWORD_LENGTH:
        raise UserInputError(
            f"the password is too long: at most {MAX_PASSWORD_LENGTH} characters "
            f"(got {len(password)})"
        )


class Passwords:
    """Hash and verify passwords with argon2id in a worker thread.

    `hasher` sets the cost (tests pass a cheap one); it must be argon2id. A stored
    hash made with other parameters still verifies, and `needs_rehash` says so,
    so a login can upgrade it.
    """

    def __init__(
        self,
        *,
        hasher: PasswordHasher | None = None,
        executor: Executor | None = None,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        """`executor`: the logins' own pool (the caller shuts it down); None: asyncio's
        default executor. `max_waiting`: hashes queued or running in it before
        `PasswordsBusy`."""
        self._hasher = hasher if hasher is not None else PasswordHasher()
        if self._hasher.type is not Type.ID:
            raise ValueError("passwords are hashed with argon2id; pass a PasswordHasher of Type.ID")
        if max_waiting < 1:
            raise ValueError("max_waiting must be at least 1")
        self._executor = executor
        self._max_waiting = max_waiting
        self._waiting = 0
        self._dummy: str | None = None

    async def hash(self, password: str) -> str:
        """The argon2id encoding of `password` (salted, parameters included)."""
        return await self._run(self._hasher.hash, password)

    async def verify(self, password_hash: str, password: str) -> bool:
        """Whether `password` matches; False (never an error) for a damaged hash."""
        return await self._run(self._verify, password_hash, password)

    async def _run(self, work: Callable[..., _T], *args: str) -> _T:
        if self._waiting >= self._max_waiting:
            raise PasswordsBusy(self._waiting)
        self._waiting += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)
        finally:
            self._waiting -= 1

    def needs_rehash(self, password_hash: str) -> bool:
        """Whether the hash was made with other parameters than ours (cheap: parses only)."""
        try:
            return self._hasher.check_needs_rehash(password_hash)
        except InvalidHashError:
            return True

    async def verify_nobody(self, password: str) -> None:
        """Spend as long as a real verification, for a user that does not exist."""
        if self._dummy is None:
            # Made once per process, on first need; a password nobody knows.
            self._dummy = await self.hash("no such user: this hash matches nothing")
        await self.verify(self._dummy, password[:MAX_PASSWORD_LENGTH])

    def _verify(self, password_hash: str, password: str) -> bool:
        try:
            return self._hasher.verify(password_hash, password)
        except (VerificationError, InvalidHashError):
            return False
