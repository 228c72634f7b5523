"""The device tier (kvcache/device_tier.py) run on the CPU: resident chunks are served without a read, chunks
read through the staging path become resident, eviction keeps what retrieval returns often, and a CPU store has
no device tier of its own."""

from __future__ import annotations

from pathlib import Path

import torch
from kvtest_helpers import FINGERPRINT, NUM_LAYERS, key_of, make_kv, settings

from kvcache.device_tier import DeviceEntry, DeviceTier
from kvcache.store import TieredKVStore

CPU = torch.device("cpu")


def _fill(store: TieredKVStore, seeds: list[int]) -> list[str]:
    keys = []
    for s in seeds:
        store.put(key_of(s), make_kv(s, num_tokens=8 + 3 * s, dtype=torch.float32), model_fingerprint=FINGERPRINT)
        keys.append(key_of(s))
    return keys


def _layers(store: TieredKVStore, keys: list[str]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[str]]:
    with store.open_layers(keys, CPU, torch.float32, convert_on_device=True) as src:
        return [src.layer(layer) for layer in range(NUM_LAYERS)], src.tiers


def test_a_cpu_store_has_no_device_tier(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, storage_dtype="int4"))
    keys = _fill(store, [0, 1])
    _layers(store, keys)
    assert store.device_tier_for(CPU) is None and "device" not in store.tier_names


def test_chunks_read_once_are_served_from_the_device_tier_with_the_same_values(tmp_path: Path) -> None:
    tier = DeviceTier(1 << 30, CPU)
    store = TieredKVStore(settings(tmp_path, storage_dtype="int4"), device_tier=tier)
    keys = _fill(store, [0, 1, 2])
    first, tiers = _layers(store, keys)
    assert tiers == ["memory"] * 3 and sorted(tier.keys()) == sorted(keys)
    second, tiers = _layers(store, keys)
    assert tiers == ["device"] * 3
    for (k0, v0), (k1, v1) in zip(first, second, strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
    # a prompt mixing resident and stored chunks, one of them twice, keeps the prompt's order
    extra = _fill(store, [3])
    prompt = [keys[2], extra[0], keys[0], extra[0]]
    mixed, tiers = _layers(store, prompt)
    assert tiers == ["device", "memory", "device", "memory"]
    with store.open_layers(prompt, CPU, torch.float32, convert_on_device=False, convert_in_caller=True) as host:
        for layer, (k, v) in enumerate(mixed):
            ek, ev = host.layer(layer)
            assert torch.equal(k, ek) and torch.equal(v, ev)
    # hits: 3 (second read) + 2 (mixed: the unique resident keys) + 3 (host read: all resident by then);
    # misses: 3 (first read) + 1 (mixed: the new chunk)
    stats = store.stats().tier("device")
    assert stats is not None and (stats.num_entries, stats.num_hits, stats.num_misses) == (4, 8, 4)
    assert store.contains(keys[0]) == "device" and store.locate_many([keys[0]])[keys[0]].tier == "device"
    assert store.delete(keys[0]) and not tier.contains(keys[0])


def _entry(num_tokens: int) -> DeviceEntry:
    from kvcache.format import EntryMeta

    meta = EntryMeta(
        key="x" * 64, model_fingerprint=FINGERPRINT, storage_dtype="fp16", num_layers=1, kv_heads=1,
        num_tokens=num_tokens, head_dim=4, created_at=0.0, checksums={},
    )  # fmt: skip
    return DeviceEntry(meta=meta, k=torch.zeros(1, 1, num_tokens, 4), v=torch.zeros(1, 1, num_tokens, 4))


def test_eviction_keeps_what_retrieval_returns_often() -> None:
    size = _entry(8).nbytes
    tier = DeviceTier(2 * size, CPU)
    hot, warm, cold = key_of(1), key_of(2), key_of(3)
    tier.record_retrieval([hot, hot, hot, warm, warm])
    assert tier.put(hot, _entry(8)) and tier.put(warm, _entry(8))
    tier.record_retrieval([cold])
    assert not tier.put(cold, _entry(8))  # retrieved less often than both held chunks: not admitted
    tier.record_retrieval([cold, cold, cold])  # now more often than warm
    assert tier.put(cold, _entry(8))
    assert sorted(tier.keys()) == sorted([hot, cold]) and tier.stats().num_evictions == 1
    assert not tier.put(key_of(4), _entry(100))  # alone over the budget
    assert tier.stats().num_rejected == 1
