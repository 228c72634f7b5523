"""Schema migrations of the catalog (Alembic), the same revisions for SQLite and PostgreSQL.

`upgrade(engine)` brings a database to the newest revision. A SQLite catalog created before migrations
existed (tables, no `alembic_version`) is stamped as revision 0001 first, so its data is kept. On
PostgreSQL the upgrade holds an advisory lock, so replicas and workers starting together migrate once.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine

logger = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
BASELINE_REVISION = "0001"  # the schema `Base.metadata.create_all` made before migrations existed
_PG_MIGRATION_LOCK = 0x626C656E64  # advisory lock key: "blend"


def include_name(name: str | None, type_: str, _parent_names: object) -> bool:
    """Autogenerate/compare filter: the job queue's tables belong to PgQueuer (migration 0003), not the models."""
    return not (type_ == "table" and (name or "").startswith("pgqueuer"))


def _config(connection: Connection):  # -> alembic.config.Config
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    config = _config(None)  # type: ignore[arg-type]
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate the catalog to `revision`; returns (revision before, revision after)."""
    from alembic import command

    if revision == "head":
        # The common case, every start of every replica: already there, so take no lock.
        current = current_revision(engine)
        if current == head_revision():
            return current, current

    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        config = _config(connection)
        tables = set(inspect(connection).get_table_names())
        if "alembic_version" not in tables and "documents" in tables:
            logger.info("catalog predates migrations: stamping it as revision %s", BASELINE_REVISION)
            command.stamp(config, BASELINE_REVISION)
        from alembic.runtime.migration import MigrationContext

        before = MigrationContext.configure(connection).get_current_revision()
        command.upgrade(config, revision)
        after = MigrationContext.configure(connection).get_current_revision()
    if before != after:
        logger.info("catalog migrated from %s to %s", before, after)
    return before, after
