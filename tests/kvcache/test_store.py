import threading
from pathlib import Path

import pytest
import torch
from kvtest_helpers import ENTRY_TENSOR_BYTES, FINGERPRINT, PREFIX_IDS, key_of, make_kv, settings

from kvcache.keys import chunk_key
from kvcache.store import TieredKVStore


def test_put_get_round_trip_all_tiers(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    kv = make_kv(0)
    result = store.put(key_of(0), kv, model_fingerprint=FINGERPRINT)
    assert result.stored_in == ("memory", "disk") and result.failed == () and result.persisted
    got = store.get(key_of(0))
    assert got is not None and torch.equal(got.k, kv.k) and torch.equal(got.v, kv.v)
    assert got.k.dtype == torch.float16
    as_f32 = store.get(key_of(0), dtype=torch.float32)
    assert as_f32 is not None and torch.equal(as_f32.k, kv.k.float())
    assert store.get(key_of(1)) is None
    st = store.stats()
    assert (st.num_hits, st.num_misses) == (2, 1)
    assert [t.name for t in st.tiers] == ["memory", "disk"]
    mem, disk = st.tier("memory"), st.tier("disk")
    assert mem is not None and disk is not None
    assert (mem.num_entries, mem.num_bytes, mem.num_hits, mem.num_misses) == (1, ENTRY_TENSOR_BYTES, 2, 1)
    assert (disk.num_entries, disk.num_hits, disk.num_misses) == (1, 0, 1)
    assert disk.num_bytes == result.num_bytes
    assert st.to_dict()["num_hits"] == 2


def test_key_for_uses_the_store_dtype(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, storage_dtype="bf16"))
    assert store.key_for(FINGERPRINT, PREFIX_IDS, [1]) == chunk_key(FINGERPRINT, PREFIX_IDS, [1])


def test_contains_names_the_highest_tier_and_disk_hit_is_promoted(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT, cache_in_memory=False)
    assert store.contains(key_of(0)) == "disk"
    assert store.contains(key_of(1)) is None
    assert store.get(key_of(0)) is not None
    assert store.contains(key_of(0)) == "memory"
    # a fresh process (empty memory) reads it from disk again
    again = TieredKVStore(settings(tmp_path))
    assert again.contains(key_of(0)) == "disk"


def test_no_promotion_when_disabled(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, promote_on_load=False))
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT, cache_in_memory=False)
    assert store.get(key_of(0)) is not None
    assert store.contains(key_of(0)) == "disk"


def test_memory_only_and_disk_only_stores(tmp_path: Path) -> None:
    mem_only = TieredKVStore(settings(None))
    assert mem_only.tier_names == ("memory",)
    res = mem_only.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    assert res.stored_in == ("memory",) and not res.persisted and res.num_bytes == ENTRY_TENSOR_BYTES
    disk_only = TieredKVStore(settings(tmp_path, memory_bytes=0))
    assert disk_only.tier_names == ("disk",)
    disk_only.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    got = disk_only.get(key_of(0))
    assert got is not None and torch.equal(got.v, make_kv(0).v)


def test_delete_and_keys(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    for i in range(3):
        store.put(key_of(i), make_kv(i), model_fingerprint=FINGERPRINT, cache_in_memory=i != 2)
    assert store.keys() == sorted(key_of(i) for i in range(3))
    assert store.delete(key_of(0)) and not store.delete(key_of(0))
    assert store.contains(key_of(0)) is None
    assert store.keys() == sorted([key_of(1), key_of(2)])


def test_locate_many(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    r0 = store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    r1 = store.put(key_of(1), make_kv(1), model_fingerprint=FINGERPRINT, cache_in_memory=False)
    loc = store.locate_many([key_of(0), key_of(1), key_of(2), key_of(0)])
    assert set(loc) == {key_of(0), key_of(1)}
    assert loc[key_of(0)].tiers == ("memory", "disk") and loc[key_of(0)].tier == "memory"
    assert loc[key_of(0)].num_bytes_by_tier == {"memory": ENTRY_TENSOR_BYTES, "disk": r0.num_bytes}
    assert loc[key_of(1)].num_bytes_by_tier == {"disk": r1.num_bytes}


def test_int8_store(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, storage_dtype="int8", memory_bytes=0))
    kv = make_kv(3, dtype=torch.float32)
    key = key_of(3)
    store.put(key, kv, model_fingerprint=FINGERPRINT)
    got = store.get(key)
    assert got is not None and got.k.dtype == torch.float32
    step = kv.k.abs().amax(dim=-1, keepdim=True) / 127
    assert bool(((got.k - kv.k).abs() <= step / 2 * (1 + 1e-5) + 1e-7).all())


def test_put_rejects_malformed_input(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    kv = make_kv(0)
    with pytest.raises(ValueError):
        store.put("nope", kv, model_fingerprint=FINGERPRINT)
    with pytest.raises(ValueError):
        store.put(key_of(0), kv, model_fingerprint="")
    assert store.keys() == []


def test_many_threads_share_one_store(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, memory_bytes=4 * ENTRY_TENSOR_BYTES))
    kvs = [make_kv(i) for i in range(12)]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for n in range(30):
                i = (n + t) % 12
                store.put(key_of(i), kvs[i], model_fingerprint=FINGERPRINT)
                j = (n * 5 + t) % 12
                got = store.get(key_of(j))
                if got is not None:
                    assert torch.equal(got.k, kvs[j].k)
                with store.open_layers([key_of(i)]) as src:
                    assert torch.equal(src.layer(1)[1], kvs[i].v[1])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    st = store.stats()
    assert st.tier("memory").num_entries == 4  # type: ignore[union-attr]
    assert st.tier("disk").num_entries == 12  # type: ignore[union-attr]
    assert st.num_faults == 0


def test_store_never_aliases_caller_tensors(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    kv = make_kv(0)
    original = make_kv(0)
    store.put(key_of(0), kv, model_fingerprint=FINGERPRINT)
    kv.k.zero_()  # the engine reuses its buffer after put()
    got = store.get(key_of(0))
    assert got is not None and torch.equal(got.k, original.k)
    got.k.mul_(2)  # e.g. RoPE applied in place to the returned K
    again = store.get(key_of(0))
    assert again is not None and torch.equal(again.k, original.k)
    with store.open_layers([key_of(0)]) as src:
        k, _ = src.layer(0)
        k.zero_()
    with store.open_layers([key_of(0)]) as src:
        assert torch.equal(src.layer(0)[0], original.k[0])


def test_history_entries_have_their_own_memory_budget(tmp_path: Path) -> None:
    # Room for two entries in each memory tier: turns never evict chunks, chunks never evict turns.
    store = TieredKVStore(
        settings(tmp_path, memory_bytes=2 * ENTRY_TENSOR_BYTES, history_memory_bytes=2 * ENTRY_TENSOR_BYTES)
    )
    assert store.tier_names == ("memory", "disk")  # no history tier until a turn is stored
    for i in range(2):
        assert store.put(key_of(i), make_kv(i), model_fingerprint=FINGERPRINT).stored_in == ("memory", "disk")
    for i in range(2, 5):
        result = store.put(key_of(i), make_kv(i), model_fingerprint=FINGERPRINT, history=True)
        assert result.stored_in == ("history_memory", "disk")
    assert store.tier_names == ("memory", "history_memory", "disk")
    assert store.memory.keys() == [key_of(0), key_of(1)]
    assert store.history_memory.keys() == [key_of(3), key_of(4)]  # the oldest turn went to disk only
    assert store.contains(key_of(4)) == "history_memory" and store.contains(key_of(2)) == "disk"
    # A turn read back from disk is promoted into the history tier, not the chunks'.
    with store.open_layers([key_of(0), key_of(2)], history_keys=[key_of(2)]) as source:
        for layer in range(source.num_layers):
            source.layer(layer)
    assert store.memory.keys() == [key_of(1), key_of(0)]  # key 0 was just read: most recently used
    assert store.history_memory.keys() == [key_of(4), key_of(2)]
    got = store.get(key_of(2))
    assert got is not None and torch.equal(got.k, make_kv(2).k)
    assert [t.name for t in store.stats().tiers] == ["memory", "history_memory", "disk"]
    assert store.delete(key_of(4)) and store.contains(key_of(4)) is None
