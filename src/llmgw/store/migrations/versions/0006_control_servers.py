"""Control-plane servers: each server announces itself, so all of them can be listed.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "control_servers",
        sa.Column("server", sa.String(200), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("api_url", sa.String(300), nullable=False),
        sa.Column("agent_address", sa.String(300), nullable=False),
        sa.Column("started_at", _UTC, nullable=False),
        sa.Column("last_seen", _UTC, nullable=False),
        sa.PrimaryKeyConstraint("server", name=op.f("pk_control_servers")),
    )


def downgrade() -> None:
    op.drop_table("control_servers")
