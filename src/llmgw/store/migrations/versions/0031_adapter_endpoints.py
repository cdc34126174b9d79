"""A replica published under a LoRA adapter's names says the base model it was placed
for, so standbys read it back (joined to the base's placement record) and route the
adapter where the leader's agents report it loaded.

Revision ID: 0031
Revises: 0028
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0031"
down_revision: str | None = "0028"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("replica_endpoints") as batch:
        batch.add_column(sa.Column("base", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("replica_endpoints") as batch:
        batch.drop_column("base")
