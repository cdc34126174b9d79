"""Users who sign in through OpenID Connect: the issuer and subject that identify them
(NULL for local users), and the pending sign-ins (state, nonce, PKCE verifier), kept in
the store so that the provider may send the browser back to any server.

Revision ID: 0026
Revises: 0022
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

_UTC = sa.DateTime(timezone=True)

revision: str = "0026"
down_revision: str | None = "0022"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("sso_issuer", sa.String(255), nullable=True))
        batch.add_column(sa.Column("sso_subject", sa.String(255), nullable=True))
        batch.create_index("ix_users_sso", ["sso_issuer", "sso_subject"], unique=True)
    op.create_table(
        "oidc_logins",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("nonce", sa.String(128), nullable=False),
        sa.Column("code_verifier", sa.String(128), nullable=False),
        sa.Column("redirect_uri", sa.String(1024), nullable=False),
        sa.Column("created_at", _UTC, nullable=False),
        sa.Column("expires_at", _UTC, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_oidc_logins")),
    )
    op.create_index("ix_oidc_logins_expires_at", "oidc_logins", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_oidc_logins_expires_at", table_name="oidc_logins")
    op.drop_table("oidc_logins")
    with op.batch_alter_table("users") as batch:
        batch.drop_index("ix_users_sso")
        batch.drop_column("sso_subject")
        batch.drop_column("sso_issuer")
