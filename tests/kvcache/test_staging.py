"""The device path of the layer loader (kvcache/staging.py), run on the CPU: every storage dtype comes out
bit for bit as the host conversion makes it, and the staging buffers are allocated once and reused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kvtest_helpers import FINGERPRINT, NUM_LAYERS, key_of, make_kv, settings

from kvcache.staging import StagingPool
from kvcache.store import TieredKVStore


def _fill(store: TieredKVStore, seeds: list[int], storage: str) -> list[str]:
    keys = []
    for s in seeds:
        key = key_of(s)
        kv = make_kv(s, num_tokens=8 + 3 * s, dtype=torch.float32 if storage in ("int8", "int4") else torch.float16)
        store.put(key, kv, model_fingerprint=FINGERPRINT, cache_in_memory=s % 2 == 0)  # memory and disk
        keys.append(key)
    return keys


@pytest.mark.parametrize("storage", ["fp16", "bf16", "int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prefetch", [False, True])
def test_staged_layers_equal_the_host_conversion(
    tmp_path: Path, storage: str, dtype: torch.dtype, prefetch: bool
) -> None:
    store = TieredKVStore(settings(tmp_path, storage_dtype=storage))
    keys = _fill(store, [0, 1, 2, 3, 4], storage)
    prompt = [keys[3], keys[0], keys[4], keys[1]]
    with store.open_layers(prompt, "cpu", dtype, convert_on_device=False, convert_in_caller=True) as host:
        expected = [host.layer(layer) for layer in range(NUM_LAYERS)]
    with store.open_layers(prompt, "cpu", dtype, convert_on_device=True, prefetch=prefetch) as staged:
        got = [staged.layer(layer) for layer in range(NUM_LAYERS)]
    for (ek, ev), (k, v) in zip(expected, got, strict=True):
        assert k.dtype == dtype and k.shape == ek.shape
        assert torch.equal(k, ek) and torch.equal(v, ev)


def test_staging_buffers_are_allocated_once_and_reused(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, storage_dtype="int4"))
    keys = _fill(store, [0, 1, 2, 3], "int4")
    pool = store.staging_pool(torch.device("cpu"))
    for _ in range(3):  # three requests, every layer each
        with store.open_layers(keys, "cpu", torch.float32, convert_on_device=True) as src:
            for layer in range(NUM_LAYERS):
                src.layer(layer)
    assert pool.num_allocated == 2  # double-buffered: two buffers for every layer of every request
    assert pool.num_free == 2
    assert store.staging_pool(torch.device("cpu")) is pool


def test_pool_hands_out_a_buffer_only_once_its_copy_is_done() -> None:
    class Pending:
        done = False

        def query(self) -> bool:
            return self.done

    pool = StagingPool(pin=False)
    first = pool.acquire(100)
    event = Pending()
    pool.release(first, event)
    second = pool.acquire(100)  # the first buffer's copy is in flight: a new one
    assert second.data_ptr() != first.data_ptr() and pool.num_allocated == 2
    event.done = True
    assert pool.acquire(100).data_ptr() == first.data_ptr()
    assert pool.acquire(10 << 20).numel() >= 10 << 20  # too small buffers are not handed out
    assert pool.num_allocated == 3
