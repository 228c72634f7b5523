"""VectorIndex over FAISS: flat / hnsw / ivf with exact ids, removal, filters and persistence."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval import IndexParams, VectorIndex

DIM = 32
NUM = 300
IDS = np.arange(5000, 5000 + NUM, dtype=np.int64) * 7  # sparse, non-contiguous ids


def unit_vectors(num: int, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((num, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


VECTORS = unit_vectors(NUM)


def brute_force(query: np.ndarray, k: int, ids: np.ndarray = IDS, vectors: np.ndarray = VECTORS) -> list[int]:
    scores = vectors @ query
    return [int(ids[i]) for i in np.argsort(-scores, kind="stable")[:k]]


def make(index_type: str, use_gpu: bool = False, **kwargs) -> VectorIndex:
    # nlist 4 trains IVF at 4 * 39 = 156 vectors; nprobe = nlist makes IVF search exhaustive (exact).
    return VectorIndex(DIM, index_type, IndexParams(ivf_nlist=4, ivf_nprobe=4, **kwargs), use_gpu=use_gpu)


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_add_search_finds_each_vector_itself(index_type: str) -> None:
    index = make(index_type)
    index.add(IDS, VECTORS)
    assert len(index) == NUM
    assert index.ids().tolist() == sorted(IDS.tolist())
    for row in range(0, NUM, 7):
        hits = index.search(VECTORS[row], 5)
        assert hits[0].chunk_id == IDS[row]
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        if index_type != "hnsw":  # flat and exhaustive IVF are exact
            assert [h.chunk_id for h in hits] == brute_force(VECTORS[row], 5)


def test_ivf_trains_when_enough_vectors() -> None:
    index = make("ivf")
    index.add(IDS[:155], VECTORS[:155])
    assert not index.is_trained_ivf  # flat until 156 vectors
    assert [h.chunk_id for h in index.search(VECTORS[3], 3)] == brute_force(VECTORS[3], 3, IDS[:155], VECTORS[:155])
    index.add(IDS[155:], VECTORS[155:])
    assert index.is_trained_ivf
    assert len(index) == NUM
    assert [h.chunk_id for h in index.search(VECTORS[200], 4)] == brute_force(VECTORS[200], 4)


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_remove_hides_ids_and_readd_works(index_type: str) -> None:
    index = make(index_type)
    index.add(IDS, VECTORS)
    gone = IDS[:10].tolist()
    assert index.remove(gone + [123456789]) == 10
    assert index.remove(gone) == 0
    assert len(index) == NUM - 10
    assert gone[0] not in index and int(IDS[10]) in index
    for row in range(10):
        found = [h.chunk_id for h in index.search(VECTORS[row], 20)]
        assert not set(found) & set(gone)
        if index_type != "hnsw":
            assert found == brute_force(VECTORS[row], 20, IDS[10:], VECTORS[10:])
    if index_type == "hnsw":
        assert index.num_tombstones == 10
    # A removed id can come back with a new vector (hnsw purges its tombstones first).
    index.add([gone[0]], VECTORS[:1] * -1)
    assert index.num_tombstones == 0
    assert index.search(-VECTORS[0], 1)[0].chunk_id == gone[0]
    assert len(index) == NUM - 9


def test_hnsw_compacts_when_tombstones_pile_up() -> None:
    index = make("hnsw")
    index.add(IDS, VECTORS)
    index.remove(IDS[:74])  # 74 < max(64, 0.25 * 300) = 75: still tombstones
    assert index.num_tombstones == 74
    index.remove(IDS[74:75])
    assert index.num_tombstones == 0
    assert len(index) == NUM - 75
    assert index.search(VECTORS[100], 1)[0].chunk_id == IDS[100]


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_allowed_ids_filter(index_type: str) -> None:
    index = make(index_type)
    index.add(IDS, VECTORS)
    allowed = IDS[50:60].tolist()
    hits = index.search(VECTORS[0], 3, allowed_ids=set(allowed))
    assert [h.chunk_id for h in hits] == brute_force(VECTORS[0], 3, IDS[50:60], VECTORS[50:60])
    assert index.search(VECTORS[0], 3, allowed_ids=set()) == []
    assert index.search(VECTORS[0], 3, allowed_ids={1, 2}) == []
    # Past exact_filter_limit the FAISS id selector path filters (approximate for hnsw/ivf).
    selective = make(index_type, exact_filter_limit=5)
    selective.add(IDS, VECTORS)
    wide = set(IDS[::2].tolist())
    hits = selective.search(VECTORS[1], 5, allowed_ids=wide)
    assert len(hits) == 5 and all(h.chunk_id in wide for h in hits)
    if index_type != "hnsw":
        assert [h.chunk_id for h in hits] == brute_force(VECTORS[1], 5, IDS[::2], VECTORS[::2])


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_bytes_round_trip(index_type: str) -> None:
    index = make(index_type)
    index.add(IDS, VECTORS)
    index.remove(IDS[:3])
    before = [index.search(VECTORS[row], 5) for row in range(0, NUM, 17)]
    loaded = VectorIndex.from_bytes(index.to_bytes())  # what a retriever snapshot stores
    assert (loaded.index_type, loaded.dim, len(loaded)) == (index_type, DIM, NUM - 3)
    assert loaded.ids().tolist() == index.ids().tolist()
    assert loaded.num_tombstones == index.num_tombstones
    assert [loaded.search(VECTORS[row], 5) for row in range(0, NUM, 17)] == before
    np.testing.assert_allclose(loaded.vectors(IDS[3:6]), VECTORS[3:6], atol=1e-6)


def test_convert_between_types() -> None:
    flat = make("flat")
    flat.add(IDS, VECTORS)
    ivf = flat.converted("ivf")
    assert ivf.is_trained_ivf and ivf.ids().tolist() == flat.ids().tolist()
    assert [h.chunk_id for h in ivf.search(VECTORS[9], 5)] == brute_force(VECTORS[9], 5)


def test_vectors_are_normalized_and_validated() -> None:
    index = make("flat")
    index.add([1, 2], np.array([[3.0] + [0.0] * (DIM - 1), [0.0, 2.0] + [0.0] * (DIM - 2)]))
    np.testing.assert_allclose(index.vectors([1]), [[1.0] + [0.0] * (DIM - 1)])
    hits = index.search(np.array([3.0, 4.0] + [0.0] * (DIM - 2)), 2)
    assert [h.chunk_id for h in hits] == [2, 1]
    assert [h.score for h in hits] == pytest.approx([0.8, 0.6])
    with pytest.raises(ValueError, match="already"):
        index.add([1], VECTORS[:1])
    with pytest.raises(ValueError, match="unique"):
        index.add([5, 5], VECTORS[:2])
    with pytest.raises(ValueError, match="shape"):
        index.add([6], np.ones((1, DIM + 1)))
    with pytest.raises(ValueError, match="NaN"):
        index.add([7], np.full((1, DIM), np.nan))
    with pytest.raises(ValueError, match="non-negative"):
        index.add([-1], VECTORS[:1])
    with pytest.raises(KeyError):
        index.vectors([99])
    assert index.search(VECTORS[0], 0) == []
    assert make("hnsw").search(VECTORS[0], 3) == []


def test_gpu_request_without_faiss_gpu_falls_back_to_cpu() -> None:
    index = make("flat", use_gpu=True)
    index.add(IDS, VECTORS)
    assert [h.chunk_id for h in index.search(VECTORS[4], 3)] == brute_force(VECTORS[4], 3)


@pytest.mark.parametrize("index_type", ["hnsw", "ivf"])
def test_a_scattered_allowed_set_still_fills_top_k(index_type: str) -> None:
    """An allowed set (one collection) lying far from the query, past exact_filter_limit: the probed IVF
    list or the HNSW walk holds few of them, yet the search returns k allowed hits, the exact best."""
    index = VectorIndex(DIM, index_type, IndexParams(ivf_nlist=4, ivf_nprobe=1, hnsw_ef_search=4, exact_filter_limit=5))
    index.add(IDS, VECTORS)
    query = VECTORS[0]
    farthest = np.argsort(VECTORS @ query, kind="stable")[:12]  # the 12 vectors least like the query
    allowed = set(IDS[farthest].tolist())
    hits = index.search(query, 10, allowed_ids=allowed)
    assert [h.chunk_id for h in hits] == brute_force(query, 10, IDS[farthest], VECTORS[farthest])
