"""The base model of each LoRA adapter that usage was recorded for, so that usage
reports by model (`llmgw usage`) say which base an adapter's rows belong to.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "usage_bases",
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("base", sa.String(256), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("model", name=op.f("pk_usage_bases")),
    )


def downgrade() -> None:
    op.drop_table("usage_bases")
