"""`Catalog`: every read and write of the SQL catalog, returning typed records (never live ORM rows).

One object, stored things apart: documents and chunks (`documents.py`), ingest jobs (`jobs.py`), the
index change log (`index_log.py`), conversations (`Catalog.conversations`), keys (`Catalog.keys`) and synced
folders (`Catalog.syncs`); the records they return are in `records.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine as SQLEngine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import sessionmaker

from app.catalog.conversations import ConversationStore
from app.catalog.documents import DocumentStore
from app.catalog.jobs import JobStore
from app.catalog.keys import KeyStore
from app.catalog.records import (
    ChunkRecord,
    CollectionCounts,
    DocumentRecord,
    IndexEntry,
    IndexEvent,
    JobRecord,
    JobUpdate,
    NewChunk,
    NewDocument,
    decode_embedding,
    decode_token_ids,
    encode_embedding,
    encode_token_ids,
)
from app.catalog.syncs import SyncStore

__all__ = [
    "Catalog",
    "ChunkRecord",
    "CollectionCounts",
    "DocumentRecord",
    "IndexEntry",
    "IndexEvent",
    "JobRecord",
    "JobUpdate",
    "NewChunk",
    "NewDocument",
    "decode_embedding",
    "decode_token_ids",
    "encode_embedding",
    "encode_token_ids",
]


class Catalog(DocumentStore, JobStore):
    """Thread-safe access to the catalog database (one short session per call)."""

    def __init__(self, url: str, *, migrate: bool = True, index_events: bool | None = None) -> None:
        """Open the catalog at a SQLAlchemy URL (`sqlite:///…` or `postgresql+psycopg://…`).

        `migrate`: bring the schema to the newest Alembic revision first (what `blendrag db upgrade`
        does); without it a catalog behind the code's revision is refused with a clear message.
        `index_events`: log documents becoming ready / leaving ready for replicas' indexes (app/index_sync.py);
        by default on PostgreSQL only, since a SQLite catalog has exactly one server.
        """
        self.dialect = make_url(url).get_backend_name()
        self.index_events = self.dialect == "postgresql" if index_events is None else index_events
        if self.dialect == "sqlite":
            if url.startswith("sqlite:///"):
                Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            self._engine: SQLEngine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
            event.listen(self._engine, "connect", _sqlite_pragmas)
        elif self.dialect == "postgresql":
            try:
                import pgqueuer  # noqa: F401  (its tables are part of the PostgreSQL schema)
                import psycopg  # noqa: F401
            except ImportError as exc:
                raise RuntimeError(
                    "a PostgreSQL catalog needs the postgres extra: "
                    "pip install 'blendrag[postgres]' (psycopg, pgqueuer)"
                ) from exc
            self._engine = create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)
        else:
            raise ValueError(f"catalog.url: unsupported database {self.dialect!r} (use sqlite or postgresql)")
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        self.conversations = ConversationStore(self._sessions)
        self.keys = KeyStore(self._sessions)
        self.syncs = SyncStore(self._sessions)
        from app.catalog import migrate as migrations

        if migrate:
            migrations.upgrade(self._engine)
        else:
            current, head = migrations.current_revision(self._engine), migrations.head_revision()
            if current != head:
                raise RuntimeError(
                    f"catalog schema is at revision {current}, this version needs {head}: run `blendrag db upgrade`"
                )

    @property
    def engine(self) -> SQLEngine:
        return self._engine

    def close(self) -> None:
        self._engine.dispose()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the ingest writer
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
