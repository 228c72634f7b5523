"""Folder syncs: `folder_syncs` holds the folder each synced collection follows and what its last sync changed.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "folder_syncs",
        sa.Column("collection", sa.String(64), primary_key=True),
        sa.Column("folder", sa.String(4096), nullable=False),
        sa.Column("changes", sa.JSON, nullable=False),
        sa.Column("synced_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("folder_syncs")
