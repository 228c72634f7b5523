"""The hash embedder the fast app fixtures use instead of MiniLM."""

from __future__ import annotations

import numpy as np
import pytest
from hash_embedder import HashEmbedder


def test_hash_embedder_is_deterministic_and_word_based() -> None:
    e = HashEmbedder()
    a, b, c = e.embed_passages(["The capital of Zorblat", "zorblat capital", "sourdough bread"])
    assert np.array_equal(a, HashEmbedder().embed_query("The capital of Zorblat"))
    assert float(np.linalg.norm(a)) == pytest.approx(1.0)
    assert float(a @ b) > float(a @ c)
