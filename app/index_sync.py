"""One index for all replicas: FAISS in each replica's memory, fed from the PostgreSQL catalog.

The catalog stores every chunk's embedding and logs each document that becomes ready or stops being
ready (`index_events`, ids visible in commit order). A replica builds its index from the catalog at
start, remembering the newest event id it had seen *before* reading, then polls the log and re-reads
the current chunks of each document named since: whatever order jobs commit in, every replica ends with
exactly the ready chunks of the catalog, within one poll interval (0.5 s by default).

With the SQLite catalog nothing here runs: the server keeps its FAISS snapshot on disk as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

import numpy as np

from retrieval.retriever import Retriever
from retrieval.types import IndexedChunk

if TYPE_CHECKING:
    from app.catalog import Catalog
    from app.catalog.repository import IndexEntry
    from app.settings import Settings

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


def open_retriever(settings: Settings, catalog: Catalog, role: Role = "server") -> Retriever:
    """The retriever for this process: the on-disk snapshot (SQLite) or one fed from PostgreSQL."""
    if not settings.catalog.is_postgres:
        return Retriever.open(settings.index_dir, settings.retrieval)
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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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
            )
            for e in entries
        ]
        missing = [i for i, e in enumerate(entries) if e.embedding is None]
        if missing:
            # Chunks committed before the catalog stored embeddings: embed them once and store the result.
            computed = self._retriever.embed_chunks([chunks[i] for i in missing])
            self._catalog.set_embeddings({chunks[i].chunk_id: computed[n] for n, i in enumerate(missing)})
            by_index = dict(zip(missing, computed, strict=True))
        else:
            by_index = {}
        vectors = np.stack([by_index[i] if e.embedding is None else e.embedding for i, e in enumerate(entries)])
        self._retriever.add(chunks, vectors)

    # ---- background polling ----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="index-sync", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
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
