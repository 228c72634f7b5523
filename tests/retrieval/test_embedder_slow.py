"""The real all-MiniLM-L6-v2 embedder, end to end through the Retriever and the recall evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from retrieval import Embedder, IndexedChunk, RetrievalSettings, Retriever
from retrieval.eval import evaluate_recall

pytestmark = pytest.mark.slow

PASSAGES = [
    ("Paris", "Paris is the capital and most populous city of France."),
    ("Photosynthesis", "Plants convert light energy into chemical energy through photosynthesis."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ("Python", "Python is a high-level programming language known for its readability."),
    ("Jupiter", "Jupiter is the fifth planet from the Sun and the largest in the Solar System."),
]
QUESTIONS = [
    ("What is the capital of France?", 0),
    ("How do plants turn sunlight into energy?", 1),
    ("Which is the tallest mountain on Earth?", 2),
    ("Which programming language is easy to read?", 3),
    ("What is the biggest planet?", 4),
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder("builtin")


def test_embeddings_are_normalized_384_dim(embedder: Embedder) -> None:
    vectors = embedder.embed_passages([text for _, text in PASSAGES])
    assert vectors.shape == (5, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), np.ones(5), atol=1e-5)
    assert embedder.embed_passages([]).shape == (0, 384)
    np.testing.assert_allclose(embedder.embed_query(PASSAGES[0][1]), vectors[0], atol=1e-5)


def test_relevant_passage_ranks_first_and_survives_a_reload(embedder: Embedder, tmp_path: Path) -> None:
    settings = RetrievalSettings(index_type="hnsw", hybrid=True, top_k=3)
    retriever = Retriever(settings, tmp_path, embedder=embedder)
    retriever.add(
        [
            IndexedChunk(chunk_id=10 + i, document_id=f"d{i}", text=text, title=title)
            for i, (title, text) in enumerate(PASSAGES)
        ]
    )
    for question, gold in QUESTIONS:
        assert retriever.search(question)[0].chunk_id == 10 + gold
    retriever.save()
    reloaded = Retriever.open(tmp_path, settings, embedder=embedder)
    assert [r.chunk_id for r in reloaded.search(QUESTIONS[0][0])] == [
        r.chunk_id for r in retriever.search(QUESTIONS[0][0])
    ]
    assert reloaded.search(QUESTIONS[0][0])[0].vector_score > 0.5


def test_evaluate_recall_on_a_small_dataset(embedder: Embedder, tmp_path: Path) -> None:
    records = [
        {
            "question": question,
            "answers": [],
            "ctxs": [{"title": title, "text": text, "isgold": i == gold} for i, (title, text) in enumerate(PASSAGES)],
        }
        for question, gold in QUESTIONS
    ]
    path = tmp_path / "mini.json"
    path.write_text(json.dumps(records))
    report = evaluate_recall(path, RetrievalSettings(), ks=(1, 5), embedder=embedder)
    assert report.recall == {1: 1.0, 5: 1.0}
    assert (report.num_questions, report.num_passages) == (5, 5)
    assert report.embed_seconds > 0 and report.search_seconds > 0


def test_bf16_embedder_keeps_unit_float32_vectors_and_the_ranking(
    embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine import dtype_choice
    from engine.dtype_choice import CpuBf16Support

    # Play a CPU with AMX: `auto` must then load the model in bfloat16.
    amx = CpuBf16Support(amx_tile=True, avx512_bf16=True, onednn_bf16=True, capability="AVX512")
    monkeypatch.setattr(dtype_choice, "detect_cpu_bf16", lambda: amx)
    bf16 = Embedder("builtin", dtype="auto")
    model = bf16.load()
    assert bf16.dtype_choice is not None and bf16.dtype_choice.dtype == "bfloat16"
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    vectors = bf16.embed_passages([text for _, text in PASSAGES])
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), np.ones(5), atol=1e-5)
    reference = embedder.embed_passages([text for _, text in PASSAGES])
    assert float(np.min(np.sum(vectors * reference, axis=1))) > 0.99  # the same directions within bf16 rounding
    queries = bf16.embed_queries([q for q, _ in QUESTIONS])
    assert [int(i) for i in np.argmax(queries @ vectors.T, axis=1)] == [gold for _, gold in QUESTIONS]


def test_float32_is_the_class_default_and_auto_follows_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine import dtype_choice
    from engine.dtype_choice import CpuBf16Support

    avx2 = CpuBf16Support(amx_tile=False, avx512_bf16=False, onednn_bf16=False, capability="AVX2")
    monkeypatch.setattr(dtype_choice, "detect_cpu_bf16", lambda: avx2)
    assert Embedder("builtin").dtype == "float32"
    assert Embedder.from_settings(RetrievalSettings()).dtype == "auto"
    auto = Embedder("builtin", dtype="auto")
    auto.load()
    assert auto.dtype_choice is not None and auto.dtype_choice.dtype == "float32"
    assert auto.dtype_choice.reason == "CPU: no bf16 matrix units (torch dispatches AVX2)"
