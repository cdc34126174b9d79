"""The cluster CA, join tokens and the certificates issued from the CA.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "cluster_cas",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("cert_pem", sa.Text(), nullable=False),
        sa.Column("key_sealed", sa.LargeBinary(), nullable=False),
        sa.Column("sealing_key_id", sa.String(64), nullable=False),
        sa.Column("created_at", _UTC, nullable=False),
        sa.Column("not_after", _UTC, nullable=False),
        sa.Column("retired_at", _UTC, nullable=True),
        sa.CheckConstraint(
            "role IN ('active', 'next', 'retired')", name=op.f("ck_cluster_cas_role")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cluster_cas")),
    )
    op.create_index(
        "uq_cluster_cas_role",
        "cluster_cas",
        ["role"],
        unique=True,
        sqlite_where=sa.text("role <> 'retired'"),
        postgresql_where=sa.text("role <> 'retired'"),
    )
    op.create_table(
        "join_tokens",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("root_pem", sa.Text(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("max_uses", sa.Integer(), nullable=True),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("created_at", _UTC, nullable=False),
        sa.Column("expires_at", _UTC, nullable=False),
        sa.Column("last_used_at", _UTC, nullable=True),
        sa.Column("revoked_at", _UTC, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_join_tokens")),
    )
    op.create_table(
        "issued_certificates",
        sa.Column("serial", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("ca_id", sa.String(64), nullable=False),
        sa.Column("spki_sha256", sa.String(64), nullable=False),
        sa.Column("token_id", sa.String(32), nullable=True),
        sa.Column("issued_at", _UTC, nullable=False),
        sa.Column("not_after", _UTC, nullable=False),
        sa.CheckConstraint("kind IN ('server', 'node')", name=op.f("ck_issued_certificates_kind")),
        sa.PrimaryKeyConstraint("serial", name=op.f("pk_issued_certificates")),
    )
    op.create_index(
        "ix_issued_certificates_kind_subject", "issued_certificates", ["kind", "subject"]
    )


def downgrade() -> None:
    op.drop_index("ix_issued_certificates_kind_subject", table_name="issued_certificates")
    op.drop_table("issued_certificates")
    op.drop_table("join_tokens")
    op.drop_index("uq_cluster_cas_role", table_name="cluster_cas")
    op.drop_table("cluster_cas")
