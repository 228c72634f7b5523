"""Alembic migrations: one set of revisions for SQLite and PostgreSQL, matching the models exactly."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine, event, inspect

from app.catalog import Catalog, DocumentStatus
from app.catalog import migrate as migrations
from app.catalog.models import Base, IndexEventOp
from app.catalog.records import NewChunk, NewDocument

# What `Base.metadata.create_all` made on SQLite before the catalog had migrations (schema of revision 0001).
LEGACY_SQLITE_SCHEMA = """
CREATE TABLE documents (id VARCHAR(36) NOT NULL, title VARCHAR(512) NOT NULL, source_path VARCHAR(2048),
  content_hash VARCHAR(64), status VARCHAR(7) NOT NULL, error TEXT, tags JSON NOT NULL, metadata JSON NOT NULL,
  num_chunks INTEGER NOT NULL, num_tokens INTEGER NOT NULL, job_id VARCHAR(36), created_at DATETIME NOT NULL,
  updated_at DATETIME NOT NULL, PRIMARY KEY (id));
CREATE INDEX ix_documents_source_path ON documents (source_path);
CREATE INDEX ix_documents_status ON documents (status);
CREATE INDEX ix_documents_job_id ON documents (job_id);
CREATE INDEX ix_documents_content_hash ON documents (content_hash);
CREATE TABLE ingest_jobs (id VARCHAR(36) NOT NULL, status VARCHAR(9) NOT NULL, stage VARCHAR(32),
  progress JSON NOT NULL, errors JSON NOT NULL, spec JSON NOT NULL, document_ids JSON NOT NULL,
  duplicate_ids JSON NOT NULL, cancel_requested BOOLEAN NOT NULL, created_at DATETIME NOT NULL,
  updated_at DATETIME NOT NULL, PRIMARY KEY (id));
CREATE INDEX ix_ingest_jobs_status ON ingest_jobs (status);
CREATE TABLE chunks (id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, document_id VARCHAR(36) NOT NULL,
  "index" INTEGER NOT NULL, text TEXT NOT NULL, token_ids_blob BLOB NOT NULL, num_tokens INTEGER NOT NULL,
  page INTEGER, char_start INTEGER NOT NULL, char_end INTEGER NOT NULL, kv_key VARCHAR(128),
  FOREIGN KEY(document_id) REFERENCES documents (id) ON DELETE CASCADE);
CREATE INDEX ix_chunks_kv_key ON chunks (kv_key);
CREATE INDEX ix_chunks_document_id ON chunks (document_id);
INSERT INTO documents VALUES ('d1', 'Old doc', NULL, 'h1', 'READY', NULL, '["t"]', '{}', 2, 3, NULL,
  '2026-01-01 00:00:00', '2026-01-01 00:00:00');
INSERT INTO chunks VALUES (7, 'd1', 0, 'first', X'0500000006000000', 2, NULL, 0, 5, 'k7');
INSERT INTO chunks VALUES (8, 'd1', 1, 'second', X'07000000', 1, NULL, 6, 12, 'k8');
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'cat.db'}"
    return request.getfixturevalue("pg_url")


def _chunk(i: int) -> NewChunk:
    return NewChunk(
        index=i,
        text=f"c{i}",
        token_ids=[i + 1],
        page=None,
        char_start=0,
        char_end=2,
        embedding=np.full(4, i, dtype=np.float32),
    )


def test_migrations_build_exactly_the_models(url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = create_engine(url)
    before, after = migrations.upgrade(engine)
    assert (before, after) == (None, migrations.head_revision())
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_name": migrations.include_name})
        diff = compare_metadata(context, Base.metadata)
        queue_tables = {t for t in inspect(conn).get_table_names() if t.startswith("pgqueuer")}
    engine.dispose()
    assert diff == []
    # the job queue exists on PostgreSQL only (SQLite runs jobs in-process)
    assert queue_tables == (
        {"pgqueuer", "pgqueuer_log", "pgqueuer_statistics", "pgqueuer_schedules"}
        if url.startswith("postgresql")
        else set()
    )
    # a second upgrade is a no-op
    engine = create_engine(url)
    assert migrations.upgrade(engine) == (after, after)
    engine.dispose()


def test_chunk_ids_are_never_reused(url: str) -> None:
    """SQLite needs AUTOINCREMENT for this; PostgreSQL's sequence never goes back, even after a rollback."""
    catalog = Catalog(url)
    doc = catalog.add_document(NewDocument(title="A"))
    first = catalog.replace_chunks(doc.id, [_chunk(0), _chunk(1), _chunk(2)])
    catalog.delete_document(doc.id)  # the highest ids are free again, as far as max(id) can tell
    doc2 = catalog.add_document(NewDocument(title="B"))
    second = catalog.replace_chunks(doc2.id, [_chunk(0)])
    assert second[0] > max(first)
    # an aborted insert burns its id too: a FAISS entry written before the crash never gets reused
    with pytest.raises(Exception):  # noqa: B017 (the driver's integrity error differs per backend)
        catalog.replace_chunks("no-such-document", [_chunk(0)])
    third = catalog.replace_chunks(doc2.id, [_chunk(1)])
    assert third[0] > second[0]
    catalog.close()


def test_index_events_follow_ready_and_delete(url: str) -> None:
    catalog = Catalog(url, index_events=True)
    assert catalog.last_index_event_id() == 0
    doc = catalog.add_document(NewDocument(title="A", tags=["x"]))
    ids = catalog.replace_chunks(doc.id, [_chunk(0), _chunk(1)])
    catalog.set_document_status(doc.id, DocumentStatus.FAILED, error="x")  # pending -> failed: never indexed
    assert catalog.index_events_after(0) == []
    catalog.set_document_status(doc.id, DocumentStatus.READY)
    entries = catalog.index_entries([doc.id])
    assert [e.chunk.id for e in entries] == ids
    assert [e.embedding.tolist() for e in entries] == [[0.0] * 4, [1.0] * 4]
    assert entries[0].tags == ["x"]
    catalog.delete_document(doc.id)
    events = catalog.index_events_after(0)
    assert [(e.document_id, e.op) for e in events] == [(doc.id, IndexEventOp.READY), (doc.id, IndexEventOp.REMOVED)]
    assert events[1].id > events[0].id == catalog.first_index_event_id()
    assert catalog.index_events_after(events[0].id) == events[1:]
    assert catalog.index_entries() == []
    catalog.close()


def test_index_events_are_logged_on_postgresql_only_by_default(url: str) -> None:
    catalog = Catalog(url)
    doc = catalog.add_document(NewDocument(title="A"))
    catalog.set_document_status(doc.id, DocumentStatus.READY)
    catalog.delete_document(doc.id)
    logged = [e.op for e in catalog.index_events_after(0)]
    assert logged == ([IndexEventOp.READY, IndexEventOp.REMOVED] if url.startswith("postgresql") else [])
    catalog.close()


def test_legacy_sqlite_catalog_is_stamped_and_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(LEGACY_SQLITE_SCHEMA)
    catalog = Catalog(f"sqlite:///{path}")
    assert migrations.current_revision(catalog.engine) == migrations.head_revision()
    doc = catalog.get_document("d1")
    assert (doc.title, doc.status, doc.tags) == ("Old doc", DocumentStatus.READY, ["t"])
    assert [(c.id, c.token_ids) for c in catalog.chunks_of("d1")] == [(7, [5, 6]), (8, [7])]
    # chunks from before 0002 have no embedding: a replica embeds them (see app/index_sync.py)
    assert [e.embedding for e in catalog.index_entries()] == [None, None]
    # AUTOINCREMENT survived the migration: the next id is above every id ever used
    catalog.delete_document("d1")
    new = catalog.add_document(NewDocument(title="N"))
    assert catalog.replace_chunks(new.id, [_chunk(0)]) == [9]
    catalog.close()


def test_catalog_without_auto_upgrade_refuses_an_old_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cat.db'}"
    engine = create_engine(url)
    migrations.upgrade(engine, "0001")
    engine.dispose()
    with pytest.raises(
        RuntimeError, match=rf"revision 0001, this version needs {migrations.head_revision()}.*blendrag db upgrade"
    ):
        Catalog(url, migrate=False)
    Catalog(url).close()  # the default upgrades
    Catalog(url, migrate=False).close()


def test_events_of_transactions_committing_at_once_are_never_skipped(url: str) -> None:
    """Two jobs commit together; the slower commit drew its event id first. A reader that saw the later id
    must also see the earlier one (ids become visible in order), or a replica would skip a document."""
    slow, fast = Catalog(url, index_events=True), Catalog(url, index_events=True)
    docs = []
    for c in (slow, fast):
        doc = c.add_document(NewDocument(title="A"))
        c.replace_chunks(doc.id, [_chunk(0)])
        docs.append(doc.id)
    in_commit = threading.Event()
    release = threading.Event()

    def hold_commit(_conn: object) -> None:  # runs just before the slow catalog's COMMIT
        in_commit.set()
        release.wait(10)

    event.listen(slow.engine, "commit", hold_commit)
    slow_thread = threading.Thread(target=slow.set_document_status, args=(docs[0], DocumentStatus.READY))
    slow_thread.start()
    assert in_commit.wait(10)
    fast_thread = threading.Thread(target=fast.set_document_status, args=(docs[1], DocumentStatus.READY))
    fast_thread.start()
    fast_thread.join(1.0)
    # While the slow commit is open, a reader sees no event at all (not the fast one's id alone).
    seen_early = [e.document_id for e in fast.index_events_after(0)]
    release.set()
    slow_thread.join(10)
    fast_thread.join(10)
    event.remove(slow.engine, "commit", hold_commit)
    assert seen_early == []
    assert [e.document_id for e in fast.index_events_after(0)] == docs
    slow.close()
    fast.close()


def test_a_0004_catalog_migrates_into_the_default_collection(url: str) -> None:
    """Documents, their chunks, jobs and change-log rows of a catalog made before collections all land in
    `default`; no chunk is lost (the column is added in place, `documents` is not rebuilt)."""
    from sqlalchemy import text

    engine = create_engine(url)
    migrations.upgrade(engine, "0004")
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.execute(text("PRAGMA foreign_keys=ON"))  # as the catalog runs: a table rebuild would cascade
        conn.execute(
            text(
                "INSERT INTO documents (id, title, status, tags, metadata, num_chunks, num_tokens, created_at, "
                "updated_at) VALUES ('d1', 'Old doc', 'READY', '[]', '{}', 2, 3, :t, :t)"
            ),
            {"t": "2026-01-01 00:00:00"},
        )
        for chunk_id, blob in ((7, b"\x05\x00\x00\x00\x06\x00\x00\x00"), (8, b"\x07\x00\x00\x00")):
            conn.execute(
                text(
                    'INSERT INTO chunks (id, document_id, "index", text, token_ids_blob, num_tokens, char_start, '
                    "char_end) VALUES (:id, 'd1', :i, 'c', :b, 1, 0, 1)"
                ),
                {"id": chunk_id, "i": chunk_id - 7, "b": blob},
            )
        conn.execute(
            text(
                "INSERT INTO ingest_jobs (id, status, progress, errors, spec, document_ids, duplicate_ids, "
                "cancel_requested, created_at, updated_at) VALUES ('j1', 'SUCCEEDED', '{}', '[]', '{}', '[]', "
                "'[]', false, :t, :t)"
            ),
            {"t": "2026-01-01 00:00:00"},
        )
        conn.execute(
            text("INSERT INTO index_events (document_id, op, created_at) VALUES ('d1', 'ready', :t)"),
            {"t": "2026-01-01 00:00:00"},
        )
    assert migrations.upgrade(engine) == ("0004", migrations.head_revision())
    engine.dispose()
    catalog = Catalog(url)
    doc = catalog.get_document("d1")
    assert (doc.title, doc.collection) == ("Old doc", "default")
    assert [(c.id, c.token_ids) for c in catalog.chunks_of("d1")] == [(7, [5, 6]), (8, [7])]
    assert catalog.get_job("j1").collection == "default"
    assert [(e.document_id, e.collection) for e in catalog.index_events_after(0)] == [("d1", "default")]
    assert [(c.name, c.num_documents, c.num_chunks) for c in catalog.collection_counts()] == [("default", 1, 2)]
    assert catalog.keys.count() == 0
    # new rows go to the collection they are given, and listing is scoped by it
    other = catalog.add_document(NewDocument(title="New", source_path="a.txt", content_hash="h", collection="team-b"))
    assert [d.id for d in catalog.list_documents(collections={"team-b"})[0]] == [other.id]
    assert catalog.list_documents(collections={"default"})[1] == 1
    assert catalog.find_by_source("a.txt", collection="default") == []
    assert [d.id for d in catalog.find_by_source("a.txt", collection="team-b")] == [other.id]
    assert catalog.find_by_hash("h", [DocumentStatus.PENDING], collection="default") is None
    catalog.close()


def test_a_0005_catalogs_conversations_migrate_as_over_every_collection(url: str) -> None:
    """Conversations made before they recorded their collections keep their turns and count as asked over
    every collection: only a caller that may read everything opens them, no collection key or public scope."""
    from sqlalchemy import text

    engine = create_engine(url)
    migrations.upgrade(engine, "0005")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO conversations (id, owner, title, num_turns, created_at, updated_at) "
                "VALUES ('c1', NULL, 'Old question', 1, :t, :t)"
            ),
            {"t": "2026-01-01 00:00:00"},
        )
        conn.execute(
            text(
                'INSERT INTO conversation_turns (conversation_id, "index", question, answer, source_chunk_ids, '
                "mode, selector, recompute_ratio, timings, usage, created_at) VALUES ('c1', 0, 'Old question', "
                "'Old answer', '[7]', 'blend', NULL, 0.15, '{}', '{}', :t)"
            ),
            {"t": "2026-01-01 00:00:00"},
        )
    assert migrations.upgrade(engine) == ("0005", migrations.head_revision())
    engine.dispose()
    catalog = Catalog(url)
    store = catalog.conversations
    assert store.get("c1", None, frozenset({"default"})) is None
    record = store.get("c1", None, None)
    assert (record.title, record.collections) == ("Old question", None)
    assert [(t.question, t.answer, t.source_chunk_ids) for t in store.turns("c1")] == [
        ("Old question", "Old answer", [7])
    ]
    made = store.create("key:x", "New question", frozenset({"beta", "alpha"}))
    assert store.get(made.id, "key:x", frozenset({"alpha", "beta", "gamma"})).collections == {"alpha", "beta"}
    catalog.close()
