"""Alembic environment for the store: runs the migrations on the connection it is given.

`llmgw.store.migrate` passes an open connection in `config.attributes["connection"]`;
there is no alembic.ini and no URL here, so the only way in is through the store
(`llmgw db upgrade`, or the server at start-up).

Not guaranteed: running `alembic` from the command line; it has nothing to connect to.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from llmgw.store.tables import metadata


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError(
            "llmgw migrations run through `llmgw db upgrade`, not the alembic command line"
        )
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
