"""A deterministic stand-in for the sentence-transformers embedder in fast app tests (see tests/app/conftest.py)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

from engine.dtype_choice import DtypeChoice

HASH_DIM = 64


class HashEmbedder:
    """Deterministic embeddings: each lower-cased word adds ±1 at a hashed position; unit norm.

    Texts that share words are close, which is all the service tests ask of retrieval."""

    name = "test-hash"
    dtype_choice = DtypeChoice("float32", "hash embedder", "float32")

    def __init__(self, dim: int = HASH_DIM) -> None:
        self.dim = dim

    @property
    def dimension(self) -> int:
        return self.dim

    def load(self) -> HashEmbedder:
        return self

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in re.findall(r"\w+", text.lower()):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            v[h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        norm = float(np.linalg.norm(v))
        if norm == 0.0:
            v[0] = 1.0
            return v
        return v / norm

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self._vector(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_passages(texts)

    def embed_query(self, text: str) -> np.ndarray:
        return self._vector(text)
