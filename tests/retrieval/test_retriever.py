"""Retriever facade with precomputed vectors (no embedding model needed): search, filters, thresholds,
updates, hybrid fusion, snapshots and their crash safety."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from retrieval import (
    IndexedChunk,
    IndexMismatchError,
    RetrievalError,
    RetrievalSettings,
    RetrievedChunk,
    Retriever,
    SearchFilters,
)
from retrieval.snapshot import MANIFEST_FILENAME

DIM = 16
NUM = 40


def unit(rows: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((rows, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


VECTORS = unit(NUM, seed=1)
CHUNKS = [
    IndexedChunk(
        chunk_id=100 + i,
        document_id=f"doc-{i // 10}",
        text=f"chunk text number {i}",
        title=f"Document {i // 10}",
        page=i % 10 + 1,
        tags=("even",) if i % 2 == 0 else ("odd", "prime") if i in (3, 5, 7, 11, 13) else ("odd",),
    )
    for i in range(NUM)
]


def brute_force(query: np.ndarray, k: int, rows: list[int] | None = None) -> list[int]:
    rows = list(range(NUM)) if rows is None else rows
    scores = VECTORS[rows] @ query
    return [100 + rows[i] for i in np.argsort(-scores, kind="stable")[:k]]


def filled(settings: RetrievalSettings | None = None, directory: Path | None = None) -> Retriever:
    retriever = Retriever(settings or RetrievalSettings(), directory)
    retriever.add(CHUNKS, VECTORS)
    return retriever


def ids(results) -> list[int]:
    return [result.chunk_id for result in results]


def test_search_returns_ranked_chunks_with_metadata() -> None:
    retriever = filled()
    assert retriever.count == NUM
    results = retriever.search("ignored", query_vector=VECTORS[7])
    assert ids(results) == brute_force(VECTORS[7], 6)  # settings.top_k = 6
    first = results[0]
    assert (first.chunk_id, first.document_id, first.title, first.page, first.text, first.tags) == (
        107,
        "doc-0",
        "Document 0",
        8,
        "chunk text number 7",
        ("odd", "prime"),
    )
    assert first.score == pytest.approx(1.0, abs=1e-5)
    assert all(r.score == r.vector_score for r in results)
    assert ids(retriever.search("", top_k=2, query_vector=VECTORS[7])) == brute_force(VECTORS[7], 2)


def test_a_result_is_its_indexed_chunk_and_its_scores() -> None:
    retriever = filled()
    chunk = IndexedChunk(chunk_id=900, document_id="doc-x", text="t", title="X", page=3, tags=("a",), collection="c")
    retriever.add([chunk], VECTORS[7:8])
    [hit] = retriever.search("", top_k=1, filters=SearchFilters(collections=["c"]), query_vector=VECTORS[7])
    assert hit == RetrievedChunk.of(chunk, hit.score, hit.vector_score)
    assert (hit.collection, hit.score) == ("c", pytest.approx(1.0, abs=1e-5))


def test_filters() -> None:
    retriever = filled()
    query = VECTORS[0]

    def search(filters: SearchFilters) -> list[int]:
        return ids(retriever.search("", top_k=50, filters=filters, query_vector=query))

    assert search(SearchFilters(document_ids=["doc-2"])) == brute_force(query, 50, list(range(20, 30)))
    assert search(SearchFilters(tags=["odd"])) == brute_force(query, 50, list(range(1, NUM, 2)))
    assert sorted(search(SearchFilters(tags={"prime", "even"}))) == sorted(
        [100 + i for i in range(0, NUM, 2)] + [103, 105, 107, 111, 113]
    )
    all_tags = SearchFilters(tags=["odd", "prime"], match_all_tags=True)
    assert sorted(search(all_tags)) == [103, 105, 107, 111, 113]
    assert sorted(search(SearchFilters(document_ids=["doc-1"], tags=["prime"]))) == [111, 113]
    # An empty set matches nothing (it never means "no filter"), unknown values match nothing.
    assert retriever.search("", filters=SearchFilters(document_ids=[]), query_vector=query) == []
    assert retriever.search("", filters=SearchFilters(tags=["nope"]), query_vector=query) == []


def test_score_threshold_is_on_cosine() -> None:
    retriever = filled()
    query = VECTORS[3]
    cosines = VECTORS @ query
    expected = [100 + i for i in np.argsort(-cosines, kind="stable") if cosines[i] >= 0.3][:50]
    assert ids(retriever.search("", top_k=50, score_threshold=0.3, query_vector=query)) == expected
    strict = filled(RetrievalSettings(score_threshold=0.99))
    assert ids(strict.search("", query_vector=query)) == [103]
    assert len(strict.search("", score_threshold=-1.0, query_vector=query)) == 6  # per-call override


def test_remove_update_and_replace() -> None:
    retriever = filled()
    assert retriever.remove([100, 101, 999]) == 2
    assert retriever.count == NUM - 2
    assert 100 not in ids(retriever.search("", top_k=NUM, query_vector=VECTORS[0]))
    assert retriever.remove_document("doc-1") == 10
    assert retriever.document_chunk_ids("doc-1") == []
    assert retriever.search("", filters=SearchFilters(document_ids=["doc-1"]), query_vector=VECTORS[12]) == []
    assert retriever.set_document_tags("doc-2", ["fresh"]) == 10
    tagged = retriever.search("", top_k=50, filters=SearchFilters(tags=["fresh"]), query_vector=VECTORS[0])
    assert sorted(ids(tagged)) == list(range(120, 130))
    assert all(r.tags == ("fresh",) for r in tagged)
    primes = retriever.search("", filters=SearchFilters(tags=["prime"]), query_vector=VECTORS[0])
    assert sorted(ids(primes)) == [103, 105, 107]  # 111 and 113 went with doc-1
    # Adding an existing id replaces chunk and vector.
    replacement = IndexedChunk(chunk_id=130, document_id="doc-9", text="new text", title="New")
    retriever.add([replacement], -VECTORS[:1])
    assert retriever.get(130) == replacement
    assert ids(retriever.search("", top_k=1, query_vector=-VECTORS[0])) == [130]
    assert retriever.document_chunk_ids("doc-3") == list(range(131, 140))
    with pytest.raises(IndexMismatchError):
        retriever.add([replacement], np.ones((1, DIM + 1), dtype=np.float32))
    with pytest.raises(ValueError, match="unique"):
        retriever.add([replacement, replacement], VECTORS[:2])
    with pytest.raises(ValueError, match="NaN"):
        retriever.add([replacement], np.full((1, DIM), np.nan, dtype=np.float32))
    assert retriever.get(130) == replacement  # a rejected replacement leaves the old chunk in place


def test_hybrid_brings_in_keyword_matches() -> None:
    chunks = [
        *CHUNKS,
        IndexedChunk(chunk_id=999, document_id="doc-x", text="zyzzyva is a weevil genus", title="Zyzzyva"),
    ]
    far = -VECTORS[5:6]  # the keyword chunk points away from the query
    vectors = np.concatenate([VECTORS, far])
    query = VECTORS[5]
    plain = Retriever(RetrievalSettings(top_k=3))
    plain.add(chunks, vectors)
    assert 999 not in ids(plain.search("zyzzyva", query_vector=query))

    hybrid = Retriever(RetrievalSettings(top_k=3, hybrid=True, rrf_k=60, num_candidates=50))
    hybrid.add(chunks, vectors)
    results = hybrid.search("zyzzyva", query_vector=query)
    # Vector rank 1 (chunk 105) fuses to 1/61; the only BM25 hit (999, vector rank 41) to 1/61 + 1/101.
    assert ids(results)[:2] == [999, 105]
    assert results[0].score == pytest.approx(1 / 61 + 1 / 101)
    assert results[1].score == pytest.approx(1 / 61)
    assert results[0].vector_score == pytest.approx(-1.0, abs=1e-5)  # exact cosine even for keyword hits
    # The cosine threshold still applies to keyword-only hits.
    assert 999 not in ids(hybrid.search("zyzzyva", score_threshold=0.0, query_vector=query))


def test_missing_reranker_is_skipped_with_reason(tmp_path: Path) -> None:
    retriever = filled(RetrievalSettings(rerank_model=str(tmp_path / "no-model")))
    assert ids(retriever.search("", query_vector=VECTORS[2])) == brute_force(VECTORS[2], 6)
    assert "not a local cross-encoder directory" in (retriever.rerank_disabled_reason or "")
    unset = filled()
    unset.search("", query_vector=VECTORS[2])
    assert unset.rerank_disabled_reason == "no rerank_model configured"


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_snapshot_round_trip(tmp_path: Path, index_type: str) -> None:
    settings = RetrievalSettings(index_type=index_type, ivf_nlist=1, ivf_nprobe=1)  # IVF trains at 39
    retriever = filled(settings, tmp_path)
    retriever.remove([100])
    retriever.set_document_tags("doc-3", ["x"])
    assert retriever.save() is True
    assert retriever.save() is False  # nothing changed
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        MANIFEST_FILENAME,
        "bm25-000001.json",
        "chunks-000001.jsonl",
        "vectors-000001.bin",
    ]
    loaded = Retriever.open(tmp_path, settings)
    assert loaded.count == NUM - 1
    assert loaded.chunk_ids() == retriever.chunk_ids()
    assert loaded.get(131) == retriever.get(131)
    for row in (1, 17, 33):
        assert loaded.search("", top_k=5, query_vector=VECTORS[row]) == retriever.search(
            "", top_k=5, query_vector=VECTORS[row]
        )
    assert ids(loaded.search("", top_k=50, filters=SearchFilters(tags=["x"]), query_vector=VECTORS[0])) == brute_force(
        VECTORS[0], 50, list(range(30, 40))
    )


def test_new_generation_replaces_old_files_and_crash_leaves_old_snapshot(tmp_path: Path) -> None:
    retriever = filled(directory=tmp_path)
    retriever.save()
    retriever.remove([105])
    retriever.save()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [MANIFEST_FILENAME, "bm25-000002.json", "chunks-000002.jsonl", "vectors-000002.bin"]
    assert json.loads((tmp_path / MANIFEST_FILENAME).read_text())["generation"] == 2
    # A crash while writing generation 3 leaves partial files but the manifest still names generation 2.
    (tmp_path / "chunks-000003.jsonl").write_text("{garbage")
    (tmp_path / ".vectors-000003.bin.123.abcd.tmp").write_bytes(b"partial")
    reopened = Retriever.open(tmp_path)
    assert reopened.count == NUM - 1 and reopened.get(105) is None
    reopened.remove([106])
    reopened.save()  # generation 3 overwrites the partial file
    assert Retriever.open(tmp_path).count == NUM - 2
    # A recent temp file may be another writer's: only temp files older than an hour are swept.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".vectors-000003.bin.123.abcd.tmp",
        MANIFEST_FILENAME,
        "bm25-000003.json",
        "chunks-000003.jsonl",
        "vectors-000003.bin",
    ]


def test_load_converts_index_type_and_rejects_other_embedder(tmp_path: Path) -> None:
    filled(RetrievalSettings(index_type="flat"), tmp_path).save()
    converted = Retriever.open(tmp_path, RetrievalSettings(index_type="hnsw"))
    assert converted.search("", top_k=1, query_vector=VECTORS[9])[0].chunk_id == 109
    assert converted.save() is True  # the conversion is written back
    assert json.loads((tmp_path / MANIFEST_FILENAME).read_text())["index_type"] == "hnsw"
    with pytest.raises(IndexMismatchError, match="embedder"):
        Retriever.open(tmp_path, RetrievalSettings(embedder="/models/other"))


def test_inconsistent_snapshot_and_missing_directory(tmp_path: Path) -> None:
    filled(directory=tmp_path).save()
    lines = (tmp_path / "chunks-000001.jsonl").read_text().splitlines()
    (tmp_path / "chunks-000001.jsonl").write_text("\n".join(lines[1:]))
    with pytest.raises(RetrievalError, match="inconsistent"):
        Retriever.open(tmp_path)
    assert Retriever(directory=tmp_path / "empty").load() is False
    with pytest.raises(RetrievalError, match="no directory"):
        Retriever().save()


def test_empty_retriever_searches_nothing() -> None:
    assert Retriever().search("anything", query_vector=VECTORS[0]) == []


LINE_BREAKERS = "\u2028\u2029\x85\x0b\x0c\x1c\x1d\x1e\r"  # everything str.splitlines breaks at, but "\n"


def test_snapshot_survives_every_line_separator_in_title_tags_and_text(tmp_path: Path) -> None:
    hostile = IndexedChunk(
        chunk_id=7, document_id="doc-x", text=f"Revenue{LINE_BREAKERS}grew", title="Q3\u2028report", tags=("a\u2029b",)
    )
    retriever = Retriever(RetrievalSettings(), tmp_path)
    retriever.add([hostile], VECTORS[:1])
    retriever.save()
    raw = (tmp_path / "chunks-000001.jsonl").read_bytes()
    assert raw.isascii() and len(raw.splitlines()) == 1  # line-safe for any reader
    loaded = Retriever.open(tmp_path)
    assert loaded.get(7) == hostile
    assert json.loads((tmp_path / MANIFEST_FILENAME).read_text())["format"] == 2


def test_format_1_snapshot_with_raw_separators_loads(tmp_path: Path) -> None:
    """A snapshot written before the fix (raw U+2028 in the JSON) is read again after upgrading."""
    retriever = Retriever(RetrievalSettings(), tmp_path)
    retriever.add(
        [IndexedChunk(chunk_id=5, document_id="d", text="Revenue grew.", title="Q3\u2028report")], VECTORS[:1]
    )
    retriever.save()
    record = {
        "chunk_id": 5,
        "document_id": "d",
        "title": "Q3\u2028report",
        "page": None,
        "tags": [],
        "text": "Revenue grew.",
    }
    (tmp_path / "chunks-000001.jsonl").write_bytes(json.dumps(record, ensure_ascii=False).encode())
    manifest = json.loads((tmp_path / MANIFEST_FILENAME).read_text())
    (tmp_path / MANIFEST_FILENAME).write_text(json.dumps({**manifest, "format": 1}))
    assert Retriever.open(tmp_path).get(5).title == "Q3\u2028report"  # type: ignore[union-attr]


def test_collection_filter_fills_top_k_from_the_callers_collection(tmp_path: Path) -> None:
    """Chunks of another collection lie closer to the query; the filter is applied inside the vector and
    keyword search, so top-k is filled from the allowed collection alone, and a snapshot keeps it."""
    chunks = [
        IndexedChunk(chunk_id=100 + i, document_id=f"doc-{i}", text=f"kite festival {i}", collection=c)
        for i, c in enumerate(["team-a"] * 10 + ["team-b"] * 30)
    ]
    retriever = Retriever(RetrievalSettings(hybrid=True), tmp_path)
    retriever.add(chunks, VECTORS)
    query = VECTORS[0]  # chunk 100 is team-a; the closest team-b chunks outrank most of team-a
    only_b = SearchFilters(collections=["team-b"])
    hits = retriever.search("kite festival", top_k=5, filters=only_b, query_vector=query)
    assert len(hits) == 5 and {h.chunk_id for h in hits} <= set(range(110, 140))
    plain = Retriever(RetrievalSettings(), tmp_path / "plain")
    plain.add(chunks, VECTORS)
    vector_hits = plain.search("x", top_k=5, filters=SearchFilters(collections=["team-a"]), query_vector=query)
    assert ids(vector_hits) == brute_force(query, 5, list(range(10)))
    assert plain.search("x", top_k=5, filters=SearchFilters(collections=["nobody"]), query_vector=query) == []
    retriever.save()
    reopened = Retriever.open(tmp_path, RetrievalSettings(hybrid=True))
    assert [reopened.get(100).collection, reopened.get(139).collection] == ["team-a", "team-b"]
    assert ids(reopened.search("kite festival", top_k=5, filters=only_b, query_vector=query)) == ids(hits)
    retriever.remove([100 + i for i in range(10)])
    assert retriever.search("x", top_k=5, filters=SearchFilters(collections=["team-a"]), query_vector=query) == []


def test_snapshot_files_round_trip_without_a_retriever(tmp_path: Path) -> None:
    from retrieval.bm25 import BM25Index
    from retrieval.index import VectorIndex
    from retrieval.snapshot import delete_stale_files, encode_snapshot, read_snapshot, write_snapshot
    from retrieval.types import IndexedChunk

    chunk = IndexedChunk(chunk_id=3, document_id="d", text="line\u2028break", title="T", page=None, tags=("a",))
    bm25 = BM25Index()
    bm25.add(3, chunk.text)
    index = VectorIndex(2, "flat")
    index.add(np.array([3]), np.array([[0.6, 0.8]], dtype=np.float32))
    assert read_snapshot(tmp_path, "emb", use_gpu=False) is None  # no manifest: no snapshot
    write_snapshot(tmp_path, encode_snapshot(1, [chunk], bm25, index, "emb"))
    (tmp_path / "chunks-000000.jsonl").write_bytes(b"")  # another generation's leftover
    delete_stale_files(tmp_path, 1)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [MANIFEST_FILENAME, "bm25-000001.json", "chunks-000001.jsonl", "vectors-000001.bin"]
    snapshot = read_snapshot(tmp_path, "emb", use_gpu=False)
    assert snapshot is not None and snapshot.generation == 1 and snapshot.index.ids().tolist() == [3]
    assert snapshot.chunks == [chunk] and snapshot.bm25.ids() == [3]
    assert b"\\u2028" in (tmp_path / "chunks-000001.jsonl").read_bytes()  # line-safe: escaped, not raw
    with pytest.raises(IndexMismatchError):
        read_snapshot(tmp_path, "another-embedder", use_gpu=False)
