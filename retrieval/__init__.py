"""Embedding, FAISS vector index, BM25 / hybrid search, reranking. Never imports app or FastAPI."""

from retrieval.bm25 import BM25Index, tokenize
from retrieval.config import RetrievalSettings
from retrieval.embedder import Embedder, EmbedderUnavailable, resolve_embedder_path
from retrieval.hybrid import FusedHit, reciprocal_rank_fusion
from retrieval.index import VectorIndex
from retrieval.rerank import Reranker, RerankerUnavailable
from retrieval.retriever import Retriever
from retrieval.types import (
    IndexedChunk,
    IndexMismatchError,
    IndexParams,
    RetrievalError,
    RetrievedChunk,
    ScoredId,
    SearchFilters,
)

__all__ = [
    "BM25Index",
    "Embedder",
    "EmbedderUnavailable",
    "FusedHit",
    "IndexMismatchError",
    "IndexParams",
    "IndexedChunk",
    "Reranker",
    "RerankerUnavailable",
    "RetrievalError",
    "RetrievalSettings",
    "RetrievedChunk",
    "Retriever",
    "ScoredId",
    "SearchFilters",
    "VectorIndex",
    "reciprocal_rank_fusion",
    "resolve_embedder_path",
    "tokenize",
]
