"""Typed values crossing the retrieval package boundary."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

DEFAULT_COLLECTION = "default"  # a chunk's collection when none is given (and in snapshots made before them)


class RetrievalError(RuntimeError):
    """Base class of retrieval failures."""


class IndexMismatchError(RetrievalError):
    """A persisted index does not fit the configured embedder (other model or dimension): reindex."""


@dataclass(frozen=True)
class IndexParams:
    """A vector index's tuning (retrieval/index.py): kept in its snapshot, carried over when it is converted.
    The hnsw_* and ivf_* fields are RetrievalSettings' own, under the same names."""

    hnsw_m: int = 32  # hnsw: neighbours per node
    hnsw_ef_construction: int = 80  # hnsw: candidate list size while building
    hnsw_ef_search: int = 64  # hnsw: candidate list size while searching
    ivf_nlist: int = 256  # ivf: centroids (flat until it holds ivf_nlist × 39 vectors)
    ivf_nprobe: int = 16  # ivf: centroids searched per query
    exact_filter_limit: int = 4096  # filtered hnsw/ivf searches of at most this many ids are scored exactly


@dataclass(frozen=True)
class IndexedChunk:
    """What the retriever stores per chunk. `chunk_id` is the catalog's stable int64 id."""

    chunk_id: int
    document_id: str
    text: str
    title: str = ""
    page: int | None = None
    tags: tuple[str, ...] = ()
    collection: str = DEFAULT_COLLECTION

    def __post_init__(self) -> None:
        object.__setattr__(self, "tags", tuple(self.tags))


@dataclass(frozen=True)
class SearchFilters:
    """Restrict a search. Empty/None fields do not filter; fields combine with AND.

    document_ids: the chunk's document is one of these. tags: the chunk has any of these tags
    (all of them when match_all_tags). collections: the chunk's collection is one of these; applied
    inside the vector and keyword search, before top-k, like every filter here.
    """

    document_ids: frozenset[str] | None = None
    tags: frozenset[str] | None = None
    match_all_tags: bool = False
    collections: frozenset[str] | None = None

    def __post_init__(self) -> None:
        # Accept any iterable (lists from JSON bodies); store frozensets.
        for name in ("document_ids", "tags", "collections"):
            value: Iterable[str] | None = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, frozenset(value))


@dataclass(frozen=True, kw_only=True)
class RetrievedChunk(IndexedChunk):
    """One search result: the indexed chunk and its scores. `score` is the final ranking score: cosine
    similarity for vector search, the RRF score for hybrid search, the cross-encoder score when reranked.
    `vector_score` is always the cosine similarity between query and chunk embedding."""

    score: float
    vector_score: float

    @classmethod
    def of(cls, chunk: IndexedChunk, score: float, vector_score: float) -> RetrievedChunk:
        return cls(
            **{f.name: getattr(chunk, f.name) for f in fields(IndexedChunk)}, score=score, vector_score=vector_score
        )


@dataclass(frozen=True)
class ScoredId:
    """A ranked id from a single ranker (vector index or BM25)."""

    chunk_id: int
    score: float
