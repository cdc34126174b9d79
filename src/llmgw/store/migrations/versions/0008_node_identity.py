"""Node identity: the key that owns each node id, and the deny-list of revoked keys.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "node_identities",
        sa.Column("node_id", sa.String(253), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("bound_at", _UTC, nullable=False),
        sa.Column("last_seen_at", _UTC, nullable=False),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_node_identities")),
    )
    op.create_index(
        op.f("ix_node_identities_key_hash"), "node_identities", ["key_hash"], unique=False
    )
    op.create_table(
        "node_revocations",
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("node_id", sa.String(253), nullable=False),
        sa.Column("revoked_at", _UTC, nullable=False),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.PrimaryKeyConstraint("key_hash", name=op.f("pk_node_revocations")),
    )


def downgrade() -> None:
    op.drop_table("node_revocations")
    op.drop_index(op.f("ix_node_identities_key_hash"), table_name="node_identities")
    op.drop_table("node_identities")
