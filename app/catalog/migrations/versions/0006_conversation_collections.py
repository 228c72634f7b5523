"""Conversations record the collections their turns searched (`collections`, JSON; NULL: every collection).

Conversations made before this revision have NULL: only a caller that may read every collection (the
admin, or anyone on a server without keys) sees them; no collection key or public scope does.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN on SQLite too (nullable, no rebuild): the turns' ON DELETE CASCADE never fires.
    op.add_column("conversations", sa.Column("collections", sa.JSON, nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":  # a SQLite drop needs a rebuild (see 0005): keep the column
        op.drop_column("conversations", "collections")
