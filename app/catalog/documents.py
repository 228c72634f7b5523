"""`DocumentStore`: the catalog's documents and their chunks (part of `Catalog`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
from sqlalchemy import case, delete, func, insert, select, update

from app.catalog.index_log import IndexLog
from app.catalog.models import DEFAULT_COLLECTION, ChunkRow, DocumentRow, DocumentStatus, IndexEventOp, utcnow
from app.catalog.records import (
    ChunkRecord,
    CollectionCounts,
    DocumentRecord,
    NewChunk,
    NewDocument,
    chunk_record,
    document_record,
    encode_embedding,
    encode_token_ids,
    in_collection,
    in_collections,
)


class DocumentStore(IndexLog):
    """Documents and chunks; a document becoming ready (or leaving ready) is logged in the index feed."""

    # ---- documents -------------------------------------------------------------------------------

    def add_document(self, new: NewDocument) -> DocumentRecord:
        with self._session() as s:
            s.execute(insert(DocumentRow), [new.row(utcnow())])
            return document_record(s.get_one(DocumentRow, new.id))

    def add_documents(self, documents: Sequence[NewDocument]) -> None:
        """Insert many pending documents in one transaction."""
        if not documents:
            return
        now = utcnow()
        with self._session() as s:
            s.execute(insert(DocumentRow), [d.row(now) for d in documents])

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
                        *in_collection(collection),
                    )
                )
                for row in rows:
                    found.setdefault(row.content_hash or "", document_record(row))
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
            return document_record(row) if row else None

    def find_by_hash(
        self, content_hash: str, statuses: Sequence[DocumentStatus], collection: str | None = None
    ) -> DocumentRecord | None:
        with self._session() as s:
            row = s.scalars(
                select(DocumentRow)
                .where(
                    DocumentRow.content_hash == content_hash,
                    DocumentRow.status.in_(list(statuses)),
                    *in_collection(collection),
                )
                .limit(1)
            ).first()
            return document_record(row) if row else None

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
                    *in_collection(collection),
                )
                .limit(1)
            ).first()
            return document_record(row) if row else None

    def find_by_source(
        self, source_path: str, exclude_id: str | None = None, collection: str | None = None
    ) -> list[DocumentRecord]:
        """Documents ingested from `source_path` (in `collection` when given: a source is replaced only
        within its own collection)."""
        with self._session() as s:
            q = select(DocumentRow).where(DocumentRow.source_path == source_path, *in_collection(collection))
            if exclude_id:
                q = q.where(DocumentRow.id != exclude_id)
            return [document_record(r) for r in s.scalars(q)]

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
            q = select(DocumentRow).where(*in_collections(collections))
            count_q = select(func.count()).select_from(DocumentRow).where(*in_collections(collections))
            if status is not None:
                q = q.where(DocumentRow.status == status)
                count_q = count_q.where(DocumentRow.status == status)
            rows = s.scalars(q.order_by(DocumentRow.created_at.desc(), DocumentRow.id).offset(offset).limit(limit))
            return [document_record(r) for r in rows], int(s.scalar(count_q) or 0)

    def all_documents(self, collections: Collection[str] | None = None) -> list[DocumentRecord]:
        with self._session() as s:
            q = select(DocumentRow).where(*in_collections(collections)).order_by(DocumentRow.created_at)
            return [document_record(r) for r in s.scalars(q)]

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
                .where(*in_collections(collections))
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
            chunks = [chunk_record(c, row.title) for c in row.chunks]
            if self.index_events and row.status == DocumentStatus.READY:
                self._log_index_event(s, document_id, IndexEventOp.REMOVED, row.collection)
            s.delete(row)
            return chunks

    def delete_documents_with_status(
        self, status: DocumentStatus, collections: Collection[str] | None = None
    ) -> tuple[int, list[ChunkRecord]]:
        """Delete every document in `status` (of `collections`, None: all) with its chunks, in bulk;
        (documents deleted, their chunks)."""
        where = (DocumentRow.status == status, *in_collections(collections))
        with self._session() as s:
            ids = select(DocumentRow.id).where(*where)
            chunks = [chunk_record(c) for c in s.scalars(select(ChunkRow).where(ChunkRow.document_id.in_(ids)))]
            s.execute(delete(ChunkRow).where(ChunkRow.document_id.in_(ids)))
            result = s.execute(delete(DocumentRow).where(*where))
            return int(result.rowcount or 0), chunks  # type: ignore[attr-defined]

    def set_embeddings(self, embeddings_by_chunk_id: dict[int, np.ndarray]) -> None:
        with self._session() as s:
            for chunk_id, vector in embeddings_by_chunk_id.items():
                s.execute(update(ChunkRow).where(ChunkRow.id == chunk_id).values(embedding=encode_embedding(vector)))

    # ---- chunks ----------------------------------------------------------------------------------

    def chunks_by_ids(self, chunk_ids: Sequence[int]) -> dict[int, ChunkRecord]:
        if not chunk_ids:
            return {}
        with self._session() as s:
            rows = s.execute(
                select(ChunkRow, DocumentRow.title).join(DocumentRow).where(ChunkRow.id.in_(list(chunk_ids)))
            ).all()
            return {c.id: chunk_record(c, title) for c, title in rows}

    def chunks_before(self, document_id: str, index: int, containing: str, limit: int) -> list[ChunkRecord]:
        """Up to `limit` chunks of the document before chunk `index` whose text contains `containing`,
        latest first (the section of a passage is the heading of the latest of them that has one)."""
        with self._session() as s:
            q = (
                select(ChunkRow)
                .where(ChunkRow.document_id == document_id, ChunkRow.index < index)
                .where(ChunkRow.text.contains(containing, autoescape=True))
                .order_by(ChunkRow.index.desc())
                .limit(limit)
            )
            return [chunk_record(c) for c in s.scalars(q)]

    def chunks_of(self, document_id: str) -> list[ChunkRecord]:
        with self._session() as s:
            row = s.get(DocumentRow, document_id)
            return [chunk_record(c, row.title) for c in row.chunks] if row else []

    def iter_chunks(
        self, statuses: Sequence[DocumentStatus] | None = None, collections: Collection[str] | None = None
    ) -> list[ChunkRecord]:
        with self._session() as s:
            q = select(ChunkRow, DocumentRow.title).join(DocumentRow).where(*in_collections(collections))
            if statuses is not None:
                q = q.where(DocumentRow.status.in_(list(statuses)))
            return [chunk_record(c, title) for c, title in s.execute(q.order_by(ChunkRow.id)).all()]

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
                    *in_collections(collections),
                )
            )
            return set(s.scalars(q))
