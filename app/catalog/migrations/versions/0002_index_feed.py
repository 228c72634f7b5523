"""Scale-out: each chunk's embedding and the index change log, so replicas build FAISS from the catalog.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("chunks") as batch:
        batch.add_column(sa.Column("embedding", sa.LargeBinary, nullable=True))
    op.create_table(
        "index_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("document_id", sa.String(36), nullable=False),
        sa.Column("op", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("index_events")
    with op.batch_alter_table("chunks") as batch:
        batch.drop_column("embedding")
