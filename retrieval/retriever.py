"""The retrieval facade: chunks in (embedded, indexed for vectors and BM25), ranked chunks out.

Persistence: `save()` writes a snapshot generation under the directory and `load()` reads the current
one back (the files and their guarantees: retrieval/snapshot.py). The retriever's metadata (document
id, title, page, tags, text) lets it work standalone; the app's catalog remains the source of truth for
documents.

Thread safety: all methods may be called from several threads. Embedding, reranking and file writes
happen outside the state lock, so searches are not blocked by an ingest's embedding work.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from retrieval.bm25 import BM25Index
from retrieval.config import RetrievalSettings
from retrieval.embedder import Embedder, resolve_device
from retrieval.hybrid import reciprocal_rank_fusion
from retrieval.index import VectorIndex
from retrieval.rerank import Reranker, RerankerUnavailable
from retrieval.snapshot import delete_stale_files, encode_snapshot, has_snapshot, read_snapshot, write_snapshot
from retrieval.types import (
    IndexedChunk,
    IndexMismatchError,
    RetrievalError,
    RetrievedChunk,
    ScoredId,
    SearchFilters,
)

logger = logging.getLogger(__name__)


class Retriever:
    """Vector (optionally hybrid, optionally reranked) search over chunks with metadata filters."""

    def __init__(
        self,
        settings: RetrievalSettings | None = None,
        directory: str | Path | None = None,
        *,
        embedder: Embedder | None = None,
        reranker: Reranker | None = None,
    ) -> None:
        self.settings = settings or RetrievalSettings()
        self.directory = Path(directory) if directory is not None else None
        self._embedder = embedder
        self._reranker = reranker
        self._rerank_resolved = reranker is not None
        self.rerank_disabled_reason: str | None = None
        self._lock = threading.RLock()
        self._save_lock = threading.Lock()
        self._chunks: dict[int, IndexedChunk] = {}
        self._by_document: dict[str, set[int]] = {}
        self._by_tag: dict[str, set[int]] = {}
        self._by_collection: dict[str, set[int]] = {}
        self._index: VectorIndex | None = None
        self._bm25 = BM25Index()
        self._generation = 0
        self._dirty = False

    @classmethod
    def open(
        cls,
        directory: str | Path,
        settings: RetrievalSettings | None = None,
        *,
        embedder: Embedder | None = None,
        reranker: Reranker | None = None,
    ) -> Retriever:
        """A retriever on `directory`, loaded from its snapshot when there is one."""
        retriever = cls(settings, directory, embedder=embedder, reranker=reranker)
        retriever.load()
        return retriever

    # -- inspection --------------------------------------------------------------------------------

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = Embedder.from_settings(self.settings)
        return self._embedder

    @property
    def count(self) -> int:
        return len(self._chunks)

    def chunk_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._chunks)

    def document_chunk_ids(self, document_id: str) -> list[int]:
        with self._lock:
            return sorted(self._by_document.get(document_id, ()))

    def get(self, chunk_id: int) -> IndexedChunk | None:
        return self._chunks.get(chunk_id)

    def passage_text(self, chunk: IndexedChunk) -> str:
        """The text that is embedded and keyword-indexed for a chunk."""
        if self.settings.embed_title and chunk.title:
            return f"{chunk.title}\n{chunk.text}"
        return chunk.text

    # -- writing -----------------------------------------------------------------------------------

    def embed_chunks(self, chunks: Sequence[IndexedChunk]) -> np.ndarray:
        """Passage embeddings for `chunks` (what `add` computes when not given vectors). # (n, dim)"""
        return self.embedder.embed_passages([self.passage_text(chunk) for chunk in chunks])

    def add(self, chunks: Sequence[IndexedChunk], vectors: np.ndarray | None = None) -> None:
        """Index chunks; an id already present is replaced (so retrying an ingest is harmless).

        `vectors` (n, dim) are used as given (normalized by the index) instead of embedding the chunks.
        """
        if not chunks:
            return
        ids = [chunk.chunk_id for chunk in chunks]
        if len(set(ids)) != len(ids):
            raise ValueError("chunk ids within one add() must be unique")
        if vectors is None:
            vectors = self.embed_chunks(chunks)
        vectors = np.asarray(vectors, dtype=np.float32)  # (n, dim)
        # Validate before touching any state: a replaced chunk must not vanish because its new vector is bad.
        if vectors.ndim != 2 or len(vectors) != len(chunks):
            raise ValueError(f"expected {len(chunks)} vectors as an (n, dim) array, got shape {vectors.shape}")
        if not np.isfinite(vectors).all():
            raise ValueError("vectors contain NaN or infinity")
        with self._lock:
            index = self._ensure_index(vectors.shape[1])
            self._remove_locked(ids)
            index.add(ids, vectors)
            for chunk in chunks:
                self._register(chunk)
                self._bm25.add(chunk.chunk_id, self.passage_text(chunk))
            self._dirty = True

    def remove(self, chunk_ids: Iterable[int]) -> int:
        """Remove chunks by id; unknown ids are ignored. Returns how many were removed."""
        with self._lock:
            removed = self._remove_locked(list(chunk_ids))
            self._dirty = self._dirty or removed > 0
            return removed

    def remove_document(self, document_id: str) -> int:
        with self._lock:
            return self.remove(list(self._by_document.get(document_id, ())))

    def set_document_tags(self, document_id: str, tags: Iterable[str]) -> int:
        """Replace the tags of every chunk of a document (no re-embedding). Returns chunks changed."""
        new_tags = tuple(dict.fromkeys(tags))
        with self._lock:
            chunk_ids = sorted(self._by_document.get(document_id, ()))
            for chunk_id in chunk_ids:
                chunk = self._chunks[chunk_id]
                self._untag(chunk)
                chunk = dataclasses.replace(chunk, tags=new_tags)
                self._chunks[chunk_id] = chunk
                for tag in new_tags:
                    self._by_tag.setdefault(tag, set()).add(chunk_id)
            self._dirty = self._dirty or bool(chunk_ids)
            return len(chunk_ids)

    # -- search ------------------------------------------------------------------------------------

    def search(
        self,
        query: str,
        top_k: int | None = None,
        score_threshold: float | None = None,
        filters: SearchFilters | None = None,
        *,
        query_vector: np.ndarray | None = None,
    ) -> list[RetrievedChunk]:
        """The best `top_k` chunks for `query` (defaults from settings).

        `score_threshold` is a minimum *cosine similarity* (`vector_score`), whatever ranks the results.
        `filters`: None fields do not filter; an empty set matches nothing. `query_vector` skips
        embedding the query (hybrid search still uses the query text for BM25).
        """
        top_k = self.settings.top_k if top_k is None else top_k
        threshold = self.settings.score_threshold if score_threshold is None else score_threshold
        if top_k <= 0 or not self._chunks:
            return []
        if query_vector is None:
            query_vector = self.embedder.embed_query(query)
        reranker = self._active_reranker()
        widen = self.settings.hybrid or reranker is not None
        num_candidates = max(top_k, self.settings.num_candidates) if widen else top_k

        with self._lock:
            if self._index is None:
                return []
            allowed = self._allowed_ids(filters)
            if allowed is not None and not allowed:
                return []
            vector_hits = self._index.search(query_vector, num_candidates, allowed)
            cosine = {hit.chunk_id: hit.score for hit in vector_hits}
            if self.settings.hybrid:
                keyword_hits = self._bm25.search(query, num_candidates, allowed)
                fused = reciprocal_rank_fusion(
                    [[hit.chunk_id for hit in vector_hits], [hit.chunk_id for hit in keyword_hits]],
                    k=self.settings.rrf_k,
                )
                ranked = [ScoredId(hit.chunk_id, hit.score) for hit in fused]
                self._fill_cosine(cosine, [hit.chunk_id for hit in keyword_hits], query_vector)
            else:
                ranked = vector_hits
            if threshold is not None:
                ranked = [hit for hit in ranked if cosine[hit.chunk_id] >= threshold]
            ranked = ranked[:num_candidates]
            candidates = [(self._chunks[hit.chunk_id], hit.score) for hit in ranked]

        if reranker is not None and candidates:
            rerank_scores = reranker.score(query, [self.passage_text(chunk) for chunk, _ in candidates])
            order = sorted(range(len(candidates)), key=lambda i: (-rerank_scores[i], i))
            candidates = [(candidates[i][0], rerank_scores[i]) for i in order]
        return [RetrievedChunk.of(chunk, score, cosine[chunk.chunk_id]) for chunk, score in candidates[:top_k]]

    # -- persistence -------------------------------------------------------------------------------

    def save(self) -> bool:
        """Write a new snapshot generation if anything changed. Returns whether a snapshot was written."""
        directory = self._require_directory()
        with self._save_lock:
            with self._lock:
                if not self._dirty and has_snapshot(directory):
                    return False
                snapshot = encode_snapshot(
                    self._generation + 1,
                    [self._chunks[chunk_id] for chunk_id in sorted(self._chunks)],
                    self._bm25,
                    self._index,
                    self.settings.embedder,
                )
                self._dirty = False
            try:
                write_snapshot(directory, snapshot)
            except BaseException:
                with self._lock:
                    self._dirty = True
                raise
            self._generation = snapshot.generation
            delete_stale_files(directory, snapshot.generation)
        logger.info("retriever snapshot %d saved: %d chunks", snapshot.generation, snapshot.manifest["count"])
        return True

    def load(self) -> bool:
        """Replace the in-memory state with the directory's snapshot. Returns False when there is none.

        Raises IndexMismatchError when the snapshot was built with another embedder. A different
        `index_type` in the settings converts the index (no re-embedding needed).
        """
        snapshot = read_snapshot(self._require_directory(), self.settings.embedder, use_gpu=self._wants_gpu())
        if snapshot is None:
            return False
        index = snapshot.index
        converted = False
        if index is not None:
            if index.index_type != self.settings.index_type:
                logger.info("converting the %s index to %s", index.index_type, self.settings.index_type)
                index = self._new_index(index.dim, from_index=index)
                converted = True
            settings = self.settings
            index.params = dataclasses.replace(
                index.params, hnsw_ef_search=settings.hnsw_ef_search, ivf_nprobe=settings.ivf_nprobe
            )
        with self._lock:
            self._chunks = {}
            self._by_document = {}
            self._by_tag = {}
            self._by_collection = {}
            for chunk in snapshot.chunks:
                self._register(chunk)
            self._bm25 = snapshot.bm25
            self._index = index
            self._generation = snapshot.generation
            self._dirty = converted
        logger.info("retriever snapshot %d loaded: %d chunks", self._generation, len(snapshot.chunks))
        return True

    # -- internals ---------------------------------------------------------------------------------

    def _require_directory(self) -> Path:
        if self.directory is None:
            raise RetrievalError("this retriever has no directory to save to or load from")
        return self.directory

    def _new_index(self, dim: int, from_index: VectorIndex | None = None) -> VectorIndex:
        index = VectorIndex(dim, self.settings.index_type, self.settings.index_params(), use_gpu=self._wants_gpu())
        if from_index is not None and len(from_index):
            ids = from_index.ids()
            index.add(ids, from_index.vectors(ids))
        return index

    def _wants_gpu(self) -> bool:
        return resolve_device(self.settings.device).startswith("cuda")

    def _ensure_index(self, dim: int) -> VectorIndex:
        if self._index is None:
            self._index = self._new_index(dim)
        elif self._index.dim != dim:
            raise IndexMismatchError(
                f"vectors have dimension {dim} but the index holds {self._index.dim}; the embedder changed: reindex"
            )
        return self._index

    def _register(self, chunk: IndexedChunk) -> None:
        """Hold `chunk` and file it under its document, tags and collection (the lock held)."""
        self._chunks[chunk.chunk_id] = chunk
        self._by_document.setdefault(chunk.document_id, set()).add(chunk.chunk_id)
        for tag in chunk.tags:
            self._by_tag.setdefault(tag, set()).add(chunk.chunk_id)
        self._by_collection.setdefault(chunk.collection, set()).add(chunk.chunk_id)

    def _remove_locked(self, chunk_ids: list[int]) -> int:
        present = [chunk_id for chunk_id in chunk_ids if chunk_id in self._chunks]
        if not present:
            return 0
        if self._index is not None:
            self._index.remove(present)
        self._bm25.remove(present)
        for chunk_id in present:
            chunk = self._chunks.pop(chunk_id)
            document_chunks = self._by_document[chunk.document_id]
            document_chunks.discard(chunk_id)
            if not document_chunks:
                del self._by_document[chunk.document_id]
            collection_chunks = self._by_collection[chunk.collection]
            collection_chunks.discard(chunk_id)
            if not collection_chunks:
                del self._by_collection[chunk.collection]
            self._untag(chunk)
        return len(present)

    def _untag(self, chunk: IndexedChunk) -> None:
        for tag in chunk.tags:
            tagged = self._by_tag.get(tag)
            if tagged is not None:
                tagged.discard(chunk.chunk_id)
                if not tagged:
                    del self._by_tag[tag]

    def _allowed_ids(self, filters: SearchFilters | None) -> set[int] | None:
        if filters is None:
            return None
        allowed: set[int] | None = None
        if filters.document_ids is not None:
            allowed = set().union(*(self._by_document.get(doc, set()) for doc in filters.document_ids))
        if filters.tags is not None:
            tagged = [self._by_tag.get(tag, set()) for tag in filters.tags]
            if not tagged:
                matching: set[int] = set()
            elif filters.match_all_tags:
                matching = set.intersection(*tagged)
            else:
                matching = set().union(*tagged)
            allowed = matching if allowed is None else allowed & matching
        if filters.collections is not None:
            in_collections = set().union(*(self._by_collection.get(c, set()) for c in filters.collections))
            allowed = in_collections if allowed is None else allowed & in_collections
        return allowed

    def vectors_of(self, chunk_ids: Sequence[int]) -> np.ndarray:
        """The stored (unit) vectors of those of `chunk_ids` still indexed, in order. # (n, dim) float32"""
        with self._lock:
            live = [i for i in chunk_ids if i in self._chunks]
            if self._index is None or not live:
                return np.zeros((0, 0 if self._index is None else self._index.dim), dtype=np.float32)
            return np.asarray(self._index.vectors(live), dtype=np.float32)

    def _fill_cosine(self, cosine: dict[int, float], chunk_ids: list[int], query_vector: np.ndarray) -> None:
        """Exact cosine for keyword-only hits, so thresholds and `vector_score` cover every result."""
        missing = [chunk_id for chunk_id in chunk_ids if chunk_id not in cosine]
        if not missing or self._index is None:
            return
        query = np.asarray(query_vector, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(query))
        query = query / norm if norm > 0 else query
        for chunk_id, score in zip(missing, self._index.vectors(missing) @ query, strict=True):
            cosine[chunk_id] = float(score)

    def _active_reranker(self) -> Reranker | None:
        if self._rerank_resolved:
            return self._reranker
        with self._lock:
            if not self._rerank_resolved:
                model = self.settings.rerank_model
                if model is None:
                    self.rerank_disabled_reason = "no rerank_model configured"
                    logger.info("results are not reranked: %s", self.rerank_disabled_reason)
                else:
                    try:
                        self._reranker = Reranker(model, self.settings.device)
                    except RerankerUnavailable as exc:
                        self.rerank_disabled_reason = str(exc)
                        logger.warning("results are not reranked: %s", exc)
                self._rerank_resolved = True
        return self._reranker
