"""CoverageService: how much of the corpus can be answered from stored KV right now."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.catalog import DocumentStatus

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Sequence

    from app.catalog import Catalog
    from app.catalog.records import ChunkRecord
    from kvcache.coverage import ChunkRef
    from kvcache.space import KVSpace
    from kvcache.store import EntryLocation, TieredKVStore


@dataclass(frozen=True)
class CoverageCountsView:
    chunks_total: int
    chunks_fresh: int
    chunks_stale: int
    chunks_missing: int
    coverage: float


@dataclass(frozen=True)
class DocumentCoverage(CoverageCountsView):
    document_id: str = ""
    title: str = ""
    status: str = ""
    collection: str = ""


@dataclass(frozen=True)
class CoverageView(CoverageCountsView):
    bytes_by_tier: dict[str, int] = field(default_factory=dict)
    fresh_by_tier: dict[str, int] = field(default_factory=dict)
    documents: list[DocumentCoverage] = field(default_factory=list)


class SharedTierView:
    """The KV store as every replica sees it: only the shared Redis tier (a replica's memory and disk
    tiers are its private caches), so coverage is the same number whichever replica is asked."""

    def __init__(self, store: TieredKVStore) -> None:
        self._store = store

    def locate_many(self, keys: Sequence[str]) -> dict[str, EntryLocation]:
        from kvcache.store import EntryLocation

        assert self._store.redis is not None
        sizes = self._store.redis.nbytes_many(list(dict.fromkeys(keys)))
        return {k: EntryLocation(key=k, tiers=("redis",), num_bytes_by_tier={"redis": n}) for k, n in sizes.items()}


class CoverageService:
    def __init__(self, catalog: Catalog, kv_space: KVSpace, *, shared_tier_only: bool) -> None:
        """`kv_space`: the served model's entries (a chunk's expected key is `kv_space.key`). `shared_tier_only`
        (scale-out: PostgreSQL catalog + Redis): report the shared tier, identical from every replica."""
        self._catalog = catalog
        self._kv_key = kv_space.key
        store = kv_space.store
        self._store: TieredKVStore | SharedTierView = SharedTierView(store) if shared_tier_only else store

    def _refs(self, chunks: Iterable[ChunkRecord]) -> list[ChunkRef]:
        """Each chunk's entry as the served model and prefix name it, next to the key its row records."""
        from kvcache.coverage import ChunkRef

        return [
            ChunkRef(
                chunk_id=c.id, document_id=c.document_id, expected_key=self._kv_key(c.token_ids), recorded_key=c.kv_key
            )
            for c in chunks
        ]

    def chunk_states(self, document_id: str) -> dict[int, str]:
        """fresh / stale / missing for each chunk of one document."""
        from kvcache.coverage import compute_coverage

        refs = self._refs(self._catalog.chunks_of(document_id))
        report = compute_coverage(self._store, refs)  # type: ignore[arg-type]
        return {int(c.ref.chunk_id): c.state.value for c in report.chunks}

    def compute(self, collections: Collection[str] | None = None) -> CoverageView:
        """Coverage of the ready documents of `collections` (None: all): a collection key's view counts
        only its own chunks."""
        from kvcache.coverage import compute_coverage

        docs = [d for d in self._catalog.all_documents(collections) if d.status == DocumentStatus.READY]
        chunks = self._catalog.iter_chunks([DocumentStatus.READY], collections)
        refs = self._refs(chunks)
        report = compute_coverage(self._store, refs)  # type: ignore[arg-type]
        per_doc = []
        for doc in docs:
            counts = report.documents.get(doc.id)
            if counts is None:
                per_doc.append(
                    DocumentCoverage(
                        0,
                        0,
                        0,
                        0,
                        1.0,
                        document_id=doc.id,
                        title=doc.title,
                        status=doc.status.value,
                        collection=doc.collection,
                    )
                )
                continue
            per_doc.append(
                DocumentCoverage(
                    counts.num_chunks,
                    counts.num_fresh,
                    counts.num_outdated,
                    counts.num_missing,
                    round(counts.coverage, 6),
                    document_id=doc.id,
                    title=doc.title,
                    status=doc.status.value,
                    collection=doc.collection,
                )
            )
        t = report.total
        return CoverageView(
            t.num_chunks,
            t.num_fresh,
            t.num_outdated,
            t.num_missing,
            round(t.coverage, 6),
            bytes_by_tier=dict(t.bytes_by_tier),
            fresh_by_tier=dict(t.fresh_by_tier),
            documents=per_doc,
        )
