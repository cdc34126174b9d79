"""API keys get scopes (`debug`: the router explains its choice of replica to the
key), and usage keeps model names of up to 256 characters, the longest a request
may name.

The scopes column is added in place (no table rebuild), so SQLite keeps the
partial unique index on active key names. Widening the usage tables' `model`
columns is an ALTER on PostgreSQL and a table rebuild on SQLite (batch mode),
which copies the usage tables once.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None

_USAGE_TABLES = ("usage_records", "usage_hourly", "usage_daily")


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("scopes", sa.JSON(none_as_null=True), nullable=True))
    for table in _USAGE_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.alter_column(
                "model", existing_type=sa.String(200), type_=sa.String(256), existing_nullable=False
            )


def downgrade() -> None:
    for table in _USAGE_TABLES:
        # Names longer than the old columns are cut, or PostgreSQL refuses the change.
        op.execute(f"UPDATE {table} SET model = substr(model, 1, 200) WHERE length(model) > 200")
        with op.batch_alter_table(table) as batch:
            batch.alter_column(
                "model", existing_type=sa.String(256), type_=sa.String(200), existing_nullable=False
            )
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("scopes")
