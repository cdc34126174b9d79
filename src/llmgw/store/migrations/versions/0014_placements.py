"""Placement records, and the labels a join token binds to the nodes that join with it.

`placements`: what the leader placed where (replica, shard, node, model, profile,
port, the start's spec), written before it sends the start; a node's report of
a shard is only adopted and published when it matches one. Engines running when
this migration is applied have no record: the first leader after the upgrade
stops them and places their replicas again.

`node_identities.labels` / `.fabric` hold the join token's labels for the node;
nodes that joined before get their token's labels from the audit trail of issued
certificates (their latest certificate issued for a token). `join_tokens.fabric`
lets a token fix fabric labels too.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "placements",
        sa.Column("shard_id", sa.String(128), nullable=False),
        sa.Column("replica_id", sa.String(128), nullable=False),
        sa.Column("node_id", sa.String(253), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("profile", sa.String(128), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("placed_at", _UTC, nullable=False),
        sa.PrimaryKeyConstraint("shard_id", name=op.f("pk_placements")),
    )
    op.create_index(op.f("ix_placements_node_id"), "placements", ["node_id"], unique=False)
    op.add_column("join_tokens", sa.Column("fabric", sa.JSON(), nullable=True))
    op.add_column("node_identities", sa.Column("labels", sa.JSON(), nullable=True))
    op.add_column("node_identities", sa.Column("fabric", sa.JSON(), nullable=True))
    # Nodes that joined before keep their token's labels from now on.
    op.execute(
        "UPDATE node_identities SET labels = ("
        "SELECT join_tokens.labels FROM issued_certificates "
        "JOIN join_tokens ON join_tokens.id = issued_certificates.token_id "
        "WHERE issued_certificates.kind = 'node' "
        "AND issued_certificates.subject = node_identities.node_id "
        "ORDER BY issued_certificates.issued_at DESC LIMIT 1)"
    )


def downgrade() -> None:
    with op.batch_alter_table("node_identities") as batch:
        batch.drop_column("fabric")
        batch.drop_column("labels")
    with op.batch_alter_table("join_tokens") as batch:
        batch.drop_column("fabric")
    op.drop_index(op.f("ix_placements_node_id"), table_name="placements")
    op.drop_table("placements")
