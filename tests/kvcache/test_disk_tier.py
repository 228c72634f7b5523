import os
import time
from pathlib import Path

import pytest
import torch
from kvtest_helpers import FINGERPRINT, entry_files, key_of, make_kv

from kvcache.disk_tier import DiskTier
from kvcache.format import encode_entry, serialize_entry


def _data(i: int, num_tokens: int = 16) -> bytes:
    entry = encode_entry(
        make_kv(i, num_tokens=num_tokens),
        key=key_of(i),
        model_fingerprint=FINGERPRINT,
        storage_dtype="fp16",
        created_at=1.0,
    )
    return serialize_entry(entry)


SIZE = len(_data(0))


def test_put_get_round_trip_and_layout(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 100 * SIZE, fsync=True)
    key = key_of(0)
    data = _data(0)  # (safetensors orders metadata by hash: serializations may differ byte-wise)
    assert tier.put_bytes(key, data)
    path = tmp_path / key[:2] / f"{key}.safetensors"
    assert tier.path_for(key) == path and path.read_bytes() == data
    assert entry_files(tmp_path) == [path]  # no temp file left behind
    entry = tier.get(key)
    assert entry is not None
    assert torch.equal(entry.k, make_kv(0).k) and torch.equal(entry.v, make_kv(0).v)
    assert tier.contains(key) and tier.nbytes_of(key) == SIZE
    assert tier.get(key_of(1)) is None
    st = tier.stats()
    assert (st.num_entries, st.num_bytes, st.num_hits, st.num_misses) == (1, SIZE, 1, 1)
    assert tier.read_bytes(key) == data


def test_lru_eviction_order_is_exact(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 3 * SIZE)
    for i in range(3):
        tier.put_bytes(key_of(i), _data(i))
    assert tier.keys() == [key_of(0), key_of(1), key_of(2)]
    reader = tier.open_reader(key_of(0))  # a read makes 0 the most recently used
    assert reader is not None
    reader.close()
    tier.put_bytes(key_of(3), _data(3))
    assert tier.keys() == [key_of(2), key_of(0), key_of(3)]
    assert not tier.path_for(key_of(1)).exists()
    st = tier.stats()
    assert (st.num_entries, st.num_bytes, st.num_evictions) == (3, 3 * SIZE, 1)


def test_index_is_rebuilt_at_start_in_lru_order(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 100 * SIZE)
    for i in range(4):
        tier.put_bytes(key_of(i), _data(i))
    now = time.time()
    for age, i in ((40, 2), (30, 0), (20, 3), (10, 1)):  # access times: 2 oldest, then 0, 3, 1
        os.utime(tier.path_for(key_of(i)), (now - age, now - age))
    (tmp_path / "zz").mkdir()  # unrelated names are ignored
    (tmp_path / "ab" / "notes.txt").parent.mkdir(exist_ok=True)
    (tmp_path / "ab" / "notes.txt").write_text("x")
    again = DiskTier(tmp_path, 100 * SIZE)
    assert again.keys() == [key_of(2), key_of(0), key_of(3), key_of(1)]
    assert again.stats().num_bytes == 4 * SIZE
    # a budget below the current size evicts in that order at the next write
    small = DiskTier(tmp_path, 3 * SIZE)
    small.put_bytes(key_of(5), _data(5))
    assert small.keys() == [key_of(3), key_of(1), key_of(5)]


def test_hit_is_persisted_as_mtime(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 100 * SIZE)
    tier.put_bytes(key_of(0), _data(0))
    tier.put_bytes(key_of(1), _data(1))
    old = time.time() - 100
    for i in (0, 1):
        os.utime(tier.path_for(key_of(i)), (old + i, old + i))
    assert tier.get(key_of(0)) is not None
    assert DiskTier(tmp_path, 100 * SIZE).keys() == [key_of(1), key_of(0)]


def test_stale_temp_files_are_removed_at_start(tmp_path: Path) -> None:
    DiskTier(tmp_path, 100 * SIZE).put_bytes(key_of(0), _data(0))
    shard = tmp_path / key_of(0)[:2]
    stale = shard / f".{key_of(0)}.safetensors.1.abcd1234.tmp"  # pid 1 runs: only its age makes it stale
    fresh = shard / f".{key_of(0)}.safetensors.1.abce1234.tmp"
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    tier = DiskTier(tmp_path, 100 * SIZE, stale_tmp_age_s=3600)
    assert not stale.exists() and fresh.exists()  # a fresh one may belong to a live writer
    assert tier.keys() == [key_of(0)]


def test_entries_written_by_another_process_are_adopted(tmp_path: Path) -> None:
    ours = DiskTier(tmp_path, 100 * SIZE)
    theirs = DiskTier(tmp_path, 100 * SIZE)
    theirs.put_bytes(key_of(7), _data(7))
    assert ours.keys() == []
    assert ours.contains(key_of(7))
    assert ours.keys() == [key_of(7)] and ours.stats().num_bytes == SIZE
    entry = ours.get(key_of(7))
    assert entry is not None and torch.equal(entry.k, make_kv(7).k)


def test_over_budget_entry_is_rejected(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, SIZE + 10)
    tier.put_bytes(key_of(0), _data(0))
    assert not tier.put_bytes(key_of(1), _data(1, num_tokens=64))
    assert tier.keys() == [key_of(0)] and tier.stats().num_rejected == 1
    assert entry_files(tmp_path) == [tier.path_for(key_of(0))]


def test_overwrite_flag(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 100 * SIZE)
    key = key_of(0)
    tier.put_bytes(key, _data(0))
    inode = tier.path_for(key).stat().st_ino
    assert tier.put_bytes(key, _data(0))  # content-addressed: already there, not rewritten
    assert tier.path_for(key).stat().st_ino == inode
    assert tier.put_bytes(key, _data(0), overwrite=True)
    assert tier.path_for(key).stat().st_ino != inode  # atomically replaced by a new file
    assert tier.stats().num_entries == 1 and tier.stats().num_bytes == SIZE


def test_evict_to_and_delete(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 100 * SIZE)
    for i in range(5):
        tier.put_bytes(key_of(i), _data(i))
    assert tier.evict_to(2 * SIZE) == [key_of(0), key_of(1), key_of(2)]
    assert tier.keys() == [key_of(3), key_of(4)]
    assert tier.delete(key_of(3)) and not tier.delete(key_of(3))
    assert entry_files(tmp_path) == [tier.path_for(key_of(4))]
    assert tier.stats().num_evictions == 3


def test_bad_keys_never_touch_the_filesystem(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 100 * SIZE)
    with pytest.raises(ValueError):
        tier.put_bytes("../../etc/passwd", b"x")
    with pytest.raises(ValueError):
        tier.contains("ZZ")
    with pytest.raises(ValueError):
        DiskTier(tmp_path, 0)


def test_a_read_that_lost_a_race_with_evict_and_rewrite_is_no_fault(tmp_path: Path, monkeypatch) -> None:
    """A reader's open fails because the entry was evicted; before it reports the file missing, another
    thread writes the entry again. The new entry stays indexed and nothing counts as deleted behind our back;
    a file really deleted by someone else still does."""
    import kvcache.disk_tier as disk_tier

    tier = DiskTier(tmp_path, 100 * SIZE, fsync=False)
    key = key_of(0)
    assert tier.put_bytes(key, _data(0))

    def lost_the_race(path: Path, key: str) -> None:
        # the open saw no file (evicted); by the time the reader looks again, the entry has been rewritten
        raise FileNotFoundError(path)

    with monkeypatch.context() as m:
        m.setattr(disk_tier, "FileEntryReader", lost_the_race)
        assert tier.get(key) is None  # this read missed
    st = tier.stats()
    assert (st.num_faults, st.num_entries, st.num_bytes) == (0, 1, SIZE)
    assert tier.get(key) is not None

    tier.path_for(key).unlink()  # another process deletes it
    assert tier.get(key) is None
    st = tier.stats()
    assert (st.num_faults, st.faults_by_kind, st.num_entries, st.num_bytes) == (1, {"missing_file": 1}, 0, 0)
