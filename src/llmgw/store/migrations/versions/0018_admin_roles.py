"""Users and API keys get a role on the admin surface (admin, operator, viewer) instead
of only an admin flag; existing admins become `admin`, everyone else has no role.

The old flags stay, written as "role is admin", for readers that predate roles.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("admin_role", sa.String(16), nullable=True))
    op.add_column("users", sa.Column("admin_role", sa.String(16), nullable=True))
    op.execute("UPDATE api_keys SET admin_role = 'admin' WHERE is_admin")
    op.execute("UPDATE users SET admin_role = 'admin' WHERE admin")


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_column("admin_role")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("admin_role")
