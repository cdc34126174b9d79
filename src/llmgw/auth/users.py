"""Managing the people who log in to the admin pages: create, list, disable, change
password, set role.

`UserService` is what `llmgw users` uses. It checks names and passwords
(`UserInputError` says what is wrong), hashes passwords with argon2id in a worker
thread, and hands the store only the hash. Changing a password or disabling a
user logs that user out everywhere.

Not guaranteed: that a server notices at once; each request re-reads the
session's user, so a disabled user's next request is refused, but a request
already in flight finishes.
"""

from __future__ import annotations

import builtins
import re

from llmgw.auth.errors import UserInputError
from llmgw.auth.passwords import Passwords, check_password
from llmgw.auth.roles import check_role
from llmgw.store import User, UserRepository
from llmgw.store.users import MAX_USER_NAME

# Letters, digits and . _ @ - : what fits in a log line, a URL and a shell
# argument without quoting, and allows e-mail addresses as names.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")


def check_user_name(name: str) -> None:
    """`UserInputError` unless `name` is acceptable for a new user."""
    if not name or len(name) > MAX_USER_NAME or not _NAME.match(name):
        raise UserInputError(
            f"user name {name!r} is not allowed: use 1 to {MAX_USER_NAME} letters, digits "
            "and . _ @ -, starting with a letter or digit"
        )


class UserService:
    """Create, list, disable users and set their passwords."""

    def __init__(self, *, users: UserRepository, passwords: Passwords) -> None:
        self._users = users
        self._passwords = passwords

    async def create(self, name: str, password: str, *, role: str | None) -> User:
        """A new user with `role` (admin, operator, viewer; None: no admin access);
        `UserInputError` for a bad name, role or a weak password, `AlreadyExists`
        (from the store) when the name is taken."""
        check_user_name(name)
        admin_role = check_role(role)
        check_password(password)
        return await self._users.create(
            name, await self._passwords.hash(password), admin_role=admin_role
        )

    async def set_role(self, name: str, role: str | None) -> User:
        """Give a user another role (None: no admin access); `NotFound` for no such user.
        The user's open sessions get the new role at their next request."""
        return await self._users.set_role(name, check_role(role))

    async def set_password(self, name: str, password: str) -> User:
        """Give a user a new password and end its sessions; `NotFound` for no such user."""
        check_password(password)
        new_hash = await self._passwords.hash(password)
        return await self._users.set_password(name, new_hash, end_sessions=True)

    async def disable(self, name: str) -> User:
        """Stop a user from logging in and end its sessions; `NotFound` for no such user."""
        return await self._users.disable(name)

    async def list(self) -> builtins.list[User]:
        """Every user, disabled ones included, oldest first."""
        return await self._users.list()
