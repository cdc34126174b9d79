"""Rollouts: a catalog model keeps its spec before the last replacement (for undo), and a
rollout stopped by a failing new replica stays stopped across a control-plane failover.

Revision ID: 0017
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0015"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("catalog_models", sa.Column("previous_spec", sa.JSON(), nullable=True))
    op.create_table(
        "rollout_halts",
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("spec_key", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("halted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("model", name=op.f("pk_rollout_halts")),
    )


def downgrade() -> None:
    op.drop_table("rollout_halts")
    with op.batch_alter_table("catalog_models") as batch:
        batch.drop_column("previous_spec")
