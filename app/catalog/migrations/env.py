"""Alembic environment: always run from `app.catalog.migrate` with an open connection (no alembic.ini)."""

from __future__ import annotations

from alembic import context

from app.catalog.migrate import include_name
from app.catalog.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `blendrag db upgrade` (app.catalog.migrate), not the alembic CLI")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    include_name=include_name,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
