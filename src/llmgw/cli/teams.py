"""`llmgw teams`: create, list, show, update and remove teams, and manage their members.

A team has keys (`llmgw keys create --team T`), members (users with the team role
`team-admin` or `member`) and its own limits: requests and tokens per minute, a
token budget per UTC day or month, and the models its keys may use. A request
of a team's key must pass the key's limits and the team's, which all the
team's keys share (across routers through Redis, as keys' limits are). Team
admins manage their team's keys and see its usage through the admin API
(`/admin/api/teams/T/...`), and nothing of other teams.

Every command opens the store given by --data-dir/--store, applies pending
migrations, does its one change, and closes the store. These commands are not
held to a role: whoever may run them already holds the store's credentials.

Not guaranteed: that routers see a change at once; they pick up changed limits
at their next poll of the keys, within a few seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmgw.cli.storeopts import (
    DEFAULT_DATA_DIR,
    DataDirOption,
    JsonOption,
    StoreOption,
    fail,
    iso,
    print_json,
    render_table,
    run_with_store,
)

if TYPE_CHECKING:
    from llmgw.store import Store, Team, TeamMember

teams_app = typer.Typer(
    name="teams",
    help="Manage teams (their limits, budgets, models and members): create, list, show, "
    "update, remove, members.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
members_app = typer.Typer(
    name="members",
    help="Add users to a team (as team-admin or member) or take them out.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
teams_app.add_typer(members_app, name="members")

TeamArgument = Annotated[str, typer.Argument(help="The team's name or id.")]
NameArgument = Annotated[
    str, typer.Argument(help="The team's name: letters, digits, '_', '.' and '-'.")
]
RpmOption = Annotated[
    int | None, typer.Option("--rpm", help="Requests per minute, all the team's keys together.")
]
TpmOption = Annotated[
    int | None, typer.Option("--tpm", help="Tokens per minute, all the team's keys together.")
]
BudgetOption = Annotated[
    int | None,
    typer.Option("--budget-tokens", help="Tokens per --period, all the team's keys together."),
]
PeriodOption = Annotated[
    str | None, typer.Option("--period", help="Budget period: day or month (UTC).")
]
ModelsOption = Annotated[
    str | None,
    typer.Option("--models", help="Comma-separated models the team's keys may use."),
]
HEADERS = ["ID", "NAME", "MODELS", "LIMITS", "KEYS"]


def _models(models: str | None) -> tuple[str, ...] | None:
    if models is None:
        return None
    names = tuple(dict.fromkeys(m.strip() for m in models.split(",") if m.strip()))
    if not names:
        fail("--models is empty: name at least one model, or leave it out for every model")
    return names


def _limits_text(team: Team) -> str:
    parts = []
    if team.rpm is not None:
        parts.append(f"rpm {team.rpm}")
    if team.tpm is not None:
        parts.append(f"tpm {team.tpm}")
    if team.budget_tokens is not None:
        parts.append(f"{team.budget_tokens} tokens/{team.budget_period}")
    return ", ".join(parts) or "none"


def team_view(team: Team, keys: int | None = None) -> dict[str, Any]:
    """A team as JSON-ready fields."""
    out: dict[str, Any] = {
        "id": team.id,
        "name": team.name,
        "rpm": team.rpm,
        "tpm": team.tpm,
        "budget_tokens": team.budget_tokens,
        "budget_period": team.budget_period,
        "models": list(team.models) if team.models is not None else None,
        "created_at": iso(team.created_at),
        "updated_at": iso(team.updated_at),
    }
    if keys is not None:
        out["keys"] = keys
    return out


def _row(team: Team, keys: int) -> list[str]:
    models = ",".join(team.models) if team.models is not None else "*"
    return [team.id, team.name, models, _limits_text(team), str(keys)]


@teams_app.command("create")
def create(
    name: NameArgument,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    budget_tokens: BudgetOption = None,
    period: PeriodOption = None,
    models: ModelsOption = None,
    json_out: JsonOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Create a team with its limits (every one left out: unlimited)."""
    from llmgw.store import TeamLimits

    limits = TeamLimits(
        rpm=rpm,
        tpm=tpm,
        budget_tokens=budget_tokens,
        budget_period=_period(period),
        models=_models(models),
    )

    async def action(opened: Store) -> Team:
        return await opened.teams.create(name, limits)

    team = run_with_store(data_dir, store, action)
    if json_out:
        print_json(team_view(team, 0))
        return
    typer.echo(f"created team {team.name} ({team.id}): limits {_limits_text(team)}")


@teams_app.command("list")
def list_teams(
    json_out: JsonOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """List the teams, their limits and how many active keys each has."""

    async def action(opened: Store) -> tuple[list[Team], dict[str, int]]:
        return await opened.teams.list(), await opened.teams.key_counts()

    teams, counts = run_with_store(data_dir, store, action)
    if json_out:
        print_json([team_view(t, counts.get(t.id, 0)) for t in teams])
        return
    if not teams:
        typer.echo("no teams (llmgw teams create NAME makes one)")
        return
    typer.echo(render_table(HEADERS, [_row(t, counts.get(t.id, 0)) for t in teams]))


@teams_app.command("show")
def show(
    team: TeamArgument,
    json_out: JsonOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Show a team: its limits, members and keys."""

    async def action(opened: Store) -> tuple[Team, list[TeamMember], list[tuple[str, str]]]:
        found = await opened.teams.get(team)
        members = await opened.teams.members(found.id)
        keys = await opened.keys.list(team_id=found.id)
        return found, members, [(k.id, k.name) for k in keys]

    found, members, keys = run_with_store(data_dir, store, action)
    if json_out:
        view = team_view(found, len(keys))
        view["members"] = [{"user": m.user_name, "role": m.role} for m in members]
        view["key_list"] = [{"id": kid, "name": kname} for kid, kname in keys]
        print_json(view)
        return
    typer.echo(render_table(HEADERS, [_row(found, len(keys))]))
    typer.echo("members: " + (", ".join(f"{m.user_name} ({m.role})" for m in members) or "none"))
    typer.echo("keys: " + (", ".join(f"{kid} ({kname})" for kid, kname in keys) or "none"))


@teams_app.command("update")
def update(
    team: TeamArgument,
    name: Annotated[str | None, typer.Option("--name", help="A new name.")] = None,
    rpm: RpmOption = None,
    no_rpm: Annotated[bool, typer.Option("--no-rpm", help="No requests-per-minute limit.")] = False,
    tpm: TpmOption = None,
    no_tpm: Annotated[bool, typer.Option("--no-tpm", help="No tokens-per-minute limit.")] = False,
    budget_tokens: BudgetOption = None,
    period: PeriodOption = None,
    no_budget: Annotated[
        bool, typer.Option("--no-budget", help="No token budget (clears its period too).")
    ] = False,
    models: ModelsOption = None,
    all_models: Annotated[
        bool, typer.Option("--all-models", help="The team's keys may use every model.")
    ] = False,
    json_out: JsonOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Change a team's name, limits or models; routers apply it within a few seconds."""
    from llmgw.store import KEEP, TeamLimits

    for given, flag, cleared, clear_flag in (
        (rpm is not None, "--rpm", no_rpm, "--no-rpm"),
        (tpm is not None, "--tpm", no_tpm, "--no-tpm"),
        (budget_tokens is not None, "--budget-tokens", no_budget, "--no-budget"),
        (period is not None, "--period", no_budget, "--no-budget"),
        (models is not None, "--models", all_models, "--all-models"),
    ):
        if given and cleared:
            fail(f"{flag} sets what {clear_flag} clears; give one of the two")

    def change(value: Any, *, clear: bool) -> Any:
        return None if clear else (KEEP if value is None else value)

    limits = TeamLimits(
        name=KEEP if name is None else name,
        rpm=change(rpm, clear=no_rpm),
        tpm=change(tpm, clear=no_tpm),
        budget_tokens=change(budget_tokens, clear=no_budget),
        budget_period=change(_period(period), clear=no_budget),
        models=change(_models(models), clear=all_models),
    )
    if not limits.changed():
        fail(
            "nothing to change: give at least one of --name, --rpm/--no-rpm, --tpm/--no-tpm, "
            "--budget-tokens/--period/--no-budget, --models/--all-models"
        )

    async def action(opened: Store) -> Team:
        return await opened.teams.update(team, limits)

    after = run_with_store(data_dir, store, action)
    if json_out:
        print_json(team_view(after))
        return
    typer.echo(
        f"updated team {after.name} ({after.id}): limits {_limits_text(after)}; "
        "routers apply it within a few seconds"
    )


@teams_app.command("remove")
def remove(
    team: TeamArgument,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Remove a team that has no active keys (revoke or move them first)."""

    async def action(opened: Store) -> Team:
        return await opened.teams.remove(team)

    removed = run_with_store(data_dir, store, action)
    typer.echo(f"removed team {removed.name} ({removed.id})")


@members_app.command("add")
def add_member(
    team: TeamArgument,
    user: Annotated[str, typer.Argument(help="The user's name (llmgw users list).")],
    role: Annotated[
        str,
        typer.Option(
            "--role",
            help="team-admin (manages the team's keys, sees its usage) or member.",
        ),
    ] = "member",
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Add a user to a team, or change their role in it."""

    async def action(opened: Store) -> TeamMember:
        return await opened.teams.add_member(team, user, role)

    member = run_with_store(data_dir, store, action)
    typer.echo(f"user {member.user_name} is {member.role} of team {team}")


@members_app.command("remove")
def remove_member(
    team: TeamArgument,
    user: Annotated[str, typer.Argument(help="The user's name.")],
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Take a user out of a team."""

    async def action(opened: Store) -> Team:
        return await opened.teams.remove_member(team, user)

    found = run_with_store(data_dir, store, action)
    typer.echo(f"user {user} is no longer in team {found.name}")


def _period(period: str | None) -> Any:
    if period is not None and period not in ("day", "month"):
        fail(f"--period {period!r}: use day or month")
    return period
