import os
import shutil
import time
from pathlib import Path

import pytest
from kvtest_helpers import FINGERPRINT, RedisServer, entry_files, key_of, make_kv, settings

from kvcache import admin
from kvcache.store import TieredKVStore


def _store_with(tmp_path: Path, n: int, **kw: object) -> tuple[TieredKVStore, list[int]]:
    store = TieredKVStore(settings(tmp_path, **kw))
    sizes = [store.put(key_of(i), make_kv(i), model_fingerprint=FINGERPRINT).num_bytes for i in range(n)]
    return store, sizes


def test_verify_removes_exactly_the_bad_entries(tmp_path: Path) -> None:
    store, _ = _store_with(tmp_path, 6)
    disk = store.disk
    assert disk is not None
    p = disk.path_for
    data = bytearray(p(key_of(1)).read_bytes())
    data[-3] ^= 0x10  # a bit flip in the last tensor
    p(key_of(1)).write_bytes(bytes(data))
    os.truncate(p(key_of(2)), 100)
    shutil.copy(p(key_of(0)), p(key_of(3)))  # entry under the wrong name
    report = admin.verify(store)
    assert (report.num_checked, report.num_ok, report.num_removed) == (6, 3, 3)
    assert sorted(report.removed_keys) == sorted([key_of(1), key_of(2), key_of(3)])
    assert {(x.key, x.kind) for x in report.problems} == {
        (key_of(1), "checksum"),
        (key_of(2), "truncated"),
        (key_of(3), "format"),
    }
    assert report.checked_by_tier == {"disk": 6} and report.removed_by_tier == {"disk": 3}
    assert report.skipped_tiers == ("redis",)
    assert sorted(disk.keys()) == sorted([key_of(0), key_of(4), key_of(5)])
    assert entry_files(tmp_path / "kv") == sorted(p(key_of(i)) for i in (0, 4, 5))
    # the memory copies of removed entries are dropped too, so nothing serves them any more
    assert [store.contains(key_of(i)) for i in range(6)] == ["memory", None, None, None, "memory", "memory"]
    st = store.stats().tier("disk")
    assert st is not None and st.faults_by_kind == {"checksum": 1, "truncated": 1, "format": 1}
    again = admin.verify(store)
    assert (again.num_checked, again.num_removed) == (3, 0)


def test_verify_sees_entries_written_by_another_process(tmp_path: Path) -> None:
    store, _ = _store_with(tmp_path, 1)
    other, _ = _store_with(tmp_path, 3)
    assert other is not store
    assert admin.verify(store).num_checked == 3


@pytest.mark.redis
def test_verify_checks_redis(tmp_path: Path, redis_server: RedisServer) -> None:
    store, _ = _store_with(tmp_path, 3, redis_url=redis_server.url)
    raw = redis_server.client()
    raw.set("blendrag:kv:" + key_of(1), b"garbage-bytes-not-an-entry")
    report = admin.verify(store, tiers=("redis",))
    assert report.checked_by_tier == {"redis": 3} and report.removed_keys == (key_of(1),)
    assert report.problems[0].tier == "redis"
    assert raw.exists("blendrag:kv:" + key_of(1)) == 0
    assert admin.verify(store).checked_by_tier == {"disk": 3, "redis": 2}
    with pytest.raises(ValueError):
        admin.verify(store, tiers=("memory",))


def test_prune_evicts_least_recently_used_first(tmp_path: Path) -> None:
    store, sizes = _store_with(tmp_path, 5)
    disk = store.disk
    assert disk is not None
    now = time.time()
    for i, age in enumerate((10, 50, 30, 40, 20)):  # LRU order: 1, 3, 2, 4, 0
        os.utime(disk.path_for(key_of(i)), (now - age, now - age))
    disk.rescan()
    report = admin.prune(store, max_bytes=sizes[0] + sizes[4] + 1)
    assert report.evicted_keys == (key_of(1), key_of(3), key_of(2))
    assert (report.num_evicted, report.num_entries_before, report.num_entries_after) == (3, 5, 2)
    assert report.num_bytes_before == sum(sizes) and report.num_bytes_after == sizes[0] + sizes[4]
    assert (report.num_removed, report.bytes_removed, report.bytes_after) == (
        3,
        sizes[1] + sizes[2] + sizes[3],
        sizes[0] + sizes[4],
    )
    assert sorted(disk.keys()) == sorted([key_of(0), key_of(4)])
    assert admin.prune(store, 0).num_entries_after == 0
    assert entry_files(tmp_path / "kv") == []
    assert admin.stats(store).tier("disk").num_evictions == 5  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        admin.prune(store, -1)
    with pytest.raises(ValueError):
        admin.prune(TieredKVStore(settings(None)), 10)


def test_convert_interrupted_and_resumed_leaves_every_entry_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsio.atomic as atomic

    store, _ = _store_with(tmp_path, 6, memory_bytes=0)  # fp16 entries
    disk = store.disk
    assert disk is not None
    before = {key_of(i): store.get(key_of(i)) for i in range(6)}
    fp16_size = disk.nbytes_of(key_of(0))
    # the run is killed while writing its third entry (after part of the bytes went out)
    writes = [0]
    real_write = atomic._os_write

    def dying_write(fd: int, data: object) -> int:
        writes[0] += 1
        if writes[0] == 3:
            real_write(fd, bytes(memoryview(data)[:100]))  # type: ignore[arg-type]
            raise KeyboardInterrupt
        return real_write(fd, data)  # type: ignore[arg-type]

    monkeypatch.setattr(atomic, "_os_write", dying_write)
    order = disk.keys()
    with pytest.raises(KeyboardInterrupt):
        admin.convert(store, "int4")
    monkeypatch.setattr(atomic, "_os_write", real_write)
    # every entry reads: the first two in int4, the others still fp16; no temp file is left behind
    dtypes = {k: store.get_entry(k).meta.storage_dtype for k in order}  # type: ignore[union-attr]
    assert [dtypes[k] for k in order] == ["int4", "int4", "fp16", "fp16", "fp16", "fp16"]
    assert entry_files(tmp_path / "kv") == sorted(disk.path_for(k) for k in order)
    resumed = admin.convert(store, "int4")
    assert (resumed.num_converted, resumed.num_already, resumed.num_removed) == (4, 2, 0)
    again = admin.convert(store, "int4")
    assert (again.num_converted, again.num_already) == (0, 6)
    for key, old in before.items():
        new = store.get(key)
        assert new is not None and old is not None
        assert store.get_entry(key).meta.storage_dtype == "int4"  # type: ignore[union-attr]
        assert float((new.k.float() - old.k.float()).abs().max()) < 0.6  # make_kv is N(0, 1): steps < 0.6
    size = disk.nbytes_of(key_of(0))
    assert size is not None and fp16_size is not None and size < fp16_size  # a small entry: header-heavy
    assert store.get_entry(key_of(0)).nbytes == 1536 < before[key_of(0)].nbytes() / 2  # type: ignore[union-attr]
    assert resumed.num_bytes_after < resumed.num_bytes_before
    # and back: converting is not one-way
    assert admin.convert(store, "fp16").num_converted == 6
