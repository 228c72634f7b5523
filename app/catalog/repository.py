"""`Catalog`: every read and write of the SQL catalog, returning typed records (never live ORM rows)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import case, create_engine, delete, event, func, insert, select, text, update
from sqlalchemy.engine import Engine as SQLEngine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from app.catalog.conversations import ConversationStore
from app.catalog.keys import KeyStore
from app.catalog.models import (
    DEFAULT_COLLECTION,
    ChunkRow,
    DocumentRow,
    DocumentStatus,
    IndexEventOp,
    IndexEventRow,
    JobRow,
    JobStatus,
    utcnow,
)
from app.catalog.sessions import SessionStore

# Taken (transaction-scoped) before writing an index event on PostgreSQL, so event ids are handed out in
# commit order; SQLite's single writer gives that order by itself.
_PG_INDEX_EVENT_LOCK = 0x626C656E6431


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    return np.asarray(token_ids, dtype="<i4").tobytes()


def decode_token_ids(blob: bytes) -> list[int]:
    return np.frombuffer(blob, dtype="<i4").tolist()


@dataclass(frozen=True)
class DocumentRecord:
    id: str
    title: str
    source_path: str | None
    content_hash: str | None
    status: DocumentStatus
    error: str | None
    tags: list[str]
    metadata: dict[str, Any]
    num_chunks: int
    num_tokens: int
    job_id: str | None
    created_at: datetime
    updated_at: datetime
    collection: str = DEFAULT_COLLECTION


@dataclass(frozen=True)
class ChunkRecord:
    id: int
    document_id: str
    index: int
    text: str
    token_ids: list[int]
    page: int | None
    kv_key: str | None
    title: str = ""
    char_start: int = 0
    char_end: int = 0


@dataclass(frozen=True)
class NewChunk:
    index: int
    text: str
    token_ids: list[int]
    page: int | None
    char_start: int
    char_end: int
    kv_key: str | None = None
    embedding: np.ndarray | None = None  # (dim,) float32 passage embedding, for replicas' indexes


@dataclass(frozen=True)
class IndexEntry:
    """A ready chunk with what an in-memory index needs: its embedding (None if never stored) and tags."""

    chunk: ChunkRecord
    tags: list[str]
    embedding: np.ndarray | None  # (dim,) float32
    collection: str = DEFAULT_COLLECTION


@dataclass(frozen=True)
class IndexEvent:
    id: int
    document_id: str
    op: IndexEventOp
    collection: str = DEFAULT_COLLECTION


@dataclass(frozen=True)
class CollectionCounts:
    """One collection's size in the catalog (its coverage comes from the CoverageService)."""

    name: str
    num_documents: int
    num_ready_documents: int
    num_chunks: int


@dataclass
class JobRecord:
    id: str
    status: JobStatus
    stage: str | None
    progress: dict[str, Any]
    errors: list[dict[str, Any]]
    spec: dict[str, Any]
    document_ids: list[str]
    duplicate_ids: list[str]
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    extra: dict[str, Any] = field(default_factory=dict)
    collection: str = DEFAULT_COLLECTION


def _doc(row: DocumentRow) -> DocumentRecord:
    return DocumentRecord(
        id=row.id,
        title=row.title,
        source_path=row.source_path,
        content_hash=row.content_hash,
        status=row.status,
        error=row.error,
        tags=list(row.tags or []),
        metadata=dict(row.metadata_ or {}),
        num_chunks=row.num_chunks,
        num_tokens=row.num_tokens,
        job_id=row.job_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        collection=row.collection,
    )


def _chunk(row: ChunkRow, title: str = "") -> ChunkRecord:
    return ChunkRecord(
        id=row.id,
        document_id=row.document_id,
        index=row.index,
        text=row.text,
        token_ids=decode_token_ids(row.token_ids_blob),
        page=row.page,
        kv_key=row.kv_key,
        title=title,
        char_start=row.char_start,
        char_end=row.char_end,
    )


def _job(row: JobRow) -> JobRecord:
    return JobRecord(
        id=row.id,
        status=row.status,
        stage=row.stage,
        progress=dict(row.progress or {}),
        errors=list(row.errors or []),
        spec=dict(row.spec or {}),
        document_ids=list(row.document_ids or []),
        duplicate_ids=list(row.duplicate_ids or []),
        cancel_requested=row.cancel_requested,
        created_at=row.created_at,
        updated_at=row.updated_at,
        collection=row.collection,
    )


class Catalog(SessionStore):
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

    # ---- documents -------------------------------------------------------------------------------

    def add_document(
        self,
        *,
        title: str,
        source_path: str | None,
        content_hash: str | None,
        tags: list[str],
        metadata: dict[str, Any],
        job_id: str | None,
        document_id: str | None = None,
        collection: str = DEFAULT_COLLECTION,
    ) -> DocumentRecord:
        with self._session() as s:
            row = DocumentRow(
                id=document_id or str(uuid.uuid4()),
                title=title,
                source_path=source_path,
                content_hash=content_hash,
                status=DocumentStatus.PENDING,
                tags=tags,
                metadata_=metadata,
                job_id=job_id,
                collection=collection,
            )
            s.add(row)
            s.flush()
            return _doc(row)

    def add_documents(self, documents: Sequence[dict[str, Any]]) -> None:
        """Insert many pending documents in one transaction. Each dict: id, title, source_path,
        content_hash, tags, metadata, job_id, and optionally collection (default `default`)."""
        if not documents:
            return
        now = utcnow()
        with self._session() as s:
            s.execute(
                insert(DocumentRow),
                [
                    {
                        "id": d["id"],
                        "title": d["title"],
                        "source_path": d["source_path"],
                        "content_hash": d["content_hash"],
                        "status": DocumentStatus.PENDING,
                        "error": None,
                        "tags": d["tags"],
                        "metadata_": d["metadata"],
                        "num_chunks": 0,
                        "num_tokens": 0,
                        "job_id": d["job_id"],
                        "collection": d.get("collection", DEFAULT_COLLECTION),
                        "created_at": now,
                        "updated_at": now,
                    }
                    for d in documents
                ],
            )

    def find_by_hashes(
        self, content_hashes: set[str], statuses: Sequence[DocumentStatus], collection: str | None = None
    ) -> dict[str, DocumentRecord]:
        """One active document per content hash, for those hashes that have one (in `collection` when given:
        the same text in two collections is two documents, each visible to its own keys)."""
        found: dict[str, DocumentRecord] = {}
        hashes = list(content_hashes)
        with self._session() as s:
            for start in range(0, len(hashes), 500):  # stay under SQL parameter limits
                rows = s.scalars(
                    select(DocumentRow).where(
                        DocumentRow.content_hash.in_(hashes[start : start + 500]),
                        DocumentRow.status.in_(list(statuses)),
                        *_in_collection(collection),
                    )
                )
                for row in rows:
                    found.setdefault(row.content_hash or "", _doc(row))
        return found

    def fail_pending(self, document_ids: Sequence[str], error: str) -> list[int]:
        """Mark the still-pending ones of these documents failed and drop their chunks, in bulk;
        returns the ids of the dropped chunks (to remove from the index)."""
        dropped: list[int] = []
        ids = list(document_ids)
        with self._session() as s:
            for start in range(0, len(ids), 500):
                part = ids[start : start + 500]
                pending = select(DocumentRow.id).where(
                    DocumentRow.id.in_(part), DocumentRow.status == DocumentStatus.PENDING
                )
                dropped += list(s.scalars(select(ChunkRow.id).where(ChunkRow.document_id.in_(pending))))
                s.execute(delete(ChunkRow).where(ChunkRow.document_id.in_(pending)))
                s.execute(
                    update(DocumentRow)
                    .where(DocumentRow.id.in_(part), DocumentRow.status == DocumentStatus.PENDING)
                    .values(status=DocumentStatus.FAILED, error=error, num_chunks=0, num_tokens=0)
                )
        return dropped

    def get_document(self, document_id: str) -> DocumentRecord | None:
        with self._session() as s:
            row = s.get(DocumentRow, document_id)
            return _doc(row) if row else None

    def find_by_hash(
        self, content_hash: str, statuses: Sequence[DocumentStatus], collection: str | None = None
    ) -> DocumentRecord | None:
        with self._session() as s:
            row = s.scalars(
                select(DocumentRow)
                .where(
                    DocumentRow.content_hash == content_hash,
                    DocumentRow.status.in_(list(statuses)),
                    *_in_collection(collection),
                )
                .limit(1)
            ).first()
            return _doc(row) if row else None

    def find_by_metadata(
        self, key: str, value: str, statuses: Sequence[DocumentStatus], collection: str | None = None
    ) -> DocumentRecord | None:
        """A document whose metadata has `key` equal to the string `value` (e.g. file_sha256)."""
        with self._session() as s:
            row = s.scalars(
                select(DocumentRow)
                .where(
                    DocumentRow.metadata_[key].as_string() == value,
                    DocumentRow.status.in_(list(statuses)),
                    *_in_collection(collection),
                )
                .limit(1)
            ).first()
            return _doc(row) if row else None

    def find_by_source(
        self, source_path: str, exclude_id: str | None = None, collection: str | None = None
    ) -> list[DocumentRecord]:
        """Documents ingested from `source_path` (in `collection` when given: a source is replaced only
        within its own collection)."""
        with self._session() as s:
            q = select(DocumentRow).where(DocumentRow.source_path == source_path, *_in_collection(collection))
            if exclude_id:
                q = q.where(DocumentRow.id != exclude_id)
            return [_doc(r) for r in s.scalars(q)]

    def list_documents(
        self,
        *,
        offset: int = 0,
        limit: int = 50,
        status: DocumentStatus | None = None,
        collections: Collection[str] | None = None,
    ) -> tuple[list[DocumentRecord], int]:
        """A page of documents, newest first, and the count matching; `collections` None: all of them."""
        with self._session() as s:
            q = select(DocumentRow).where(*_in_collections(collections))
            count_q = select(func.count()).select_from(DocumentRow).where(*_in_collections(collections))
            if status is not None:
                q = q.where(DocumentRow.status == status)
                count_q = count_q.where(DocumentRow.status == status)
            rows = s.scalars(q.order_by(DocumentRow.created_at.desc(), DocumentRow.id).offset(offset).limit(limit))
            return [_doc(r) for r in rows], int(s.scalar(count_q) or 0)

    def all_documents(self, collections: Collection[str] | None = None) -> list[DocumentRecord]:
        with self._session() as s:
            q = select(DocumentRow).where(*_in_collections(collections)).order_by(DocumentRow.created_at)
            return [_doc(r) for r in s.scalars(q)]

    def collection_counts(self, collections: Collection[str] | None = None) -> list[CollectionCounts]:
        """Every collection holding a document (or only those of `collections`), by name."""
        with self._session() as s:
            rows = s.execute(
                select(
                    DocumentRow.collection,
                    func.count(),
                    func.sum(case((DocumentRow.status == DocumentStatus.READY, 1), else_=0)),
                    func.sum(DocumentRow.num_chunks),
                )
                .where(*_in_collections(collections))
                .group_by(DocumentRow.collection)
                .order_by(DocumentRow.collection)
            ).all()
            return [
                CollectionCounts(name, int(n), int(ready or 0), int(chunks or 0)) for name, n, ready, chunks in rows
            ]

    def document_ids_in(self, collection: str) -> list[str]:
        with self._session() as s:
            q = select(DocumentRow.id).where(DocumentRow.collection == collection).order_by(DocumentRow.created_at)
            return list(s.scalars(q))

    def replace_chunks(self, document_id: str, chunks: Sequence[NewChunk]) -> list[int]:
        """Store a document's chunks (dropping any earlier ones); returns the new chunk ids in order."""
        with self._session() as s:
            s.execute(delete(ChunkRow).where(ChunkRow.document_id == document_id))
            rows = [
                ChunkRow(
                    document_id=document_id,
                    index=c.index,
                    text=c.text,
                    token_ids_blob=encode_token_ids(c.token_ids),
                    num_tokens=len(c.token_ids),
                    page=c.page,
                    char_start=c.char_start,
                    char_end=c.char_end,
                    kv_key=c.kv_key,
                    embedding=encode_embedding(c.embedding),
                )
                for c in chunks
            ]
            s.add_all(rows)
            s.flush()
            doc = s.get(DocumentRow, document_id)
            if doc is not None:
                doc.num_chunks = len(rows)
                doc.num_tokens = sum(len(c.token_ids) for c in chunks)
            return [r.id for r in rows]

    def set_kv_keys(self, keys_by_chunk_id: dict[int, str]) -> None:
        with self._session() as s:
            for chunk_id, key in keys_by_chunk_id.items():
                s.execute(update(ChunkRow).where(ChunkRow.id == chunk_id).values(kv_key=key))

    def set_chunk_token_ids(self, token_ids_by_chunk_id: dict[int, list[int]]) -> None:
        """New prompt ids for chunks whose text another tokenizer encoded (a model switch); the text, the
        embedding and the index entry stay. Their KV key is cleared: it was the other model's."""
        with self._session() as s:
            for chunk_id, ids in token_ids_by_chunk_id.items():
                s.execute(
                    update(ChunkRow)
                    .where(ChunkRow.id == chunk_id)
                    .values(token_ids_blob=encode_token_ids(ids), num_tokens=len(ids), kv_key=None)
                )

    def set_content_hash(self, document_id: str, content_hash: str, metadata: dict[str, Any]) -> None:
        with self._session() as s:
            row = s.get(DocumentRow, document_id)
            if row is not None:
                row.content_hash = content_hash
                row.metadata_ = {**dict(metadata), **(row.metadata_ or {})}

    def set_title(self, document_id: str, title: str) -> None:
        with self._session() as s:
            s.execute(update(DocumentRow).where(DocumentRow.id == document_id).values(title=title[:512]))

    def referenced_kv_keys(self, keys: set[str]) -> set[str]:
        """The subset of `keys` still used by some chunk (identical chunks share one KV entry)."""
        if not keys:
            return set()
        with self._session() as s:
            return set(s.scalars(select(ChunkRow.kv_key).where(ChunkRow.kv_key.in_(list(keys))).distinct()))

    def set_document_status(self, document_id: str, status: DocumentStatus, error: str | None = None) -> None:
        """Set a document's status; becoming ready (or leaving ready) is logged for the replicas' indexes."""
        with self._session() as s:
            old = s.scalar(select(DocumentRow.status).where(DocumentRow.id == document_id))
            if old is None:
                return
            if self.index_events and (status == DocumentStatus.READY or old == DocumentStatus.READY):
                op = IndexEventOp.READY if status == DocumentStatus.READY else IndexEventOp.REMOVED
                collection = s.scalar(select(DocumentRow.collection).where(DocumentRow.id == document_id))
                self._log_index_event(s, document_id, op, collection or DEFAULT_COLLECTION)
            s.execute(update(DocumentRow).where(DocumentRow.id == document_id).values(status=status, error=error))

    def delete_document(self, document_id: str) -> list[ChunkRecord] | None:
        """Delete a document and its chunks; returns the deleted chunks (None if there was no such document)."""
        with self._session() as s:
            row = s.get(DocumentRow, document_id)
            if row is None:
                return None
            chunks = [_chunk(c, row.title) for c in row.chunks]
            if self.index_events and row.status == DocumentStatus.READY:
                self._log_index_event(s, document_id, IndexEventOp.REMOVED, row.collection)
            s.delete(row)
            return chunks

    def delete_documents_with_status(
        self, status: DocumentStatus, collections: Collection[str] | None = None
    ) -> tuple[int, list[ChunkRecord]]:
        """Delete every document in `status` (of `collections`, None: all) with its chunks, in bulk;
        (documents deleted, their chunks)."""
        where = (DocumentRow.status == status, *_in_collections(collections))
        with self._session() as s:
            ids = select(DocumentRow.id).where(*where)
            chunks = [_chunk(c) for c in s.scalars(select(ChunkRow).where(ChunkRow.document_id.in_(ids)))]
            s.execute(delete(ChunkRow).where(ChunkRow.document_id.in_(ids)))
            result = s.execute(delete(DocumentRow).where(*where))
            return int(result.rowcount or 0), chunks  # type: ignore[attr-defined]

    def set_embeddings(self, embeddings_by_chunk_id: dict[int, np.ndarray]) -> None:
        with self._session() as s:
            for chunk_id, vector in embeddings_by_chunk_id.items():
                s.execute(update(ChunkRow).where(ChunkRow.id == chunk_id).values(embedding=encode_embedding(vector)))

    # ---- the index feed (replicas build FAISS from these) -----------------------------------------

    def _log_index_event(self, s: Session, document_id: str, op: IndexEventOp, collection: str) -> None:
        if self.dialect == "postgresql":
            # Held until this transaction commits: the next event's id is drawn only after this one is
            # visible, so ids become visible in order and a reader's cursor never skips one.
            s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_INDEX_EVENT_LOCK})
        s.add(IndexEventRow(document_id=document_id, op=op.value, collection=collection))
        s.flush()

    def last_index_event_id(self) -> int:
        with self._session() as s:
            return int(s.scalar(select(func.max(IndexEventRow.id))) or 0)

    def index_events_after(self, event_id: int, limit: int = 1000) -> list[IndexEvent]:
        with self._session() as s:
            rows = s.scalars(
                select(IndexEventRow).where(IndexEventRow.id > event_id).order_by(IndexEventRow.id).limit(limit)
            )
            return [
                IndexEvent(id=r.id, document_id=r.document_id, op=IndexEventOp(r.op), collection=r.collection)
                for r in rows
            ]

    def prune_index_events(self, before: datetime) -> int:
        """Drop events older than `before` (replicas further behind than that rebuild from scratch)."""
        with self._session() as s:
            return int(s.execute(delete(IndexEventRow).where(IndexEventRow.created_at < before)).rowcount or 0)

    def first_index_event_id(self) -> int:
        with self._session() as s:
            return int(s.scalar(select(func.min(IndexEventRow.id))) or 0)

    def index_entries(self, document_ids: Sequence[str] | None = None) -> list[IndexEntry]:
        """Chunks of ready documents (all of them, or of `document_ids`) with embeddings, in id order."""
        with self._session() as s:
            q = (
                select(ChunkRow, DocumentRow.title, DocumentRow.tags, DocumentRow.collection)
                .join(DocumentRow)
                .where(DocumentRow.status == DocumentStatus.READY)
            )
            if document_ids is not None:
                if not document_ids:
                    return []
                q = q.where(ChunkRow.document_id.in_(list(document_ids)))
            return [
                IndexEntry(
                    chunk=_chunk(c, title),
                    tags=list(tags or []),
                    embedding=decode_embedding(c.embedding),
                    collection=collection,
                )
                for c, title, tags, collection in s.execute(q.order_by(ChunkRow.id)).all()
            ]

    # ---- chunks ----------------------------------------------------------------------------------

    def chunks_by_ids(self, chunk_ids: Sequence[int]) -> dict[int, ChunkRecord]:
        if not chunk_ids:
            return {}
        with self._session() as s:
            rows = s.execute(
                select(ChunkRow, DocumentRow.title).join(DocumentRow).where(ChunkRow.id.in_(list(chunk_ids)))
            ).all()
            return {c.id: _chunk(c, title) for c, title in rows}

    def chunks_of(self, document_id: str) -> list[ChunkRecord]:
        with self._session() as s:
            row = s.get(DocumentRow, document_id)
            return [_chunk(c, row.title) for c in row.chunks] if row else []

    def iter_chunks(
        self, statuses: Sequence[DocumentStatus] | None = None, collections: Collection[str] | None = None
    ) -> list[ChunkRecord]:
        with self._session() as s:
            q = select(ChunkRow, DocumentRow.title).join(DocumentRow).where(*_in_collections(collections))
            if statuses is not None:
                q = q.where(DocumentRow.status.in_(list(statuses)))
            return [_chunk(c, title) for c, title in s.execute(q.order_by(ChunkRow.id)).all()]

    def all_ready_chunk_ids(self) -> set[int]:
        """Ids of every chunk of a ready document (what the index must hold)."""
        with self._session() as s:
            q = select(ChunkRow.id).join(DocumentRow).where(DocumentRow.status == DocumentStatus.READY)
            return set(s.scalars(q))

    def ready_chunk_ids(self, chunk_ids: Sequence[int], collections: Collection[str] | None = None) -> set[int]:
        """Those of `chunk_ids` whose document is ready (and in `collections`, when given)."""
        if not chunk_ids:
            return set()
        with self._session() as s:
            q = (
                select(ChunkRow.id)
                .join(DocumentRow)
                .where(
                    ChunkRow.id.in_(list(chunk_ids)),
                    DocumentRow.status == DocumentStatus.READY,
                    *_in_collections(collections),
                )
            )
            return set(s.scalars(q))

    # ---- jobs ------------------------------------------------------------------------------------

    def create_job(self, spec: dict[str, Any], collection: str = DEFAULT_COLLECTION) -> JobRecord:
        with self._session() as s:
            row = JobRow(
                id=str(uuid.uuid4()),
                status=JobStatus.QUEUED,
                spec=spec,
                progress={},
                errors=[],
                collection=collection,
            )
            s.add(row)
            s.flush()
            return _job(row)

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._session() as s:
            row = s.get(JobRow, job_id)
            return _job(row) if row else None

    def update_job(self, job_id: str, **values: Any) -> None:
        with self._session() as s:
            s.execute(update(JobRow).where(JobRow.id == job_id).values(**values))

    def jobs_with_status(self, statuses: Sequence[JobStatus]) -> list[JobRecord]:
        with self._session() as s:
            rows = s.scalars(select(JobRow).where(JobRow.status.in_(list(statuses))).order_by(JobRow.created_at))
            return [_job(r) for r in rows]

    def list_jobs(self, limit: int = 50, collections: Collection[str] | None = None) -> list[JobRecord]:
        with self._session() as s:
            q = select(JobRow).where(*_in_collections(collections, JobRow.collection))
            return [_job(r) for r in s.scalars(q.order_by(JobRow.created_at.desc()).limit(limit))]


def _in_collection(collection: str | None) -> tuple[Any, ...]:
    """WHERE clauses for one collection (none: every collection)."""
    return () if collection is None else (DocumentRow.collection == collection,)


def _in_collections(collections: Collection[str] | None, column: Any = None) -> tuple[Any, ...]:
    """WHERE clauses for a set of collections (None: every collection; an empty set matches nothing)."""
    if collections is None:
        return ()
    return ((DocumentRow.collection if column is None else column).in_(sorted(collections)),)


def encode_embedding(vector: np.ndarray | None) -> bytes | None:
    return None if vector is None else np.asarray(vector, dtype="<f4").tobytes()


def decode_embedding(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype="<f4").copy()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the ingest writer
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
