"""`IndexLog`: the index change log replicas build and keep their FAISS index from (part of `Catalog`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from app.catalog.models import ChunkRow, DocumentRow, DocumentStatus, IndexEventOp, IndexEventRow
from app.catalog.records import IndexEntry, IndexEvent, chunk_record, decode_embedding
from app.catalog.sessions import SessionStore

# Taken (transaction-scoped) before writing an index event on PostgreSQL, so event ids are handed out in
# commit order; SQLite's single writer gives that order by itself.
_PG_INDEX_EVENT_LOCK = 0x626C656E6431


class IndexLog(SessionStore):
    """Events in id order: a document became ready, or left ready (deleted, failed, re-ingested)."""

    dialect: str  # sqlite | postgresql
    index_events: bool  # whether documents' status changes are logged at all

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
                    chunk=chunk_record(c, title),
                    tags=list(tags or []),
                    embedding=decode_embedding(c.embedding),
                    collection=collection,
                )
                for c, title, tags, collection in s.execute(q.order_by(ChunkRow.id)).all()
            ]
