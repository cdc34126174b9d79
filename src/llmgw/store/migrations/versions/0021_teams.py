"""Teams: a team owns keys and members and has its own limits and budget; a key
belongs to at most one team.

Revision ID: 0021
Revises: 0018
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

_UTC = sa.DateTime(timezone=True)

revision: str = "0021"
down_revision: str | None = "0018"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("rpm", sa.Integer, nullable=True),
        sa.Column("tpm", sa.Integer, nullable=True),
        sa.Column("budget_tokens", sa.BigInteger, nullable=True),
        sa.Column("budget_period", sa.String(8), nullable=True),
        sa.Column("models", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("created_at", _UTC, nullable=False),
        sa.Column("updated_at", _UTC, nullable=False),
        sa.CheckConstraint(
            "budget_period IN ('day', 'month')", name=op.f("ck_teams_team_budget_period")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
    )
    op.create_table(
        "team_members",
        sa.Column("team_id", sa.String(32), nullable=False),
        sa.Column("user_name", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("added_at", _UTC, nullable=False),
        sa.PrimaryKeyConstraint("team_id", "user_name", name=op.f("pk_team_members")),
    )
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("team_id", sa.String(32), nullable=True))
        batch.create_index("ix_api_keys_team_id", ["team_id"])


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_index("ix_api_keys_team_id")
        batch.drop_column("team_id")
    op.drop_table("team_members")
    op.drop_table("teams")
