"""A canary stopped by a failing replica of its spec stays stopped across a control-plane
failover, like a stopped rollout.

Revision ID: 0028
Revises: 0022
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "canary_halts",
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("spec_key", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("halted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("model", name=op.f("pk_canary_halts")),
    )


def downgrade() -> None:
    op.drop_table("canary_halts")
