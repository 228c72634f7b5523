"""Every storage fault the store must survive: counted, logged, never an exception or a wrong tensor."""

import contextlib
import errno
import json
import logging
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from atomic_writers import start_writers
from kvtest_helpers import (
    FINGERPRINT,
    NUM_LAYERS,
    RedisServer,
    entry_files,
    free_port,
    key_of,
    make_kv,
    settings,
)

import fsio.atomic
from kvcache.disk_tier import DiskTier
from kvcache.errors import KVEntryCorrupt, KVEntryMissing
from kvcache.format import encode_entry, serialize_entry
from kvcache.reader import FileEntryReader
from kvcache.store import TieredKVStore
from kvcache.types import ChunkKV


def _disk_store(tmp_path: Path, **kw: object) -> TieredKVStore:
    return TieredKVStore(settings(tmp_path, memory_bytes=0, **kw))


def _flip_byte_in(path: Path, tensor: str, at: int = 3) -> None:
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    start = 8 + n + json.loads(data[8 : 8 + n])[tensor]["data_offsets"][0]
    data[start + at] ^= 0x01
    path.write_bytes(bytes(data))


def _faults(store: TieredKVStore, tier: str) -> dict[str, int]:
    st = store.stats().tier(tier)
    assert st is not None
    return st.faults_by_kind


# -- disk ---------------------------------------------------------------------------------------------


def test_truncated_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = _disk_store(tmp_path)
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    store.put(key_of(1), make_kv(1), model_fingerprint=FINGERPRINT)
    path = store.disk.path_for(key_of(0))  # type: ignore[union-attr]
    os.truncate(path, path.stat().st_size - 100)
    with caplog.at_level(logging.WARNING, logger="kvcache"):
        assert store.get(key_of(0)) is None
    assert "corrupt" in caplog.text and key_of(0)[:12] in caplog.text
    assert not path.exists()
    assert _faults(store, "disk") == {"truncated": 1}
    with pytest.raises(KVEntryMissing) as info:
        store.open_layers([key_of(0), key_of(1)])
    assert info.value.keys == (key_of(0),)
    # the store keeps working: recompute + put, then read
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    got = store.get(key_of(0))
    assert got is not None and torch.equal(got.k, make_kv(0).k)


def test_truncated_file_found_by_open_layers_is_reported_missing(tmp_path: Path) -> None:
    store = _disk_store(tmp_path)
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    path = store.disk.path_for(key_of(0))  # type: ignore[union-attr]
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(KVEntryMissing) as info:
        store.open_layers([key_of(0)])
    assert info.value.keys == (key_of(0),)
    assert _faults(store, "disk") == {"truncated": 1} and not path.exists()


@pytest.mark.parametrize("prefetch", [False, True])
def test_corrupt_bytes_fail_the_layer_that_holds_them(tmp_path: Path, prefetch: bool) -> None:
    store = TieredKVStore(settings(tmp_path))  # with a memory tier: a failed read must not be promoted
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT, cache_in_memory=False)
    store.put(key_of(1), make_kv(1), model_fingerprint=FINGERPRINT, cache_in_memory=False)
    path = store.disk.path_for(key_of(1))  # type: ignore[union-attr]
    _flip_byte_in(path, "k.2")
    src = store.open_layers([key_of(0), key_of(1)], prefetch=prefetch)
    for layer in (0, 1):
        k, _ = src.layer(layer)
        assert torch.equal(k, torch.cat([make_kv(0).k[layer], make_kv(1).k[layer]], dim=1))
    with pytest.raises(KVEntryCorrupt) as info:
        src.layer(2)
    exc = info.value
    assert (exc.key, exc.layer_idx, exc.kind, exc.tier) == (key_of(1), 2, "checksum", "disk")
    with pytest.raises(KVEntryCorrupt):
        src.layer(3)  # the source stays failed
    src.close()
    assert not path.exists() and store.contains(key_of(1)) is None
    assert store.contains(key_of(0)) == "disk"  # not promoted from a failed read
    assert _faults(store, "disk") == {"checksum": 1}


def test_corrupt_bytes_via_get(tmp_path: Path) -> None:
    store = _disk_store(tmp_path)
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    _flip_byte_in(store.disk.path_for(key_of(0)), "v.3")  # type: ignore[union-attr]
    assert store.get(key_of(0)) is None
    assert _faults(store, "disk") == {"checksum": 1}
    assert store.stats().num_misses == 1


def test_corrupt_header(tmp_path: Path) -> None:
    store = _disk_store(tmp_path)
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    path = store.disk.path_for(key_of(0))  # type: ignore[union-attr]
    data = bytearray(path.read_bytes())
    data[12:16] = b"\x00\xff\x00\xff"
    path.write_bytes(bytes(data))
    assert store.get(key_of(0)) is None
    assert _faults(store, "disk") == {"format": 1} and not path.exists()


def test_file_deleted_behind_the_stores_back(tmp_path: Path) -> None:
    store = _disk_store(tmp_path)
    for i in range(3):
        store.put(key_of(i), make_kv(i), model_fingerprint=FINGERPRINT)
    store.disk.path_for(key_of(0)).unlink()  # type: ignore[union-attr]
    store.disk.path_for(key_of(1)).unlink()  # type: ignore[union-attr]
    store.disk.path_for(key_of(2)).unlink()  # type: ignore[union-attr]
    assert store.get(key_of(0)) is None
    with pytest.raises(KVEntryMissing) as info:
        store.open_layers([key_of(1)])
    assert info.value.keys == (key_of(1),)
    assert store.contains(key_of(2)) is None
    assert _faults(store, "disk") == {"missing_file": 3}
    assert store.stats().tier("disk").num_entries == 0  # type: ignore[union-attr]
    assert store.stats().tier("disk").num_bytes == 0  # type: ignore[union-attr]


def test_file_deleted_after_open_is_still_served(tmp_path: Path) -> None:
    store = _disk_store(tmp_path)
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    with store.open_layers([key_of(0)], prefetch=False) as src:
        store.disk.path_for(key_of(0)).unlink()  # type: ignore[union-attr]  (e.g. evicted by a replica)
        for layer in range(NUM_LAYERS):
            assert torch.equal(src.layer(layer)[1], make_kv(0).v[layer])


def test_disk_full_while_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = TieredKVStore(settings(tmp_path))
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    real_write = fsio.atomic._os_write
    calls = []

    def full_disk(fd: int, data: memoryview) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, data[: len(data) // 2])  # part of the file lands, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsio.atomic, "_os_write", full_disk)
    result = store.put(key_of(1), make_kv(1), model_fingerprint=FINGERPRINT)
    assert len(calls) == 2
    assert result.stored_in == ("memory",) and result.failed == ("disk",) and not result.persisted
    assert entry_files(tmp_path / "kv") == [store.disk.path_for(key_of(0))]  # type: ignore[union-attr]
    assert _faults(store, "disk") == {"disk_full": 1}
    assert store.stats().tier("disk").num_entries == 1  # type: ignore[union-attr]
    monkeypatch.setattr(fsio.atomic, "_os_write", real_write)
    # the disk has room again: the store still works
    assert store.put(key_of(1), make_kv(1), model_fingerprint=FINGERPRINT, overwrite=True).persisted
    fresh = _disk_store(tmp_path)
    got = fresh.get(key_of(1))
    assert got is not None and torch.equal(got.k, make_kv(1).k)


def test_other_write_errors_are_faults_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _disk_store(tmp_path)

    def eio(fd: int, data: memoryview) -> int:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(fsio.atomic, "_os_write", eio)
    assert store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT).failed == ("disk",)
    assert _faults(store, "disk") == {"write_failed": 1}
    assert entry_files(tmp_path / "kv") == []


# -- two writers of one key ---------------------------------------------------------------------------


def _variant(value: float) -> ChunkKV:
    shape = (NUM_LAYERS, 2, 2048, 8)  # ~260 KB: big enough that writes really interleave
    return ChunkKV(k=torch.full(shape, value, dtype=torch.float16), v=torch.full(shape, -value, dtype=torch.float16))


def _check_complete(path: Path, key: str, allowed: set[float]) -> bool:
    """True if a complete valid entry of one writer is there, False if there is no file yet."""
    try:
        with FileEntryReader(path, key) as reader:
            entry = reader.read_all(verify=True)  # raises on any torn / mixed file
    except FileNotFoundError:
        return False
    value = float(entry.k[0, 0, 0, 0])
    assert value in allowed
    assert bool((entry.k == value).all()) and bool((entry.v == -value).all())
    return True


def test_two_writers_threads(tmp_path: Path) -> None:
    key = key_of(0)
    datas = {
        float(v): serialize_entry(
            encode_entry(_variant(v), key=key, model_fingerprint=FINGERPRINT, storage_dtype="fp16")
        )
        for v in (1, 2, 3, 4)
    }
    tiers = [DiskTier(tmp_path, 1 << 30, fsync=False) for _ in range(2)]  # two "processes"
    stop = threading.Event()
    num_complete = 0

    def writer(n: int) -> None:
        for _ in range(25):
            tiers[n % 2].put_bytes(key, datas[float(n + 1)], overwrite=True)

    errors: list[BaseException] = []

    def reader() -> None:
        nonlocal num_complete
        try:
            while not stop.is_set():
                num_complete += _check_complete(tiers[0].path_for(key), key, set(datas))
        except BaseException as exc:  # a torn or mixed file: reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    r.join()
    assert errors == []
    assert num_complete > 0
    assert _check_complete(tiers[0].path_for(key), key, set(datas))
    assert entry_files(tmp_path) == [tiers[0].path_for(key)]  # no temp files left
    assert all(t.stats().num_faults == 0 for t in tiers)


def test_two_writers_processes(tmp_path: Path) -> None:
    key = key_of(0)
    path = DiskTier(tmp_path / "kv", 1 << 30).path_for(key)
    sources = []
    for v in (1, 2):
        src = tmp_path / f"variant{v}.bin"
        src.write_bytes(
            serialize_entry(encode_entry(_variant(v), key=key, model_fingerprint=FINGERPRINT, storage_dtype="fp16"))
        )
        sources.append(src)
    procs = start_writers(path, sources)  # the atomic write is what makes concurrent writers safe
    num_complete = 0
    while any(p.poll() is None for p in procs):
        num_complete += _check_complete(path, key, {1.0, 2.0})
        time.sleep(0.001)  # leave the (2) cores to the writers
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert _check_complete(path, key, {1.0, 2.0})
    assert entry_files(tmp_path / "kv") == [path]  # no temp files left
    tier = DiskTier(tmp_path / "kv", 1 << 30)
    assert tier.keys() == [key] and tier.get(key) is not None


# -- Redis --------------------------------------------------------------------------------------------


def test_redis_down_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    store = TieredKVStore(settings(tmp_path, redis_url=url, redis_timeout_s=0.5, redis_retry_s=30))
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="kvcache"):
        result = store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
        assert result.stored_in == ("memory", "disk") and result.failed == ("redis",)
        assert store.get(key_of(0)) is not None
        assert store.get(key_of(1)) is None  # Redis skipped while backing off
        assert store.contains(key_of(1)) is None
        with pytest.raises(KVEntryMissing):
            store.open_layers([key_of(1)])
        st = store.stats()
    assert time.monotonic() - t0 < 2.0
    redis_stats = st.tier("redis")
    assert redis_stats is not None and not redis_stats.available
    assert redis_stats.faults_by_kind == {"unavailable": 1}  # one failure, then back-off
    assert caplog.text.count("skipping Redis") == 1


def test_redis_down_with_no_backoff_never_raises(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    store = TieredKVStore(settings(tmp_path, redis_url=url, redis_timeout_s=0.5, redis_retry_s=0))
    assert store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT).failed == ("redis",)
    assert store.contains(key_of(1)) is None
    assert store.get(key_of(1)) is None
    assert store.keys() == [key_of(0)]
    assert store.delete(key_of(0))
    assert store.locate_many([key_of(0)]) == {}
    assert _faults(store, "redis")["unavailable"] >= 6


@pytest.mark.redis
def test_redis_killed_mid_request(tmp_path: Path, redis_server: RedisServer) -> None:
    store = TieredKVStore(
        settings(None, memory_bytes=0, redis_url=redis_server.url, redis_timeout_s=5, redis_retry_s=0)
    )
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    blocker = threading.Thread(
        target=lambda: _quietly(lambda: redis_server.client().execute_command("DEBUG", "SLEEP", "10"))
    )
    blocker.start()
    time.sleep(0.2)  # the server is now busy; our GET will wait for it
    killer = threading.Timer(0.3, redis_server.kill)
    killer.start()
    t0 = time.monotonic()
    assert store.get(key_of(0)) is None  # the server dies while our request is in flight
    elapsed = time.monotonic() - t0
    killer.join()
    blocker.join()
    assert 0.2 < elapsed < 3.0  # ended by the kill, not by the 5 s timeout
    assert _faults(store, "redis") == {"unavailable": 1}
    # Redis comes back (empty: no persistence): the store reconnects by itself
    redis_server.start()
    assert store.get(key_of(0)) is None
    assert store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT).stored_in == ("redis",)
    got = store.get(key_of(0))
    assert got is not None and torch.equal(got.k, make_kv(0).k)
    assert store.stats().tier("redis").available  # type: ignore[union-attr]


def _quietly(fn: object) -> None:
    with contextlib.suppress(Exception):  # the blocked client dies with the server, as intended
        fn()  # type: ignore[operator]


@pytest.mark.redis
def test_redis_killed_while_layers_are_read(tmp_path: Path, redis_server: RedisServer) -> None:
    store = TieredKVStore(settings(tmp_path, redis_url=redis_server.url, redis_retry_s=0))
    other = TieredKVStore(settings(tmp_path / "replica", redis_url=redis_server.url))
    other.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    with store.open_layers([key_of(0)]) as src:
        redis_server.kill()  # values were fetched when the source opened
        for layer in range(NUM_LAYERS):
            assert torch.equal(src.layer(layer)[0], make_kv(0).k[layer])
    assert store.locate_many([key_of(0)])[key_of(0)].tiers == ("memory", "disk")  # promoted locally


@pytest.mark.redis
def test_corrupt_redis_value_and_fallback(tmp_path: Path, redis_server: RedisServer) -> None:
    store = TieredKVStore(settings(tmp_path, memory_bytes=0, redis_url=redis_server.url))
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    store.put(key_of(1), make_kv(1), model_fingerprint=FINGERPRINT)
    raw = redis_server.client()
    value = bytearray(raw.get("blendrag:kv:" + key_of(1)))  # type: ignore[arg-type]
    value[-5] ^= 0xFF
    raw.set("blendrag:kv:" + key_of(1), bytes(value))
    # key 0: bad disk copy, good Redis copy -> served from Redis, disk rewritten from it
    _flip_byte_in(store.disk.path_for(key_of(0)), "k.1")  # type: ignore[union-attr]
    got = store.get(key_of(0))
    assert got is not None and torch.equal(got.k, make_kv(0).k)
    assert store.disk.get(key_of(0)) is not None  # type: ignore[union-attr]
    # key 1: bad Redis copy only
    store.disk.delete(key_of(1))  # type: ignore[union-attr]
    assert store.get(key_of(1)) is None
    assert raw.get("blendrag:kv:" + key_of(1)) is None
    assert _faults(store, "disk") == {"checksum": 1}
    assert _faults(store, "redis") == {"checksum": 1}


# A writer killed in the middle of an atomic write (as a killed `blendrag cache convert` is): the real
# write_bytes_atomic, its os.write held after the first bytes until the process is killed.
_KILLED_WRITER = """
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("fsio_atomic", sys.argv[1])
atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic)
real_write = atomic._os_write
def write_then_hang(fd, data):
    written = real_write(fd, bytes(data[:4096]))
    print("writing", flush=True)
    sys.stdin.readline()  # never answered: the parent kills this process here
    return written
atomic._os_write = write_then_hang
atomic.write_bytes_atomic(Path(sys.argv[2]), b"x" * (1 << 20), fsync=False)
"""


def test_a_killed_writers_temp_file_is_removed_at_the_next_scan(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "kv", 1 << 30)
    target = tier.path_for(key_of(0))
    writer = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(Path(fsio.atomic.__file__)), str(target)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        [temp] = [p for p in target.parent.iterdir() if fsio.atomic.is_temp_name(p.name)]
        assert tier.rescan() == 0 and temp.exists()  # its writer still runs: the file is left alone
    finally:
        writer.kill()
        writer.wait(timeout=30)
    assert tier.rescan() == 0
    assert not temp.exists()  # the writer is gone: removed at once, not an hour later
    assert DiskTier(tmp_path / "kv", 1 << 30).keys() == []
