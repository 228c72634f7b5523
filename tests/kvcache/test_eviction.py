import contextlib
import threading
from collections import namedtuple
from pathlib import Path

import pytest
from kvtest_helpers import FINGERPRINT, key_of, make_kv, settings

import kvcache.disk_tier as disk_tier_module
from kvcache.disk_tier import COUNTS_FILE, DiskTier
from kvcache.errors import KVEntryMissing
from kvcache.eviction import FrequencyPolicy, LRUPolicy
from kvcache.format import encode_entry, serialize_entry
from kvcache.store import TieredKVStore


def _data(i: int, num_tokens: int = 16) -> bytes:
    entry = encode_entry(
        make_kv(i, num_tokens=num_tokens), key=key_of(i), model_fingerprint=FINGERPRINT, storage_dtype="fp16"
    )
    return serialize_entry(entry)


SIZE = len(_data(0))


def test_frequency_policy_order_on_a_made_up_sequence() -> None:
    p = FrequencyPolicy(half_life=1e9)  # no decay to speak of: counts, then age
    for key in "abc":
        p.admit(key)
    assert p.order() == ["a", "b", "c"]  # all count 1: the oldest goes first
    for key in "aab":
        p.record_retrieval(key)
    assert p.order() == ["c", "b", "a"]  # c 1, b 2, a 3
    assert [round(p.count(k), 6) for k in "abc"] == [3.0, 2.0, 1.0]
    assert p.victim() == "c" and p.victim(exclude="c") == "b"
    p.forget("c")
    assert p.order() == ["b", "a"] and round(p.count("c"), 6) == 1.0  # history kept for keys not held
    for _ in range(3):
        p.record_retrieval("c")  # asked for while not held: three misses
    p.admit("c")  # recomputed and stored again: it comes back with its count
    assert p.order() == ["b", "a", "c"] and round(p.count("c"), 6) == 4.0
    p.admit("d")  # a new chunk, never asked for: count 1, the next to go
    assert p.order() == ["d", "b", "a", "c"] and p.victim() == "d"


def test_frequency_counts_decay_with_the_half_life() -> None:
    p = FrequencyPolicy(half_life=2)
    p.admit("old")  # count 1 at clock 0
    for _ in range(6):
        p.record_retrieval("new")  # not held yet: history; each retrieval ticks the clock
    assert round(p.count("old"), 6) == 0.125  # three half-lives later
    assert round(p.count("new"), 6) == round(sum(2 ** (-j / 2) for j in range(6)), 6)
    p.admit("new")
    assert p.order() == ["old", "new"]


def test_lru_policy_order() -> None:
    p = LRUPolicy()
    for key in "abc":
        p.admit(key)
    p.record_retrieval("a")
    p.record_retrieval("zz")  # not held: ignored
    assert p.order() == ["b", "c", "a"] and p.victim() == "b" and p.victim(exclude="b") == "c"


@pytest.mark.parametrize(("policy", "survivor_expected"), [("frequency", True), ("lru", False)])
def test_a_chunk_retrieved_often_stays(tmp_path: Path, policy: str, survivor_expected: bool) -> None:
    store = TieredKVStore(settings(tmp_path, memory_bytes=0, disk_bytes=3 * SIZE, eviction=policy))
    hot = key_of(0)
    store.put(hot, make_kv(0), model_fingerprint=FINGERPRINT)
    for _ in range(3):
        store.open_layers([hot]).close()
    for i in range(1, 6):  # five one-off chunks, each retrieved once, after the hot one
        store.put(key_of(i), make_kv(i), model_fingerprint=FINGERPRINT)
        store.open_layers([key_of(i)]).close()
    assert (store.contains(hot) == "disk") is survivor_expected
    assert store.disk is not None and store.disk.stats().num_bytes <= 3 * SIZE
    # frequency: the one-offs (count 2: stored, retrieved once) go oldest first, the hot one (4) stays last
    expected = [key_of(4), key_of(5), hot] if survivor_expected else [key_of(3), key_of(4), key_of(5)]
    assert store.disk.keys() == expected


def test_an_evicted_chunk_is_a_miss_and_is_stored_again(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, memory_bytes=0, disk_bytes=2 * SIZE))
    keys = [key_of(i) for i in range(3)]
    for i, key in enumerate(keys):
        store.put(key, make_kv(i), model_fingerprint=FINGERPRINT)
    with pytest.raises(KVEntryMissing) as info:
        store.open_layers(keys)
    assert info.value.keys == (keys[0],)  # the evicted one, nothing else: the caller recomputes it
    assert store.put(keys[0], make_kv(0), model_fingerprint=FINGERPRINT).stored_in == ("disk",)
    assert store.contains(keys[0]) == "disk"


def test_the_budget_is_never_exceeded_while_writers_fill_it(tmp_path: Path) -> None:
    budget = 5 * SIZE + SIZE // 2
    tier = DiskTier(tmp_path, budget, fsync=False, policy=FrequencyPolicy())
    sizes = [16, 8, 24, 4, 32, 12]
    blobs = {i: _data(i, num_tokens=sizes[i % len(sizes)]) for i in range(48)}
    stop = threading.Event()
    peak = [0]

    def on_disk() -> int:
        total = 0
        for path in tmp_path.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # removed while we look
                total += path.stat().st_size if path.is_file() else 0
        return total

    def watch() -> None:
        # A walk of the directories is no snapshot: a file counted in one directory can be evicted and a new
        # one written in the next before the walk gets there, and the sum then exceeds what was ever on disk.
        # The tier evicts and reserves under its lock (the write of a reserved file comes after), so a walk
        # under that lock sees at most the bytes the tier has accounted for.
        while not stop.is_set():
            with tier._lock:
                peak[0] = max(peak[0], on_disk())
            stop.wait(0.0005)  # let the writers take the lock between two walks

    def write(worker: int) -> None:
        for i in range(worker, 48, 4):
            assert tier.put_bytes(key_of(i), blobs[i])
            assert tier.stats().num_bytes <= budget
            tier.record_retrieval([key_of(i - 4)] if i >= 4 else [])

    watcher = threading.Thread(target=watch)
    watcher.start()
    writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    watcher.join()
    st = tier.stats()
    assert st.num_bytes == on_disk() <= budget
    assert peak[0] <= budget
    assert st.num_evictions == 48 - st.num_entries
    # Nothing evicted beyond need, whatever the writers' interleaving: every eviction stopped as soon as the
    # entry being written fitted, so the tier ends less than one largest entry short of its budget.
    assert st.num_bytes > budget - max(len(blob) for blob in blobs.values())


def test_default_budget_is_a_share_of_the_free_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "kv"
    DiskTier(root, 10 * SIZE).put_bytes(key_of(0), _data(0))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(disk_tier_module.shutil, "disk_usage", lambda _: usage(10**12, 0, 400 * 2**20))
    tier = DiskTier(root, None, free_share=0.25)
    assert tier.budget_bytes == SIZE + 100 * 2**20  # what it holds + a quarter of 400 MiB free
    store = TieredKVStore(settings(tmp_path, memory_bytes=0, disk_free_share=0.5))
    assert store.disk is not None and store.disk.budget_bytes == SIZE + 200 * 2**20


def test_counts_survive_a_restart(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, memory_bytes=0, disk_bytes=100 * SIZE))
    for i in range(3):
        store.put(key_of(i), make_kv(i), model_fingerprint=FINGERPRINT)
    for _ in range(4):
        store.open_layers([key_of(0)]).close()
    store.close()
    assert (tmp_path / "kv" / COUNTS_FILE).is_file()
    again = TieredKVStore(settings(tmp_path, memory_bytes=0, disk_bytes=100 * SIZE))
    assert again.disk is not None
    assert again.disk.keys()[-1] == key_of(0)  # the most retrieved: the last to go
    (tmp_path / "kv" / COUNTS_FILE).write_text("{not json")
    assert TieredKVStore(settings(tmp_path, memory_bytes=0, disk_bytes=100 * SIZE)).contains(key_of(0)) == "disk"
