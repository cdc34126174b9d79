"""Leadership: the lease, the Ready endpoints the leader publishes, demand from every server.

Revision ID: 0003
Revises: 0002
Create Date: 2025-03-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", _UTC, nullable=False),
        sa.Column("expires_at", _UTC, nullable=False),
        sa.Column("agent_address", sa.String(300), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leases")),
    )
    op.create_table(
        "replica_endpoints",
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("replica_id", sa.String(128), nullable=False),
        sa.Column("url", sa.String(500), nullable=False),
        sa.Column("names", sa.JSON(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", _UTC, nullable=False),
        sa.PrimaryKeyConstraint("model", "replica_id", name=op.f("pk_replica_endpoints")),
    )
    op.create_table(
        "model_demand",
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("server", sa.String(200), nullable=False),
        sa.Column("last_active", _UTC, nullable=False),
        sa.Column("in_flight", sa.Integer(), nullable=False),
        sa.Column("wanted_at", _UTC, nullable=True),
        sa.PrimaryKeyConstraint("model", "server", name=op.f("pk_model_demand")),
    )


def downgrade() -> None:
    op.drop_table("model_demand")
    op.drop_table("replica_endpoints")
    op.drop_table("leases")
