"""Collections and keys: every document and ingest job belongs to a collection (existing rows: `default`),
the index change log names it, and `api_keys` holds the hashes of collection keys.

The columns are added with a plain ALTER TABLE ADD COLUMN and a server default, on SQLite too: a batch
rebuild of `documents` would drop the table, and its ON DELETE CASCADE would take every chunk with it.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_COLUMN_TABLES = ("documents", "ingest_jobs", "index_events")
_INDEXED = ("documents", "ingest_jobs")


def upgrade() -> None:
    for table in _COLUMN_TABLES:
        op.add_column(table, sa.Column("collection", sa.String(64), nullable=False, server_default="default"))
    for table in _INDEXED:
        op.create_index(f"ix_{table}_collection", table, ["collection"])
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("collections", sa.JSON, nullable=False),
        sa.Column("can_ingest", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
    for table in _INDEXED:
        op.drop_index(f"ix_{table}_collection", table_name=table)
    # Dropping a column on SQLite needs a table rebuild; `documents` is rebuilt without its cascade firing
    # only when foreign keys are off, which Alembic's batch mode does not ensure: keep the column there.
    for table in _COLUMN_TABLES:
        if op.get_bind().dialect.name != "sqlite":
            op.drop_column(table, "collection")
