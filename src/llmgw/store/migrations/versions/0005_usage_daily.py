"""Daily usage roll-ups, filled from the hourly ones.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

_UTC = sa.DateTime(timezone=True)
_SUMS = "requests, errors, prompt_tokens, completion_tokens, latency_ms_sum"
_SUMMED = (
    "SUM(requests), SUM(errors), SUM(prompt_tokens), SUM(completion_tokens), SUM(latency_ms_sum)"
)


def upgrade() -> None:
    op.create_table(
        "usage_daily",
        sa.Column("day", _UTC, nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("latency_ms_sum", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("day", "key_id", "model", name=op.f("pk_usage_daily")),
    )
    op.create_index("ix_usage_daily_key_id_day", "usage_daily", ["key_id", "day"])
    # The days so far, from the hours. SQLite keeps UTC times as naive text
    # ("2026-01-31 09:00:00.000000"), so the day is the text's date at midnight.
    if op.get_bind().dialect.name == "sqlite":
        day = "substr(hour, 1, 10) || ' 00:00:00.000000'"
    else:
        day = "date_trunc('day', hour, 'UTC')"
    op.execute(
        f"INSERT INTO usage_daily (day, key_id, model, {_SUMS}) "
        f"SELECT {day} AS day, key_id, model, {_SUMMED} FROM usage_hourly "
        f"GROUP BY {day}, key_id, model"
    )


def downgrade() -> None:
    op.drop_index("ix_usage_daily_key_id_day", table_name="usage_daily")
    op.drop_table("usage_daily")
