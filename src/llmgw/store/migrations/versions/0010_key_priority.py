"""Queueing per key (priority class, fair-share weight, longest wait) and each
request's time in the router's queue.

Columns are added in place (no table rebuild), so SQLite keeps the partial
unique index on active key names; the priority's allowed values are checked by
the key repository, not by a database constraint.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "api_keys",
        sa.Column("priority", sa.String(16), nullable=False, server_default="default"),
    )
    op.add_column("api_keys", sa.Column("weight", sa.Float(), nullable=False, server_default="1"))
    op.add_column("api_keys", sa.Column("max_queue_wait", sa.Float(), nullable=True))
    op.add_column("usage_records", sa.Column("queue_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("queue_ms")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("max_queue_wait")
        batch.drop_column("weight")
        batch.drop_column("priority")
