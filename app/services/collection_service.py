"""CollectionService: the collections of the library (documents, chunks, KV coverage) and deleting one.

A collection exists while it holds a document. Deleting one deletes its documents one by one through the
DocumentService, so each document's index entries go and its KV entries are removed only when no chunk
of another document (of any collection) still uses them.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import asdict, dataclass

from app.catalog import DocumentStatus
from app.catalog.records import CollectionCounts
from app.catalog.repository import Catalog
from app.services.coverage_service import CoverageService
from app.services.document_service import DocumentService

logger = logging.getLogger(__name__)


class CollectionBusy(Exception):
    """The collection has documents still being ingested: their jobs must finish first (HTTP 409)."""


class CollectionNotFound(LookupError):
    """No document is in this collection (HTTP 404)."""


@dataclass(frozen=True)
class CollectionView(CollectionCounts):
    """A collection's counts in the catalog and its KV coverage."""

    chunks_fresh: int
    coverage: float


class CollectionService:
    def __init__(self, catalog: Catalog, coverage: CoverageService, documents: DocumentService) -> None:
        self._catalog = catalog
        self._coverage = coverage
        self._documents = documents

    def list(self, collections: Collection[str] | None = None) -> list[CollectionView]:
        """The collections holding documents (only those of `collections` when given), by name."""
        counts = self._catalog.collection_counts(collections)
        view = self._coverage.compute(collections)
        fresh: dict[str, int] = {}
        total: dict[str, int] = {}
        for doc in view.documents:
            fresh[doc.collection] = fresh.get(doc.collection, 0) + doc.chunks_fresh
            total[doc.collection] = total.get(doc.collection, 0) + doc.chunks_total
        return [
            CollectionView(
                **asdict(c),
                chunks_fresh=fresh.get(c.name, 0),
                coverage=round(fresh.get(c.name, 0) / total[c.name], 6) if total.get(c.name) else 1.0,
            )
            for c in counts
        ]

    def delete(self, name: str) -> int:
        """Delete every document of a collection; returns how many. Nothing is deleted while one of them
        is still being ingested."""
        documents = self._catalog.all_documents({name})
        if not documents:
            raise CollectionNotFound(f"no collection {name!r}")
        pending = [d for d in documents if d.status == DocumentStatus.PENDING]
        if pending:
            raise CollectionBusy(
                f"collection {name!r} has {len(pending)} document(s) still being ingested (job "
                f"{pending[0].job_id}); cancel or wait for the job first"
            )
        for doc in documents:
            self._documents.delete(doc.id)
        self._catalog.syncs.forget(name)  # a folder synced into it again starts afresh, as any folder may
        logger.info("collection %s deleted: %d documents", name, len(documents))
        return len(documents)
