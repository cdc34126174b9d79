"""End users: per-key limits for each end user of a key's application, the end user of
each usage record, and usage summed per hour, key, end user and model.

Revision ID: 0027
Revises: 0022
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

_UTC = sa.DateTime(timezone=True)

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("user_rpm", sa.Integer, nullable=True))
        batch.add_column(sa.Column("user_tpm", sa.Integer, nullable=True))
        batch.add_column(sa.Column("user_budget_tokens", sa.BigInteger, nullable=True))
    op.add_column("usage_records", sa.Column("end_user", sa.String(256), nullable=True))
    op.create_table(
        "usage_end_users",
        sa.Column("hour", _UTC, nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("end_user", sa.String(256), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("requests", sa.BigInteger, nullable=False),
        sa.Column("errors", sa.BigInteger, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("latency_ms_sum", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint(
            "hour", "key_id", "end_user", "model", name=op.f("pk_usage_end_users")
        ),
    )
    op.create_index(
        "ix_usage_end_users_key_id_end_user_hour",
        "usage_end_users",
        ["key_id", "end_user", "hour"],
    )


def downgrade() -> None:
    op.drop_index("ix_usage_end_users_key_id_end_user_hour", table_name="usage_end_users")
    op.drop_table("usage_end_users")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("end_user")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("user_budget_tokens")
        batch.drop_column("user_tpm")
        batch.drop_column("user_rpm")
