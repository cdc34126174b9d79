"""Fleet nodes: the leader's view of every node, read by standbys' admin APIs.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "fleet_nodes",
        sa.Column("node_id", sa.String(253), nullable=False),
        sa.Column("view", sa.JSON(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", _UTC, nullable=False),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_fleet_nodes")),
    )


def downgrade() -> None:
    op.drop_table("fleet_nodes")
