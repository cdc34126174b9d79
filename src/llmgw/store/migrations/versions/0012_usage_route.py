"""Each usage record keeps the client route it came in on (/v1/chat/completions,
/v1/rerank, /tokenize, ...), so a key's usage shows which APIs it used.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("usage_records", sa.Column("route", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("route")
