from pathlib import Path

import pytest
from kvtest_helpers import ENTRY_TENSOR_BYTES, PREFIX_IDS, RedisServer, make_kv, settings

from kvcache.coverage import ChunkRef, ChunkState, CoverageCounts, compute_coverage
from kvcache.keys import chunk_key
from kvcache.store import TieredKVStore


def _keys(n: int, fingerprint: str) -> list[str]:
    return [chunk_key(fingerprint, PREFIX_IDS, [500 + i]) for i in range(n)]


def test_fresh_stale_missing_per_document_and_tier(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    new = _keys(6, "model-v2")  # keys under the current model
    old = _keys(6, "model-v1")  # keys recorded at ingest under the previous model
    sizes = {}
    sizes[0] = store.put(new[0], make_kv(0), model_fingerprint="model-v2").num_bytes  # memory + disk
    store.put(old[1], make_kv(1), model_fingerprint="model-v1")  # only the old key: stale
    sizes[3] = store.put(new[3], make_kv(3), model_fingerprint="model-v2", cache_in_memory=False).num_bytes  # disk only
    refs = [
        ChunkRef(chunk_id=10, document_id="A", expected_key=new[0], recorded_key=new[0]),  # fresh
        ChunkRef(chunk_id=11, document_id="A", expected_key=new[1], recorded_key=old[1]),  # stale
        ChunkRef(chunk_id=12, document_id="A", expected_key=new[2], recorded_key=old[2]),  # missing
        ChunkRef(chunk_id=13, document_id="B", expected_key=new[3], recorded_key=old[3]),  # fresh
        ChunkRef(chunk_id=14, document_id="B", expected_key=new[4], recorded_key=new[4]),  # missing
        ChunkRef(chunk_id=15, document_id="B", expected_key=new[5], recorded_key=None),  # missing
    ]
    report = compute_coverage(store, refs)
    assert [c.state for c in report.chunks] == [
        ChunkState.FRESH,
        ChunkState.OUTDATED,
        ChunkState.MISSING,
        ChunkState.FRESH,
        ChunkState.MISSING,
        ChunkState.MISSING,
    ]
    assert [c.tier for c in report.chunks] == ["memory", None, None, "disk", None, None]
    assert report.chunks[0].num_bytes == ENTRY_TENSOR_BYTES and report.chunks[3].num_bytes == sizes[3]
    assert report.total == CoverageCounts(
        num_chunks=6,
        num_fresh=2,
        num_outdated=1,
        num_missing=3,
        fresh_by_tier={"memory": 1, "disk": 2},
        bytes_by_tier={"memory": ENTRY_TENSOR_BYTES, "disk": sizes[0] + sizes[3]},
    )
    assert report.total.coverage == pytest.approx(2 / 6)
    assert list(report.documents) == ["A", "B"]
    a, b = report.documents["A"], report.documents["B"]
    assert (a.num_chunks, a.num_fresh, a.num_outdated, a.num_missing) == (3, 1, 1, 1)
    assert (b.num_chunks, b.num_fresh, b.num_outdated, b.num_missing) == (3, 1, 0, 2)
    assert a.fresh_by_tier == {"memory": 1, "disk": 1} and b.fresh_by_tier == {"disk": 1}
    assert b.bytes_by_tier == {"disk": sizes[3]}
    assert report.chunk_ids(ChunkState.OUTDATED) == [11]
    assert report.chunk_ids(ChunkState.MISSING) == [12, 14, 15]


def test_fresh_wins_even_if_recorded_key_differs(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    new, old = _keys(1, "v2"), _keys(1, "v1")
    store.put(new[0], make_kv(0), model_fingerprint="v2")
    store.put(old[0], make_kv(0), model_fingerprint="v1")
    report = compute_coverage(store, [ChunkRef(1, 1, new[0], old[0])])
    assert report.total.num_fresh == 1 and report.total.num_outdated == 0 and report.total.coverage == 1.0


def test_empty_library() -> None:
    store = TieredKVStore(settings(None))
    report = compute_coverage(store, [])
    assert report.total == CoverageCounts() and report.total.coverage == 1.0 and report.documents == {}


@pytest.mark.redis
def test_redis_tier_is_reported(tmp_path: Path, redis_server: RedisServer) -> None:
    writer = TieredKVStore(settings(tmp_path / "w", redis_url=redis_server.url))
    key = _keys(1, "v")[0]
    size = writer.put(key, make_kv(0), model_fingerprint="v").num_bytes
    reader = TieredKVStore(settings(tmp_path / "r", redis_url=redis_server.url))
    report = compute_coverage(reader, [ChunkRef("c", "d", key, key)])
    assert report.chunks[0].tier == "redis"
    assert report.total.bytes_by_tier == {"redis": size} and report.total.fresh_by_tier == {"redis": 1}
