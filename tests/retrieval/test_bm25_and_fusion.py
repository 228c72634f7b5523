"""BM25 scoring math, incremental updates, persistence; reciprocal rank fusion on hand-made rankings."""

from __future__ import annotations

import math

import pytest

from retrieval import BM25Index, ScoredId, reciprocal_rank_fusion, tokenize
from retrieval.hybrid import FusedHit


def corpus() -> BM25Index:
    index = BM25Index(k1=1.5, b=0.75)
    index.add(1, "Apple banana, APPLE!")
    index.add(2, "banana cherry")
    index.add(3, "The cherry and durian, elderberry fig.")  # "the", "and" are stopwords
    return index


def test_tokenize() -> None:
    assert tokenize("The Quick-brown fox's 2 jumps, ÜBER naïve.") == [
        "quick",
        "brown",
        "fox",
        "s",
        "2",
        "jumps",
        "über",
        "naïve",
    ]


def test_bm25_scores_match_the_formula() -> None:
    index = corpus()
    # N = 3 documents of lengths 3, 2, 4 → avgdl = 3.
    idf_apple = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    idf_cherry = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    expected = {
        1: idf_apple * 2 * 2.5 / (2 + 1.5 * (0.25 + 0.75 * 3 / 3)),
        2: idf_cherry * 1 * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 2 / 3)),
        3: idf_cherry * 1 * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 4 / 3)),
    }
    scores = index.scores("apple? cherry the")
    assert scores == pytest.approx(expected)
    assert [hit.chunk_id for hit in index.search("apple cherry", 3)] == [1, 2, 3]
    assert index.search("apple cherry", 2, allowed_ids={2, 3}) == [
        ScoredId(2, pytest.approx(expected[2])),
        ScoredId(3, pytest.approx(expected[3])),
    ]
    assert index.search("kiwi", 5) == []
    assert index.search("the and", 5) == []  # stopwords only


def test_bm25_ties_break_by_id_and_updates_are_incremental() -> None:
    index = BM25Index()
    index.add(9, "same words")
    index.add(4, "same words")
    assert [hit.chunk_id for hit in index.search("same", 2)] == [4, 9]
    index.add(9, "different now")  # replaces id 9
    assert [hit.chunk_id for hit in index.search("same", 5)] == [4]
    assert index.remove([4, 77]) == 1
    assert len(index) == 1 and index.ids() == [9]
    assert index.search("same", 5) == []


def test_bm25_persistence_round_trip() -> None:
    index = corpus()
    loaded = BM25Index.from_bytes(index.to_bytes())  # what a retriever snapshot stores
    assert loaded.ids() == [1, 2, 3]
    assert loaded.scores("apple cherry banana") == index.scores("apple cherry banana")
    loaded.remove([1])
    fresh = BM25Index()
    fresh.add(2, "banana cherry")
    fresh.add(3, "The cherry and durian, elderberry fig.")
    assert loaded.scores("cherry banana") == pytest.approx(fresh.scores("cherry banana"))


def test_rrf_fusion_math() -> None:
    fused = reciprocal_rank_fusion([[1, 2, 3], [3, 1, 4]], k=60)
    assert fused == [
        FusedHit(1, pytest.approx(1 / 61 + 1 / 62), (1, 2)),
        FusedHit(3, pytest.approx(1 / 63 + 1 / 61), (3, 1)),
        FusedHit(2, pytest.approx(1 / 62), (2, None)),
        FusedHit(4, pytest.approx(1 / 63), (None, 3)),
    ]


def test_rrf_weights_limit_duplicates_and_ties() -> None:
    weighted = reciprocal_rank_fusion([[1, 2], [2, 1]], k=1, weights=[1.0, 3.0])
    assert [(hit.chunk_id, hit.score) for hit in weighted] == [
        (2, pytest.approx(1 / 3 + 3 / 2)),
        (1, pytest.approx(1 / 2 + 3 / 3)),
    ]
    # Only the first occurrence of an id within one ranking counts.
    assert reciprocal_rank_fusion([[5, 5, 6]], k=10) == [
        FusedHit(5, pytest.approx(1 / 11), (1,)),
        FusedHit(6, pytest.approx(1 / 13), (3,)),
    ]
    # Equal scores and equal best rank: smaller id first.
    assert [hit.chunk_id for hit in reciprocal_rank_fusion([[8], [7]])] == [7, 8]
    assert [hit.chunk_id for hit in reciprocal_rank_fusion([[1, 2, 3]], limit=2)] == [1, 2]
    assert reciprocal_rank_fusion([]) == []
    with pytest.raises(ValueError):
        reciprocal_rank_fusion([[1]], k=0)
    with pytest.raises(ValueError):
        reciprocal_rank_fusion([[1], [2]], weights=[1.0])
