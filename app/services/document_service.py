"""DocumentService: the library as routers and the CLI see it (list, one document with its chunks'
KV state, delete, counts by status). Reads the catalog; deletion goes through the IngestService, which
owns the index and the KV entries a document shares with others.

Deleting is how a full disk is freed, so a deletion that hits "no space" releases the storage reserve
(app/services/storage_faults.py) and runs again in the room that makes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from app.catalog import DocumentStatus
from app.catalog.repository import ChunkRecord, DocumentRecord
from app.services.storage_faults import StorageMonitor, is_storage_full

if TYPE_CHECKING:
    from app.components import Components
    from app.services.coverage_service import CoverageService
    from app.services.ingest_service import IngestService


logger = logging.getLogger(__name__)
T = TypeVar("T")


class DocumentBusy(Exception):
    """The document is still being ingested: its job must finish or be cancelled first (HTTP 409)."""


@dataclass(frozen=True)
class ChunkView:
    record: ChunkRecord
    kv_state: str  # fresh | stale | missing


@dataclass(frozen=True)
class DocumentView:
    document: DocumentRecord
    chunks: list[ChunkView]

    def kv_counts(self) -> dict[str, int]:
        return {s: sum(c.kv_state == s for c in self.chunks) for s in ("fresh", "stale", "missing")}


class DocumentService:
    def __init__(
        self,
        components: Components,
        ingest: IngestService,
        coverage: CoverageService,
        storage: StorageMonitor | None = None,
    ) -> None:
        self._c = components
        self._ingest = ingest
        self._coverage = coverage
        self._storage = storage

    def list(
        self,
        offset: int,
        limit: int,
        status: DocumentStatus | None = None,
        collections: Collection[str] | None = None,
    ) -> tuple[list[DocumentRecord], int]:
        """Documents (of `collections`; None: all) newest first, and how many match over all pages."""
        return self._c.catalog.list_documents(offset=offset, limit=limit, status=status, collections=collections)

    def get(self, document_id: str, collections: Collection[str] | None = None) -> DocumentView | None:
        """One document with its chunks' KV states; None when unknown or outside `collections`."""
        doc = self._c.catalog.get_document(document_id)
        if doc is None or (collections is not None and doc.collection not in collections):
            return None
        chunks = self._c.catalog.chunks_of(document_id)
        states = self._coverage.chunk_states(document_id) if chunks else {}
        return DocumentView(doc, [ChunkView(c, states.get(c.id, "missing")) for c in chunks])

    def delete(self, document_id: str, collections: Collection[str] | None = None) -> None:
        """Delete a document with its chunks, index entries and unshared KV; nothing if it is unknown or
        outside `collections` (None: any collection)."""
        doc = self._c.catalog.get_document(document_id)
        if doc is None or (collections is not None and doc.collection not in collections):
            return
        if doc.status == DocumentStatus.PENDING:
            raise DocumentBusy(
                f"document {document_id} is still being ingested by job {doc.job_id}; cancel the job first"
            )
        self._freeing_space(lambda: self._ingest.delete_document(document_id))

    def purge_failed(self, collections: Collection[str] | None = None) -> int:
        """Delete every failed document (of `collections`; None: all); returns how many."""
        return self._freeing_space(lambda: self._ingest.purge_failed(collections))

    def _freeing_space(self, delete: Callable[[], T]) -> T:
        """Run a deletion; on a full disk, once more after releasing the storage reserve. A deletion either
        changed nothing in the catalog (one transaction) or finished, so running it again is safe."""
        try:
            result = delete()
        except Exception as exc:
            if self._storage is None or not is_storage_full(exc) or not self._storage.release_reserve():
                raise
            logger.warning("deletion hit a full disk (%s); retrying in the released reserve", exc)
            result = delete()
        if self._storage is not None:
            self._storage.ensure_reserve()  # back once the disk has room
        return result

    def count_by_status(self, collections: Collection[str] | None = None) -> dict[str, int]:
        return {
            status.value: self._c.catalog.list_documents(offset=0, limit=1, status=status, collections=collections)[1]
            for status in DocumentStatus
        }
