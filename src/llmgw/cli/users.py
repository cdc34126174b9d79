"""`llmgw users`: the people who may log in to the admin pages on the API port.

Every command opens the store given by --data-dir/--store, applies pending
migrations, does its one change through `UserService`, and closes the store.
A password is never taken from the command line (it would stay in the shell
history and in `ps`): it is asked for twice without echo, or read from the
first line of stdin with --password-stdin.

Roles (admin, operator, viewer; `llmgw.auth.roles`) decide what a user may do
on the admin pages. These commands are not held to a role: they open the store
itself, so whoever may run them already holds its credentials.

Not guaranteed: that a running server notices at once; it re-reads the user on
every request, so a disabled user or a changed password ends those sessions at
their next request.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from llmgw.cli.storeopts import (
    DEFAULT_DATA_DIR,
    BadInput,
    DataDirOption,
    JsonOption,
    StoreOption,
    fail,
    format_time,
    iso,
    print_json,
    render_table,
    run_with_store,
)

if TYPE_CHECKING:
    from llmgw.auth import UserService
    from llmgw.store import Store, User

users_app = typer.Typer(
    name="users",
    help="Manage the people who log in to /admin on the API port: create, list, disable, passwd.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

NameArgument = Annotated[str, typer.Argument(help="The user name people log in with.")]
PasswordStdinOption = Annotated[
    bool,
    typer.Option(
        "--password-stdin",
        help="Read the password from the first line of stdin instead of asking for it.",
    ),
]


def _service(store: Store) -> UserService:
    from llmgw.auth import Passwords, UserService

    return UserService(users=store.users, passwords=Passwords())


def _read_password(from_stdin: bool) -> str:
    """The new password, checked before the store is opened."""
    from llmgw.auth import UserInputError, check_password

    if from_stdin:
        password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    else:
        try:
            password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
        except typer.Abort:
            fail("no password was given: type it twice, or pipe it in with --password-stdin")
    try:
        check_password(password)
    except UserInputError as exc:
        fail(str(exc))
    return password


def _check_name(name: str) -> None:
    from llmgw.auth import UserInputError, check_user_name

    try:
        check_user_name(name)
    except UserInputError as exc:
        fail(str(exc))


RoleOption = Annotated[
    str | None,
    typer.Option(
        "--role",
        help="What the user may do on the admin pages: admin (everything), operator (the "
        "fleet: nodes, models, activation; no keys or usage), viewer (read the fleet). "
        "Default: no role (the user can log in but sees nothing).",
        show_default=False,
    ),
]


def _chosen_role(admin: bool, role: str | None) -> str | None:
    from llmgw.auth import UserInputError, check_role

    if admin and role not in (None, "admin"):
        fail(f"--admin means --role admin; drop one of --admin and --role {role}")
    try:
        return check_role("admin" if admin else role)
    except UserInputError as exc:
        fail(str(exc))


@users_app.command("create")
def create(
    name: NameArgument,
    admin: Annotated[
        bool, typer.Option("--admin", help="Let the user see and change everything (--role admin).")
    ] = False,
    role: RoleOption = None,
    password_stdin: PasswordStdinOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Create a user who can log in at /admin/login on the API port."""
    _check_name(name)
    chosen = _chosen_role(admin, role)
    password = _read_password(password_stdin)

    async def action(opened: Store) -> User:
        from llmgw.auth import UserInputError

        try:
            return await _service(opened).create(name, password, role=chosen)
        except UserInputError as exc:
            raise BadInput(str(exc)) from None

    user = run_with_store(data_dir, store, action)
    what = f"{user.admin_role} user" if user.admin_role else "user without an admin role"
    typer.echo(f"created {what} {user.name!r}; log in at /admin/login on the API port")


@users_app.command("role")
def set_role(
    name: NameArgument,
    role: Annotated[
        str,
        typer.Argument(
            help="admin (everything), operator (the fleet, no keys or usage), viewer (read "
            "the fleet) or none (no admin access)."
        ),
    ],
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Give a user another role; its open sessions get it at their next request."""
    chosen = _chosen_role(False, role)

    async def action(opened: Store) -> User:
        return await _service(opened).set_role(name, chosen)

    user = run_with_store(data_dir, store, action)
    typer.echo(f"user {user.name!r} now has the role {user.admin_role or 'none'}")


@users_app.command("list")
def list_users(
    json_out: JsonOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """List users (never their password hashes)."""

    async def action(opened: Store) -> list[User]:
        return await _service(opened).list()

    users = run_with_store(data_dir, store, action)
    if json_out:
        print_json(
            [
                {
                    "id": u.id,
                    "name": u.name,
                    "admin": u.is_admin,
                    "role": u.admin_role,
                    "created_at": iso(u.created_at),
                    "disabled_at": iso(u.disabled_at),
                    # Signs in through single sign-on (no password here): its issuer.
                    "sso_issuer": u.sso_issuer,
                }
                for u in users
            ]
        )
        return
    if not users:
        typer.echo("no users (llmgw users create NAME --admin adds one)")
        return
    rows = [
        [
            u.name,
            u.admin_role or "none",
            "sso" if u.is_sso else "password",
            format_time(u.created_at),
            f"disabled {format_time(u.disabled_at)}" if u.disabled else "active",
        ]
        for u in users
    ]
    typer.echo(render_table(["NAME", "ROLE", "LOGIN", "CREATED", "STATE"], rows))


@users_app.command("disable")
def disable(
    name: NameArgument,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Stop a user from logging in and end its sessions."""

    async def action(opened: Store) -> User:
        return await _service(opened).disable(name)

    user = run_with_store(data_dir, store, action)
    typer.echo(
        f"disabled user {user.name!r} (since {format_time(user.disabled_at)} UTC); "
        "its sessions are ended"
    )


@users_app.command("passwd")
def passwd(
    name: NameArgument,
    password_stdin: PasswordStdinOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Set a user's password; the user is logged out everywhere."""
    password = _read_password(password_stdin)

    async def action(opened: Store) -> User:
        from llmgw.auth import UserInputError

        try:
            return await _service(opened).set_password(name, password)
        except UserInputError as exc:
            raise BadInput(str(exc)) from None

    user = run_with_store(data_dir, store, action)
    typer.echo(f"changed the password of {user.name!r}; its sessions are ended")
