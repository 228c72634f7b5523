"""DocumentService: the library as routers and the CLI see it (list, one document with its chunks'
KV state, delete, counts by status). A deletion removes the document's chunks, index entries and the
KV entries nothing else uses: not those other documents share, nor those a running ingest job holds
(`kv_in_use`) before it has committed the chunks that use them.

Deleting is how a full disk is freed, so a deletion that hits "no space" releases the storage reserve
(app/services/storage_faults.py) and runs again in the room that makes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from app.catalog import DocumentStatus
from app.catalog.records import ChunkRecord, DocumentRecord
from app.services.coverage_service import CoverageService
from app.services.storage_faults import StorageMonitor, is_storage_full

if TYPE_CHECKING:
    from app.catalog import Catalog
    from kvcache.store import TieredKVStore
    from retrieval.retriever import Retriever


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


class KeysInUse:
    """KV keys a running ingest job relies on but has not committed chunk rows for yet: a concurrent delete
    of another document sharing such an entry must not remove it."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def add(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._keys.update(keys)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()

    def among(self, keys: set[str]) -> set[str]:
        with self._lock:
            return keys & self._keys


class DocumentService:
    def __init__(
        self,
        catalog: Catalog,
        retriever: Retriever,
        store: TieredKVStore,
        *,
        coverage: CoverageService | None,
        storage: StorageMonitor | None = None,
        on_storage_fault: Callable[[str], None] | None = None,
    ) -> None:
        """`coverage` gives a document's chunks their KV states (`get`); None where no model is loaded (a
        command that only deletes). `storage` frees and restores the storage reserve around a deletion;
        `on_storage_fault` hears of an index snapshot a full disk kept from being saved (by default the
        storage monitor's `record`)."""
        self._catalog = catalog
        self._retriever = retriever
        self._store = store
        self._coverage = coverage
        self._storage = storage
        self._on_storage_fault = on_storage_fault or (storage.record if storage is not None else None)
        self.kv_in_use = KeysInUse()

    def list(
        self,
        offset: int,
        limit: int,
        status: DocumentStatus | None = None,
        collections: Collection[str] | None = None,
    ) -> tuple[list[DocumentRecord], int]:
        """Documents (of `collections`; None: all) newest first, and how many match over all pages."""
        return self._catalog.list_documents(offset=offset, limit=limit, status=status, collections=collections)

    def get(self, document_id: str, collections: Collection[str] | None = None) -> DocumentView | None:
        """One document with its chunks' KV states; None when unknown or outside `collections`."""
        doc = self._catalog.get_document(document_id)
        if doc is None or (collections is not None and doc.collection not in collections):
            return None
        chunks = self._catalog.chunks_of(document_id)
        states: dict[int, str] = {}
        if chunks:
            if self._coverage is None:
                raise RuntimeError("DocumentService built without coverage (no model loaded): no KV states")
            states = self._coverage.chunk_states(document_id)
        return DocumentView(doc, [ChunkView(c, states.get(c.id, "missing")) for c in chunks])

    def delete(self, document_id: str, collections: Collection[str] | None = None) -> None:
        """Delete a document with its chunks, index entries and unshared KV; nothing if it is unknown or
        outside `collections` (None: any collection)."""
        doc = self._catalog.get_document(document_id)
        if doc is not None and collections is not None and doc.collection not in collections:
            return  # another collection's document: answered like an unknown id, and left alone
        if doc is not None and doc.status == DocumentStatus.PENDING:
            raise DocumentBusy(
                f"document {document_id} is still being ingested by job {doc.job_id}; cancel the job first"
            )
        self._freeing_space(lambda: self.delete_document(document_id))

    def purge_failed(self, collections: Collection[str] | None = None) -> int:
        """Delete every failed document (of `collections`; None: all) with whatever chunks it had, in bulk;
        returns how many."""
        return self._freeing_space(lambda: self._purge_failed(collections))

    def delete_document(self, document_id: str) -> bool:
        """Delete a document with its chunks, index entries and (unshared) KV entries, whatever its
        status; False if it is unknown."""
        deleted = self._catalog.delete_document(document_id)
        if deleted is None:
            return False
        self._drop_chunks(deleted)
        return True

    def _purge_failed(self, collections: Collection[str] | None) -> int:
        num_deleted, chunks = self._catalog.delete_documents_with_status(DocumentStatus.FAILED, collections)
        self._drop_chunks(chunks)
        logger.info("purged %d failed documents", num_deleted)
        return num_deleted

    def _drop_chunks(self, deleted: list[ChunkRecord]) -> None:
        """Index entries and unshared KV entries of chunks just deleted from the catalog."""
        if not deleted:
            return
        self._retriever.remove([c.id for c in deleted])
        keys = {c.kv_key for c in deleted if c.kv_key}
        still_used = self._catalog.referenced_kv_keys(keys) | self.kv_in_use.among(keys)
        for key in keys - still_used:  # first: it frees the space the snapshot below needs
            self._store.delete(key)
        try:
            self._retriever.save()
        except OSError as exc:
            if not is_storage_full(exc):
                raise
            # The catalog (the truth) and the in-memory index are right; the snapshot is written at the next
            # save, or brought level with the catalog at the next start.
            logger.warning("index snapshot not saved after a deletion (disk full): %s", exc)
            if self._on_storage_fault is not None:
                self._on_storage_fault(f"{type(exc).__name__}: {exc}")

    def drop_unused_kv(self, keys: set[str], keep: set[str]) -> None:
        """Delete the KV entries among `keys` that no committed chunk uses and `keep` does not name (an
        ingest job's entries for documents that failed). Best effort: doctor --repair removes what is left."""
        if not keys:
            return
        try:
            still_used = self._catalog.referenced_kv_keys(keys) | keep
            for key in keys - still_used:
                self._store.delete(key)
        except Exception as exc:
            logger.warning("could not remove the KV entries of failed documents: %s", exc)

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
            status.value: self._catalog.list_documents(offset=0, limit=1, status=status, collections=collections)[1]
            for status in DocumentStatus
        }
