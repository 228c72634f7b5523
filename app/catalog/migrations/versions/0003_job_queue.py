"""Scale-out: the PostgreSQL ingest job queue (PgQueuer's tables). Nothing on SQLite (in-process jobs).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    from app.jobs.pg_queue import install_sql

    op.get_bind().exec_driver_sql(install_sql())


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    from app.jobs.pg_queue import uninstall_sql

    op.get_bind().exec_driver_sql(uninstall_sql())
