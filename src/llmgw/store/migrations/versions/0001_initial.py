"""Initial schema: API keys, raw usage records and hourly usage roll-ups.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

_UTC = sa.DateTime(timezone=True)
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("models", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("budget_tokens", sa.BigInteger(), nullable=True),
        sa.Column("budget_period", sa.String(8), nullable=True),
        sa.Column("expires_at", _UTC, nullable=True),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", _UTC, nullable=False),
        sa.Column("updated_at", _UTC, nullable=False),
        sa.Column("revoked_at", _UTC, nullable=True),
        sa.CheckConstraint(
            "budget_period IN ('day', 'month')", name=op.f("ck_api_keys_budget_period")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
    )
    op.create_index(op.f("ix_api_keys_prefix"), "api_keys", ["prefix"])
    op.create_index(op.f("ix_api_keys_secret_hash"), "api_keys", ["secret_hash"], unique=True)
    op.create_index(op.f("ix_api_keys_updated_at"), "api_keys", ["updated_at"])
    op.create_index(
        "uq_api_keys_active_name",
        "api_keys",
        ["name"],
        unique=True,
        sqlite_where=sa.text("revoked_at IS NULL"),
        postgresql_where=sa.text("revoked_at IS NULL"),
    )

    op.create_table(
        "usage_records",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("ts", _UTC, nullable=False),
        sa.Column("request_id", sa.String(200), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("endpoint", sa.String(200), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("streamed", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
    )
    op.create_index(op.f("ix_usage_records_ts"), "usage_records", ["ts"])

    op.create_table(
        "usage_hourly",
        sa.Column("hour", _UTC, nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("latency_ms_sum", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("hour", "key_id", "model", name=op.f("pk_usage_hourly")),
    )
    op.create_index("ix_usage_hourly_key_id_hour", "usage_hourly", ["key_id", "hour"])


def downgrade() -> None:
    op.drop_table("usage_hourly")
    op.drop_table("usage_records")
    op.drop_table("api_keys")
