"""Load signals in each server's demand rows: requests waiting in its router's
queue, the longest wait, and its engine reads per replica (for a model's
target_queue_depth and target_kv_use).

Columns are added in place; rows written before have an empty queue and no reads.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "model_demand", sa.Column("queued", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column(
        "model_demand", sa.Column("queue_wait", sa.Float(), nullable=False, server_default="0")
    )
    op.add_column("model_demand", sa.Column("replicas", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_demand") as batch:
        batch.drop_column("replicas")
        batch.drop_column("queue_wait")
        batch.drop_column("queued")
