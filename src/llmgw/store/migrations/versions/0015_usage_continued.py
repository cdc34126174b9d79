"""Each usage record keeps how many times its stream was continued on another replica
after its engine failed mid-stream (NULL in older rows and for requests never continued).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("usage_records", sa.Column("continued", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("continued")
