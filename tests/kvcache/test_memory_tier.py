import threading

import pytest
from kvtest_helpers import ENTRY_TENSOR_BYTES, FINGERPRINT, key_of, make_kv

from kvcache.format import StoredEntry, encode_entry
from kvcache.memory_tier import MemoryTier


def _entry(i: int, num_tokens: int = 16) -> StoredEntry:
    return encode_entry(
        make_kv(i, num_tokens=num_tokens), key=key_of(i), model_fingerprint=FINGERPRINT, storage_dtype="fp16"
    )


def test_lru_order_is_exact() -> None:
    tier = MemoryTier(3 * ENTRY_TENSOR_BYTES)
    a, b, c, d = (key_of(i) for i in range(4))
    for i in range(3):
        assert tier.put(key_of(i), _entry(i))
    assert tier.keys() == [a, b, c]
    assert tier.get(a) is not None  # a becomes most recently used
    assert tier.keys() == [b, c, a]
    assert tier.peek(b) is not None  # peek does not reorder
    assert tier.put(d, _entry(3))
    assert tier.keys() == [c, a, d]  # b, the least recently used, went
    assert tier.get(b) is None
    st = tier.stats()
    assert (st.num_entries, st.num_bytes, st.num_hits, st.num_misses, st.num_evictions) == (
        3,
        3 * ENTRY_TENSOR_BYTES,
        1,
        1,
        1,
    )


def test_byte_budget_evicts_as_many_as_needed() -> None:
    tier = MemoryTier(4 * ENTRY_TENSOR_BYTES)
    for i in range(4):
        tier.put(key_of(i), _entry(i))
    big = _entry(10, num_tokens=48)  # three entries' worth
    assert big.nbytes == 3 * ENTRY_TENSOR_BYTES
    assert tier.put(big.key, big)
    assert tier.keys() == [key_of(3), big.key]
    assert tier.stats().num_evictions == 3
    assert tier.stats().num_bytes == 4 * ENTRY_TENSOR_BYTES


def test_entry_over_budget_is_rejected_and_evicts_nothing() -> None:
    tier = MemoryTier(2 * ENTRY_TENSOR_BYTES)
    tier.put(key_of(0), _entry(0))
    big = _entry(10, num_tokens=48)
    assert not tier.put(big.key, big)
    assert tier.keys() == [key_of(0)]
    assert tier.stats().num_rejected == 1 and tier.stats().num_evictions == 0


def test_reput_and_delete_keep_bytes_exact() -> None:
    tier = MemoryTier(10 * ENTRY_TENSOR_BYTES)
    tier.put(key_of(0), _entry(0))
    tier.put(key_of(0), _entry(0))
    assert tier.stats().num_bytes == ENTRY_TENSOR_BYTES and tier.stats().num_entries == 1
    assert tier.nbytes_of(key_of(0)) == ENTRY_TENSOR_BYTES
    assert tier.delete(key_of(0)) and not tier.delete(key_of(0))
    assert tier.stats().num_bytes == 0 and not tier.contains(key_of(0))


def test_put_checks_key_matches_entry() -> None:
    tier = MemoryTier(10 * ENTRY_TENSOR_BYTES)
    with pytest.raises(ValueError):
        tier.put(key_of(1), _entry(0))
    with pytest.raises(ValueError):
        tier.put("not-a-key", _entry(0))
    with pytest.raises(ValueError):
        MemoryTier(0)


def test_concurrent_use_keeps_accounting_consistent() -> None:
    tier = MemoryTier(5 * ENTRY_TENSOR_BYTES)
    entries = [_entry(i) for i in range(20)]

    def work(offset: int) -> None:
        for n in range(200):
            e = entries[(n + offset) % 20]
            tier.put(e.key, e)
            tier.get(entries[(n * 7 + offset) % 20].key)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st = tier.stats()
    assert st.num_entries == 5 and st.num_bytes == 5 * ENTRY_TENSOR_BYTES
    assert st.num_hits + st.num_misses == 8 * 200
