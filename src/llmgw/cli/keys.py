"""`llmgw keys`: create, list, update, revoke and rotate API keys in the store.

Every command opens the store given by --data-dir/--store, applies pending
migrations, does its one change through `KeyService`, and closes the store.
A secret is printed once, by `create` and `rotate`; `list` and `update` never
show secrets or hashes, only the prefix that identifies a key. `update` changes
only what its flags name; a `--no-...` flag (or `--all-models`,
`--never-expires`) clears a limit.

Not guaranteed: that routers see a change at once. Each router process picks up
an update, revoke or rotate at its next poll, within a few seconds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from llmgw.cli.storeopts import (
    DEFAULT_DATA_DIR,
    BadInput,
    DataDirOption,
    JsonOption,
    StoreOption,
    fail,
    format_time,
    parse_time,
    print_json,
    render_table,
    run_with_store,
)

if TYPE_CHECKING:
    from llmgw.auth import KeyInputError, KeyService
    from llmgw.store import ApiKey, Keep, Store

T = TypeVar("T")

keys_app = typer.Typer(
    name="keys",
    help="Manage API keys: create, list, update, revoke, rotate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

FLAGS = {
    "name": "--name",
    "models": "--models",
    "rpm": "--rpm",
    "tpm": "--tpm",
    "budget_tokens": "--budget-tokens",
    "period": "--period",
    "expires_at": "--expires",
    "role": "--role",
    "priority": "--priority",
    "weight": "--weight",
    "max_queue_wait": "--max-queue-wait",
    "scopes": "--scope",
    "team": "--team",
    "user_rpm": "--user-rpm",
    "user_tpm": "--user-tpm",
    "user_budget_tokens": "--user-budget",
    "ref": "REF",
}
SECRET_WARNING = "store it now; it cannot be shown again"
TABLE_HEADERS = ["ID", "NAME", "PREFIX", "MODELS", "LIMITS", "EXPIRES", "STATE"]

RefArgument = Annotated[
    str, typer.Argument(help="The key's id, name or prefix (as `llmgw keys list` shows).")
]


def _service(store: Store) -> KeyService:
    from llmgw.auth import KeyService

    return KeyService(keys=store.keys, wall_clock=_now)


def _now() -> datetime:
    return datetime.now(UTC)


def _bad(exc: KeyInputError) -> BadInput:
    return BadInput(exc.render(FLAGS))


@keys_app.command("create")
def create(
    name: Annotated[str, typer.Option("--name", help="A name people recognise the key by.")],
    models: Annotated[
        str | None,
        typer.Option("--models", help="Comma-separated models the key may use [default: all]."),
    ] = None,
    rpm: Annotated[
        int | None, typer.Option("--rpm", help="Requests per minute [default: unlimited].")
    ] = None,
    tpm: Annotated[
        int | None, typer.Option("--tpm", help="Tokens per minute [default: unlimited].")
    ] = None,
    budget_tokens: Annotated[
        int | None,
        typer.Option(
            "--budget-tokens", help="Tokens per --period (prompt + completion) [default: none]."
        ),
    ] = None,
    period: Annotated[
        str | None, typer.Option("--period", help="Budget period: day or month (UTC).")
    ] = None,
    expires: Annotated[
        str | None,
        typer.Option(
            "--expires",
            help="Expiry: YYYY-MM-DD (midnight UTC), an ISO datetime (UTC), or a duration "
            "from now such as 3600s, 12h or 90d [default: never].",
        ),
    ] = None,
    admin: Annotated[
        bool,
        typer.Option("--admin", help="Allow the key everything on the admin API (--role admin)."),
    ] = False,
    role: Annotated[
        str | None,
        typer.Option(
            "--role",
            help="The key's role on the admin API: admin (everything), operator (the fleet: "
            "nodes, models, activation; no keys or usage) or viewer (read the fleet) "
            "[default: none, a client key].",
            show_default=False,
        ),
    ] = None,
    priority: Annotated[
        str,
        typer.Option(
            "--priority",
            help="Queue class while a model is saturated: interactive, default or batch.",
        ),
    ] = "default",
    weight: Annotated[
        float,
        typer.Option(
            "--weight", help="Fair-share weight against other keys of its class (1: equal)."
        ),
    ] = 1.0,
    max_queue_wait: Annotated[
        float | None,
        typer.Option(
            "--max-queue-wait",
            help="Longest wait in seconds in a saturated model's queue before a 429 "
            "[default: the router's router.queue.max_wait].",
        ),
    ] = None,
    scope: Annotated[
        list[str] | None,
        typer.Option(
            "--scope",
            help="What the key may do besides calling models (repeatable): debug (the "
            "router explains its choice of replica in x-llmgw-route, which tells whether "
            "any key sent a prompt lately; admin keys may anyway) [default: none].",
        ),
    ] = None,
    team: Annotated[
        str | None,
        typer.Option(
            "--team",
            help="The team the key belongs to (name or id): its requests must pass the "
            "team's limits too [default: none].",
        ),
    ] = None,
    user_rpm: Annotated[
        int | None,
        typer.Option(
            "--user-rpm",
            help="Requests per minute for each end user of the key's application (the "
            "`user` a request names; Anthropic metadata.user_id) [default: unlimited].",
        ),
    ] = None,
    user_tpm: Annotated[
        int | None,
        typer.Option(
            "--user-tpm", help="Tokens per minute for each end user [default: unlimited]."
        ),
    ] = None,
    user_budget: Annotated[
        int | None,
        typer.Option(
            "--user-budget",
            metavar="TOKENS",
            help="Tokens per UTC day (prompt + completion) for each end user [default: none].",
        ),
    ] = None,
    json_out: JsonOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Create an API key and print its secret, once."""
    if admin and role not in (None, "admin"):
        fail(f"--admin means --role admin; drop one of --admin and --role {role}")
    model_list = models.split(",") if models is not None else None
    expires_at = parse_time_or_fail("--expires", expires, future=True)

    async def action(opened: Store) -> tuple[ApiKey, str]:
        from llmgw.auth import KeyInputError

        team_id = (await opened.teams.get(team)).id if team is not None else None
        try:
            return await _service(opened).create(
                team_id=team_id,
                name=name,
                models=model_list,
                rpm=rpm,
                tpm=tpm,
                budget_tokens=budget_tokens,
                period=period,
                expires_at=expires_at,
                admin_role="admin" if admin else role,
                priority=priority,
                weight=weight,
                max_queue_wait=max_queue_wait,
                scopes=scope or (),
                user_rpm=user_rpm,
                user_tpm=user_tpm,
                user_budget_tokens=user_budget,
            )
        except KeyInputError as exc:
            raise _bad(exc) from None

    key, secret = run_with_store(data_dir, store, action)
    _print_secret(key, secret, json_out=json_out, verb="created")


@keys_app.command("list")
def list_keys(
    include_revoked: Annotated[bool, typer.Option("--all", help="Include revoked keys.")] = False,
    json_out: JsonOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """List API keys (never their secrets)."""
    from llmgw.auth.views import key_view

    async def action(opened: Store) -> list[ApiKey]:
        return await _service(opened).list(include_revoked=include_revoked)

    keys = run_with_store(data_dir, store, action)
    now = _now()
    if json_out:
        print_json([key_view(key, now) for key in keys])
        return
    if not keys:
        typer.echo("no keys" + ("" if include_revoked else " (--all includes revoked ones)"))
        return
    typer.echo(render_table(TABLE_HEADERS, [_row(key, now) for key in keys]))


@keys_app.command("update")
def update(
    ref: RefArgument,
    name: Annotated[str | None, typer.Option("--name", help="A new name.")] = None,
    models: Annotated[
        str | None,
        typer.Option("--models", help="Comma-separated models the key may use from now on."),
    ] = None,
    all_models: Annotated[
        bool, typer.Option("--all-models", help="Let the key use every model.")
    ] = False,
    rpm: Annotated[int | None, typer.Option("--rpm", help="Requests per minute.")] = None,
    no_rpm: Annotated[bool, typer.Option("--no-rpm", help="No requests-per-minute limit.")] = False,
    tpm: Annotated[int | None, typer.Option("--tpm", help="Tokens per minute.")] = None,
    no_tpm: Annotated[bool, typer.Option("--no-tpm", help="No tokens-per-minute limit.")] = False,
    budget_tokens: Annotated[
        int | None,
        typer.Option(
            "--budget-tokens",
            help="Tokens per --period (prompt + completion); keeps the key's period "
            "unless --period is given.",
        ),
    ] = None,
    period: Annotated[
        str | None,
        typer.Option("--period", help="Budget period: day or month (UTC); needs a budget."),
    ] = None,
    no_budget: Annotated[
        bool, typer.Option("--no-budget", help="No token budget (clears its period too).")
    ] = False,
    expires: Annotated[
        str | None,
        typer.Option(
            "--expires",
            help="Expiry: YYYY-MM-DD (midnight UTC), an ISO datetime (UTC), or a duration "
            "from now such as 3600s, 12h or 90d.",
        ),
    ] = None,
    never_expires: Annotated[
        bool, typer.Option("--never-expires", help="The key never expires.")
    ] = False,
    admin: Annotated[
        bool | None,
        typer.Option(
            "--admin/--no-admin",
            help="Give the key the role admin (everything on the admin API), or take its "
            "role away (--role none).",
            show_default=False,
        ),
    ] = None,
    role: Annotated[
        str | None,
        typer.Option(
            "--role",
            help="The key's role on the admin API from now on: admin, operator, viewer, or "
            "none (a client key).",
            show_default=False,
        ),
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option(
            "--priority",
            help="Queue class while a model is saturated: interactive, default or batch.",
        ),
    ] = None,
    weight: Annotated[
        float | None,
        typer.Option(
            "--weight", help="Fair-share weight against other keys of its class (1: equal)."
        ),
    ] = None,
    max_queue_wait: Annotated[
        float | None,
        typer.Option(
            "--max-queue-wait", help="Longest wait in seconds in a saturated model's queue."
        ),
    ] = None,
    default_queue_wait: Annotated[
        bool,
        typer.Option(
            "--default-queue-wait", help="Wait as long as the router's default (router.queue)."
        ),
    ] = False,
    scope: Annotated[
        list[str] | None,
        typer.Option(
            "--scope",
            help="The key's scopes from now on (repeatable; replaces the ones it has): debug.",
        ),
    ] = None,
    no_scopes: Annotated[
        bool, typer.Option("--no-scopes", help="The key only calls models (no scopes).")
    ] = False,
    team: Annotated[
        str | None, typer.Option("--team", help="Move the key to this team (name or id).")
    ] = None,
    no_team: Annotated[
        bool, typer.Option("--no-team", help="Take the key out of its team.")
    ] = False,
    user_rpm: Annotated[
        int | None,
        typer.Option("--user-rpm", help="Requests per minute for each end user."),
    ] = None,
    no_user_rpm: Annotated[
        bool, typer.Option("--no-user-rpm", help="No requests-per-minute limit per end user.")
    ] = False,
    user_tpm: Annotated[
        int | None, typer.Option("--user-tpm", help="Tokens per minute for each end user.")
    ] = None,
    no_user_tpm: Annotated[
        bool, typer.Option("--no-user-tpm", help="No tokens-per-minute limit per end user.")
    ] = False,
    user_budget: Annotated[
        int | None,
        typer.Option(
            "--user-budget", metavar="TOKENS", help="Tokens per UTC day for each end user."
        ),
    ] = None,
    no_user_budget: Annotated[
        bool, typer.Option("--no-user-budget", help="No daily token budget per end user.")
    ] = False,
    json_out: JsonOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Change an API key's name, models, limits (its own and its end users'), expiry,
    admin role or scopes; its secret stays."""
    if admin is not None and role is not None:
        fail("--admin/--no-admin and --role both set the key's role; give one of the two")
    for given, flag, cleared, clear_flag in (
        (models is not None, "--models", all_models, "--all-models"),
        (rpm is not None, "--rpm", no_rpm, "--no-rpm"),
        (tpm is not None, "--tpm", no_tpm, "--no-tpm"),
        (budget_tokens is not None, "--budget-tokens", no_budget, "--no-budget"),
        (period is not None, "--period", no_budget, "--no-budget"),
        (expires is not None, "--expires", never_expires, "--never-expires"),
        (
            max_queue_wait is not None,
            "--max-queue-wait",
            default_queue_wait,
            "--default-queue-wait",
        ),
        (scope is not None, "--scope", no_scopes, "--no-scopes"),
        (team is not None, "--team", no_team, "--no-team"),
        (user_rpm is not None, "--user-rpm", no_user_rpm, "--no-user-rpm"),
        (user_tpm is not None, "--user-tpm", no_user_tpm, "--no-user-tpm"),
        (user_budget is not None, "--user-budget", no_user_budget, "--no-user-budget"),
    ):
        if given and cleared:
            fail(f"{flag} sets what {clear_flag} clears; give one of the two")
    given_any = (name, models, rpm, tpm, budget_tokens, period, expires, admin, role)
    queueing = (priority, weight, max_queue_wait, scope, team, user_rpm, user_tpm, user_budget)
    if all(v is None for v in (*given_any, *queueing)) and not (
        all_models
        or no_rpm
        or no_tpm
        or no_budget
        or never_expires
        or default_queue_wait
        or no_scopes
        or no_team
        or no_user_rpm
        or no_user_tpm
        or no_user_budget
    ):
        fail(
            "nothing to change: give at least one of --name, --models/--all-models, "
            "--rpm/--no-rpm, --tpm/--no-tpm, --budget-tokens/--period/--no-budget, "
            "--expires/--never-expires, --role or --admin/--no-admin, --priority, --weight, "
            "--max-queue-wait/--default-queue-wait, --scope/--no-scopes, --team/--no-team, "
            "--user-rpm/--no-user-rpm, --user-tpm/--no-user-tpm, --user-budget/--no-user-budget"
        )
    model_list = models.split(",") if models is not None else None
    expires_at = parse_time_or_fail("--expires", expires, future=True)

    async def action(opened: Store) -> ApiKey:
        from llmgw.auth import KeyInputError

        team_id: str | Keep | None = None if no_team else _given(team)
        if isinstance(team_id, str):
            team_id = (await opened.teams.get(team_id)).id
        try:
            return await _service(opened).update(
                ref,
                team_id=team_id,
                name=_given(name),
                models=_change(model_list, clear=all_models),
                rpm=_change(rpm, clear=no_rpm),
                tpm=_change(tpm, clear=no_tpm),
                budget_tokens=_change(budget_tokens, clear=no_budget),
                period=_change(period, clear=no_budget),
                expires_at=_change(expires_at, clear=never_expires),
                admin_role=_role_change(admin, role),
                priority=_given(priority),
                weight=_given(weight),
                max_queue_wait=_change(max_queue_wait, clear=default_queue_wait),
                scopes=_scopes_change(scope, clear=no_scopes),
                user_rpm=_change(user_rpm, clear=no_user_rpm),
                user_tpm=_change(user_tpm, clear=no_user_tpm),
                user_budget_tokens=_change(user_budget, clear=no_user_budget),
            )
        except KeyInputError as exc:
            raise _bad(exc) from None

    key = run_with_store(data_dir, store, action)
    if json_out:
        from llmgw.auth.views import key_view

        print_json(key_view(key, _now()))
        return
    typer.echo(f"updated key {key.id} ({key.name!r}); routers apply it within a few seconds")
    typer.echo(render_table(TABLE_HEADERS, [_row(key, _now())]))


@keys_app.command("revoke")
def revoke(
    ref: RefArgument,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Revoke an API key; every router refuses it within a few seconds."""

    async def action(opened: Store) -> tuple[ApiKey, bool]:
        service = _service(opened)
        key = await _resolve(service, ref)
        if key.revoked:
            return key, False
        return await service.revoke(key.id), True

    key, changed = run_with_store(data_dir, store, action)
    if changed:
        typer.echo(f"revoked key {key.id} ({key.name!r}); routers refuse it within a few seconds")
    else:
        typer.echo(
            f"key {key.id} ({key.name!r}) was already revoked at {format_time(key.revoked_at)} UTC"
        )


@keys_app.command("rotate")
def rotate(
    ref: RefArgument,
    json_out: JsonOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Give an API key a new secret (same id, name and limits) and print it, once."""

    async def action(opened: Store) -> tuple[ApiKey, str]:
        service = _service(opened)
        key = await _resolve(service, ref)
        return await service.rotate(key.id)

    key, secret = run_with_store(data_dir, store, action)
    _print_secret(key, secret, json_out=json_out, verb="rotated")
    if not json_out:
        typer.echo("the old secret stops working within a few seconds")


def parse_time_or_fail(flag: str, value: str | None, *, future: bool) -> datetime | None:
    """`parse_time` for an optional flag, exiting with `error:` on a bad value."""
    if value is None:
        return None
    try:
        return parse_time(flag, value, now=_now(), future=future)
    except BadInput as exc:
        fail(str(exc))


async def _resolve(service: KeyService, ref: str) -> ApiKey:
    from llmgw.auth import KeyInputError

    try:
        return await service.resolve(ref)
    except KeyInputError as exc:
        raise _bad(exc) from None


def _print_secret(key: ApiKey, secret: str, *, json_out: bool, verb: str) -> None:
    from llmgw.auth.views import key_view

    if json_out:
        print_json({**key_view(key, _now()), "secret": secret})
        return
    typer.echo(f"{verb} key {key.id} ({key.name!r})")
    typer.echo(f"secret: {secret}")
    typer.echo(SECRET_WARNING)


def _given(value: T | None) -> T | Keep:
    """What `KeyService.update` takes for a flag that cannot clear: its value or KEEP."""
    from llmgw.store import KEEP

    return value if value is not None else KEEP


def _change(value: T | None, *, clear: bool) -> T | Keep | None:
    """What `KeyService.update` takes for a flag and its `--no-...`: value, None or KEEP."""
    return None if value is None and clear else _given(value)


def _row(key: ApiKey, now: datetime) -> list[str]:
    from llmgw.auth.views import key_state

    return [
        key.id,
        key.name,
        key.prefix + "…",
        ",".join(key.models) if key.models is not None else "*",
        _limits(key),
        format_time(key.expires_at, "never"),
        key_state(key, now)
        + (f", {key.admin_role}" if key.admin_role else "")
        + "".join(f", {scope}" for scope in key.scopes)
        + (f", team {key.team.name}" if key.team is not None else ""),
    ]


def _role_change(admin: bool | None, role: str | None) -> str | Keep | None:
    """The admin role an update gives the key (None: no role), or `KEEP`."""
    if admin is not None:
        return "admin" if admin else None
    if role is not None:
        return None if role == "none" else role
    return _given(None)


def _scopes_change(scopes: list[str] | None, *, clear: bool) -> list[str] | Keep:
    """The scopes an update gives the key: `scopes`, none (`clear`), or as they are."""
    return [] if clear else _given(scopes)


def _limits(key: ApiKey) -> str:
    parts = []
    if key.rpm is not None:
        parts.append(f"rpm={key.rpm}")
    if key.tpm is not None:
        parts.append(f"tpm={key.tpm}")
    if key.budget_tokens is not None:
        parts.append(f"budget={key.budget_tokens}/{key.budget_period}")
    if key.user_rpm is not None:
        parts.append(f"user_rpm={key.user_rpm}")
    if key.user_tpm is not None:
        parts.append(f"user_tpm={key.user_tpm}")
    if key.user_budget_tokens is not None:
        parts.append(f"user_budget={key.user_budget_tokens}/day")
    if key.priority != "default":
        parts.append(f"priority={key.priority}")
    if key.weight != 1:
        parts.append(f"weight={key.weight:g}")
    if key.max_queue_wait is not None:
        parts.append(f"queue_wait={key.max_queue_wait:g}s")
    return " ".join(parts) or "-"
