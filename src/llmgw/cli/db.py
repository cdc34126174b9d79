"""`llmgw db`: maintaining the store's schema.

`llmgw db upgrade` applies every migration the database has not seen yet and
prints the revision it is at; running it again changes nothing. Servers also
upgrade at start-up, so this is for preparing a database ahead of a rollout.

Not guaranteed: downgrades. To go back, restore a backup taken before upgrading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from llmgw.cli.storeopts import DEFAULT_DATA_DIR, DataDirOption, StoreOption, run_with_store

if TYPE_CHECKING:
    from llmgw.store import Store

db_app = typer.Typer(
    name="db",
    help="Maintain the store's database schema.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@db_app.command("upgrade")
def upgrade(data_dir: DataDirOption = DEFAULT_DATA_DIR, store: StoreOption = None) -> None:
    """Apply pending database migrations and print the schema revision."""

    async def action(opened: Store) -> tuple[str, str | None]:
        # run_with_store has applied the migrations already.
        return opened.url, await opened.revision()

    url, revision = run_with_store(data_dir, store, action)
    typer.echo(f"database {url} is at revision {revision} (newest)")
