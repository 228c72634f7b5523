"""Optional cross-encoder reranking (sentence-transformers CrossEncoder), from a local directory only."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from retrieval.embedder import resolve_device
from retrieval.types import RetrievalError

if TYPE_CHECKING:
    from sentence_transformers import CrossEncoder

logger = logging.getLogger(__name__)


class RerankerUnavailable(RetrievalError):
    """The cross-encoder cannot be found or loaded."""


class Reranker:
    """Scores (query, passage) pairs with a cross-encoder; higher is more relevant."""

    def __init__(self, model_dir: str | Path, device: str = "cpu", batch_size: int = 32) -> None:
        path = Path(model_dir).expanduser()
        if not (path / "config.json").is_file():
            raise RerankerUnavailable(
                f"{path} is not a local cross-encoder directory (no config.json); models are never downloaded"
            )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise RerankerUnavailable("sentence-transformers is not installed") from exc
        try:
            self._model: CrossEncoder = CrossEncoder(str(path), device=resolve_device(device), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise RerankerUnavailable(f"cannot load cross-encoder from {path}: {exc}") from exc
        self.path = path
        self.batch_size = batch_size
        self._lock = threading.Lock()  # torch modules are not safe to call from several threads at once
        logger.info("reranker loaded from %s", path)

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        if not passages:
            return []
        with self._lock:
            scores = self._model.predict(
                [(query, passage) for passage in passages],
                batch_size=self.batch_size,
                show_progress_bar=False,
                convert_to_numpy=True,
            )
        matrix = scores.reshape(len(passages), -1)  # (n, num_labels)
        # One logit per pair (ms-marco style) or two classes where the last means "relevant".
        column = matrix[:, -1] if matrix.shape[1] == 2 else matrix[:, 0]
        return [float(value) for value in column]
