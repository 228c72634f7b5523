"""One index for all replicas: FAISS in each replica's memory, fed from the PostgreSQL catalog.

The catalog stores every chunk's embedding and logs each document that becomes ready or stops being
ready (`index_events`, ids visible in commit order). A replica builds its index from the catalog at
start, remembering the newest event id it had seen *before* reading, then polls the log and re-reads
the current chunks of each document named since: whatever order jobs commit in, every replica ends with
exactly the ready chunks of the catalog, within one poll interval (0.5 s by default).

With the SQLite catalog the server keeps its FAISS snapshot on disk (`open_snapshot_retriever`), and
the catalog is still the source of truth: a snapshot that cannot be read is rebuilt from it, and one that
disagrees with it (chunks missing or extra, e.g. an index dir moved aside) is brought level before the
server says it is ready.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

import numpy as np

from app.background import BackgroundThread
from retrieval.retriever import Retriever
from retrieval.types import IndexedChunk, IndexMismatchError

if TYPE_CHECKING:
    from app.catalog import Catalog
    from app.catalog.records import IndexEntry
    from app.settings import Settings
    from retrieval.embedder import Embedder

logger = logging.getLogger(__name__)

Role = Literal["server", "worker"]
PRUNE_EVERY_S = 3600.0


class CatalogFedRetriever(Retriever):
    """An in-memory retriever whose persistence is the catalog: `save()` writes nothing.

    `sync` follows the catalog's change log; the server starts it (`sync.start()`) once it serves.
    """

    sync: IndexSync | None = None

    def save(self) -> bool:
        return False


class EmbedOnlyRetriever(CatalogFedRetriever):
    """A worker's retriever: it embeds chunks (stored in the catalog at commit) but indexes nothing itself,
    so a worker's memory does not grow with the corpus; the replicas index what the catalog says."""

    def add(self, chunks: Sequence[IndexedChunk], vectors: np.ndarray | None = None) -> None:
        return None

    def remove(self, chunk_ids: Iterable[int]) -> int:
        return 0


class SnapshotRetriever(Retriever):
    """The SQLite server's retriever: the on-disk snapshot, checked against the catalog when opened.

    `repair_note` says what opening had to fix (None when the snapshot matched the catalog), for the
    start-up log and `blendrag doctor`.
    """

    repair_note: str | None = None


def open_retriever(
    settings: Settings, catalog: Catalog, role: Role = "server", *, embedder: Embedder | None = None
) -> Retriever:
    """The retriever for this process: the on-disk snapshot (SQLite) or one fed from PostgreSQL."""
    if not settings.catalog.is_postgres:
        return open_snapshot_retriever(settings, catalog, embedder=embedder)
    if role == "worker":
        return EmbedOnlyRetriever(settings.retrieval)
    retriever = CatalogFedRetriever(settings.retrieval)
    retriever.sync = IndexSync(
        catalog,
        retriever,
        interval_s=settings.catalog.index_sync_interval_s,
        retention_s=settings.catalog.index_events_retention_s,
    )
    retriever.sync.rebuild()
    return retriever


def open_snapshot_retriever(settings: Settings, catalog: Catalog, *, embedder: Embedder | None = None) -> Retriever:
    """Load the index snapshot and make it hold exactly the catalog's ready chunks.

    Content must never make a data dir unstartable: a snapshot that cannot be read (any error but an
    embedder mismatch, which needs the operator) is replaced by one rebuilt from the catalog, with a warning.
    """
    retriever = SnapshotRetriever(settings.retrieval, settings.index_dir, embedder=embedder)
    note: str | None = None
    try:
        retriever.load()
    except IndexMismatchError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever broke the file, the catalog can rebuild it
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        note = f"the index snapshot could not be read ({reason}); rebuilt from the catalog"
        logger.warning("%s", note)
        retriever = SnapshotRetriever(settings.retrieval, settings.index_dir, embedder=embedder)
    added, removed = sync_with_catalog(catalog, retriever)
    if note is None and (added or removed):
        note = f"the index disagreed with the catalog: {added} chunks added, {removed} removed"
        logger.warning("%s", note)
    if note is not None:
        retriever.repair_note = note
        retriever.save()
    return retriever


def sync_with_catalog(catalog: Catalog, retriever: Retriever) -> tuple[int, int]:
    """Add the catalog's ready chunks the index lacks and remove what it holds beyond them: (added, removed)."""
    ready = catalog.all_ready_chunk_ids()
    indexed = set(retriever.chunk_ids())
    extra = indexed - ready
    if extra:
        retriever.remove(extra)
    missing = ready - indexed
    if missing:
        # Read by document (the catalog's unit), keeping only the chunks the index lacks.
        document_ids = sorted({c.document_id for c in catalog.chunks_by_ids(sorted(missing)).values()})
        entries = [e for e in catalog.index_entries(document_ids) if e.chunk.id in missing]
        index_entries(catalog, retriever, entries)
    return len(missing), len(extra)


def index_entries(catalog: Catalog, retriever: Retriever, entries: list[IndexEntry]) -> None:
    """Add catalog chunks to a retriever with their stored embeddings (embedding, and storing, those
    without one or with one of another dimension than the embedder's)."""
    if not entries:
        return
    chunks = [
        IndexedChunk(
            chunk_id=e.chunk.id,
            document_id=e.chunk.document_id,
            text=e.chunk.text,
            title=e.chunk.title,
            page=e.chunk.page,
            tags=tuple(e.tags),
            collection=e.collection,
        )
        for e in entries
    ]
    dimension = _embedder_dimension(retriever)
    missing = [
        i
        for i, e in enumerate(entries)
        if e.embedding is None or (dimension is not None and e.embedding.shape[-1] != dimension)
    ]
    if missing:
        # Chunks committed before the catalog stored embeddings: embed them once and store the result.
        computed = retriever.embed_chunks([chunks[i] for i in missing])
        catalog.set_embeddings({chunks[i].chunk_id: computed[n] for n, i in enumerate(missing)})
        by_index = dict(zip(missing, computed, strict=True))
    else:
        by_index = {}
    vectors = np.stack([by_index.get(i, e.embedding) for i, e in enumerate(entries)])  # (n, dim)
    retriever.add(chunks, vectors)


def _embedder_dimension(retriever: Retriever) -> int | None:
    try:
        return int(retriever.embedder.dimension)
    except Exception:  # noqa: BLE001 - an embedder that cannot say: trust the stored vectors
        return None


class IndexSync:
    """Keeps a retriever equal to the ready chunks of the catalog by following its change log."""

    def __init__(
        self, catalog: Catalog, retriever: Retriever, *, interval_s: float = 0.5, retention_s: float = 24 * 3600.0
    ) -> None:
        self._catalog = catalog
        self._retriever = retriever
        self._interval_s = interval_s
        self._retention_s = retention_s
        self._cursor = 0
        self._loop = BackgroundThread(self._run, "index-sync", join_timeout_s=30)
        self._last_prune = 0.0
        self.last_applied_at: float | None = None  # monotonic time of the last change applied

    @property
    def cursor(self) -> int:
        return self._cursor

    def rebuild(self) -> int:
        """Load every ready chunk from the catalog (dropping what the index held). Returns the chunk count."""
        cursor = self._catalog.last_index_event_id()  # before reading: later changes are polled again
        entries = self._catalog.index_entries()
        self._retriever.remove(self._retriever.chunk_ids())
        self._add(entries)
        self._cursor = cursor
        logger.info("index built from the catalog: %d chunks (change log at %d)", len(entries), cursor)
        return len(entries)

    def poll(self) -> int:
        """Apply the changes logged since the last poll. Returns how many documents were updated."""
        events = self._catalog.index_events_after(self._cursor)
        if not events:
            return 0
        first = self._catalog.first_index_event_id()
        if first > self._cursor + 1:
            # Events this replica never saw were pruned (it was stopped longer than the retention), or an
            # aborted transaction burnt an id: rebuilding is right in both cases.
            self.rebuild()
            return len({e.document_id for e in events})
        document_ids = list(dict.fromkeys(e.document_id for e in events))
        # Each named document is re-read as it is now: idempotent, and correct in any event order.
        entries = self._catalog.index_entries(document_ids)
        for document_id in document_ids:
            self._retriever.remove_document(document_id)
        self._add(entries)
        self._cursor = events[-1].id
        self.last_applied_at = time.monotonic()
        logger.debug("index sync: %d documents updated (change log at %d)", len(document_ids), self._cursor)
        return len(document_ids)

    def _add(self, entries: list[IndexEntry]) -> None:
        index_entries(self._catalog, self._retriever, entries)

    # ---- background polling ----------------------------------------------------------------------

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def _run(self) -> None:
        while not self._loop.stopping.wait(self._interval_s):
            try:
                self.poll()
                self._maybe_prune()
            except Exception:  # a lost database connection must not end syncing: retry next tick
                logger.exception("index sync failed; retrying")

    def _maybe_prune(self) -> None:
        now = time.monotonic()
        if now - self._last_prune < PRUNE_EVERY_S:
            return
        self._last_prune = now
        removed = self._catalog.prune_index_events(datetime.now(UTC) - timedelta(seconds=self._retention_s))
        if removed:
            logger.info("pruned %d index change log events", removed)
