import os
import time
from pathlib import Path

import pytest
import torch
from kvtest_helpers import FINGERPRINT, NUM_LAYERS, key_of, make_kv, settings

from kvcache.errors import KVEntryMissing
from kvcache.store import TieredKVStore
from kvcache.types import InMemoryLayerReader


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fill(store: TieredKVStore, seeds: list[int], storage: str = "fp16", **put_kw: object) -> list[str]:
    keys = []
    for s in seeds:
        key = key_of(s)  # type: ignore[arg-type]
        kv = make_kv(s, num_tokens=8 + s, dtype=torch.float32 if storage == "int8" else torch.float16)
        store.put(key, kv, model_fingerprint=FINGERPRINT, **put_kw)  # type: ignore[arg-type]
        keys.append(key)
    return keys


@pytest.mark.parametrize("where", ["memory", "disk", "mixed"])
def test_layers_are_the_chunks_concatenated_in_prompt_order(tmp_path: Path, where: str) -> None:
    store = TieredKVStore(settings(tmp_path))
    seeds = [3, 1, 2]
    if where == "memory":
        keys = _fill(store, seeds)
    elif where == "disk":
        keys = _fill(store, seeds, cache_in_memory=False)
    else:
        keys = _fill(store, seeds[:1]) + _fill(store, seeds[1:], cache_in_memory=False)
    chunks = [make_kv(s, num_tokens=8 + s) for s in seeds]
    expected = InMemoryLayerReader(chunks)
    with store.open_layers(keys, "cpu", torch.float16) as src:
        assert src.num_layers == NUM_LAYERS and src.num_tokens == 11 + 9 + 10
        assert src.keys == keys
        assert src.tiers == {"memory": ["memory"] * 3, "disk": ["disk"] * 3, "mixed": ["memory", "disk", "disk"]}[where]
        for layer in range(NUM_LAYERS):
            k, v = src.layer(layer)
            ek, ev = expected.layer(layer)
            assert k.shape == (2, 30, 8) and k.dtype == torch.float16
            assert torch.equal(k, ek) and torch.equal(v, ev)


@pytest.mark.parametrize("storage", ["fp16", "bf16", "int8"])
def test_prefetch_gives_identical_tensors(tmp_path: Path, storage: str) -> None:
    store = TieredKVStore(settings(tmp_path, storage_dtype=storage, memory_bytes=0))
    keys = _fill(store, [0, 1, 2, 3], storage)
    results = {}
    for prefetch in (False, True):
        with store.open_layers(keys, "cpu", torch.float32, prefetch=prefetch) as src:
            results[prefetch] = [src.layer(layer) for layer in range(NUM_LAYERS)]
    for (k0, v0), (k1, v1) in zip(results[False], results[True], strict=True):
        assert k0.dtype == torch.float32
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_prefetch_reads_the_next_layer_ahead(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, memory_bytes=0))
    keys = _fill(store, [0, 1])
    with store.open_layers(keys, prefetch=True) as src:
        deadline = time.monotonic() + 5
        while src.loaded_layers != [0] and time.monotonic() < deadline:
            time.sleep(0.001)
        assert src.loaded_layers == [0]  # layer 0 is read as soon as the source opens
        src.layer(0)
        while src.loaded_layers != [0, 1] and time.monotonic() < deadline:
            time.sleep(0.001)
        assert src.loaded_layers == [0, 1]  # layer 1 read while the caller "computes" layer 0
    with store.open_layers(keys, prefetch=False) as src:
        src.layer(0)
        time.sleep(0.05)
        assert src.loaded_layers == [0]


def test_out_of_order_and_repeated_access(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, memory_bytes=0))
    keys = _fill(store, [0, 1])
    chunks = [make_kv(s, num_tokens=8 + s) for s in (0, 1)]
    expected = InMemoryLayerReader(chunks)
    with store.open_layers(keys) as src:
        for layer in (2, 0, 0, 3, 1):
            assert torch.equal(src.layer(layer)[0], expected.layer(layer)[0])
        with pytest.raises(IndexError):
            src.layer(NUM_LAYERS)
    with pytest.raises(RuntimeError):
        src.layer(0)


def test_repeated_chunk_in_one_prompt(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, memory_bytes=0))
    keys = _fill(store, [0, 1])
    with store.open_layers([keys[0], keys[1], keys[0]]) as src:
        k, _ = src.layer(1)
        assert src.num_tokens == 8 + 9 + 8
        assert torch.equal(k[:, :8], k[:, 17:]) and torch.equal(k[:, :8], make_kv(0, num_tokens=8).k[1])


def test_missing_keys_are_reported_up_front(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    keys = _fill(store, [0, 1], cache_in_memory=False)
    absent = [key_of(50), key_of(51)]
    fds = _open_fds()
    with pytest.raises(KVEntryMissing) as info:
        store.open_layers([absent[1], keys[0], absent[0], keys[1], absent[1]])
    assert info.value.keys == (absent[1], absent[0])  # request order, no repeats
    assert _open_fds() == fds  # the readers opened for the present keys were closed
    assert store.stats().num_misses == 2 and store.stats().num_hits == 2
    with pytest.raises(ValueError):
        store.open_layers([])


def test_disk_files_are_opened_once_per_chunk(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, memory_bytes=0))
    keys = _fill(store, [0, 1, 2])
    fds = _open_fds()
    src = store.open_layers(keys, prefetch=False)
    assert _open_fds() == fds + 3
    for layer in range(NUM_LAYERS):
        src.layer(layer)
        assert _open_fds() == fds + 3
    src.close()
    assert _open_fds() == fds


def test_full_read_promotes_disk_chunks_into_memory(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    keys = _fill(store, [0, 1], cache_in_memory=False)
    with store.open_layers(keys[:1]) as src:  # partial read: nothing promoted
        src.layer(0)
    assert store.contains(keys[0]) == "disk"
    with store.open_layers(keys, prefetch=False) as src:
        for layer in range(NUM_LAYERS):
            src.layer(layer)
    assert [store.contains(k) for k in keys] == ["memory", "memory"]
    promoted = store.memory.peek(keys[1])  # type: ignore[union-attr]
    assert promoted is not None and torch.equal(promoted.k, make_kv(1, num_tokens=9).k)
    with store.open_layers(keys) as src:
        assert src.tiers == ["memory", "memory"]


def test_entries_of_different_models_cannot_be_mixed(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, memory_bytes=0))
    store.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    store.put(key_of(1), make_kv(1, num_layers=3), model_fingerprint=FINGERPRINT)
    fds = _open_fds()
    with pytest.raises(ValueError, match="different models"):
        store.open_layers([key_of(0), key_of(1)])
    assert _open_fds() == fds


def test_default_dtype_is_the_stored_one(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, storage_dtype="int8", memory_bytes=0))
    keys = _fill(store, [0], "int8")
    with store.open_layers(keys) as src:
        assert src.layer(0)[0].dtype == torch.float32
    bf = TieredKVStore(settings(tmp_path / "bf", storage_dtype="bf16"))
    bkeys = _fill(bf, [0], "bf16")
    with bf.open_layers(bkeys) as src:
        assert src.layer(0)[0].dtype == torch.bfloat16


@pytest.mark.parametrize("storage", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_device_side_conversion_path_equals_host_path(tmp_path: Path, storage: str, dtype: torch.dtype) -> None:
    # the path taken for a GPU target (stage stored bytes, convert after the copy), run on the CPU
    store = TieredKVStore(settings(tmp_path, storage_dtype=storage))
    keys = _fill(store, [0], storage) + _fill(store, [1, 2], storage, cache_in_memory=False)
    out = {}
    for on_device in (False, True):
        with store.open_layers(keys, "cpu", dtype, prefetch=False, convert_on_device=on_device) as src:
            out[on_device] = [src.layer(layer) for layer in range(NUM_LAYERS)]
    for (k0, v0), (k1, v1) in zip(out[False], out[True], strict=True):
        assert k1.dtype == dtype
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_converting_in_the_caller_equals_converting_on_the_worker(tmp_path: Path, dtype: torch.dtype) -> None:
    # int4 entries (one of them twice, one on disk) are dequantized a whole layer at once in the caller; a
    # store written before a change of storage dtype (int4 beside fp16) takes the entry-by-entry path there.
    int4 = TieredKVStore(settings(tmp_path / "int4", storage_dtype="int4"))
    keys = _fill(int4, [0, 5], "int8") + _fill(int4, [2], "int8", cache_in_memory=False)
    mixed = TieredKVStore(settings(tmp_path / "mixed", storage_dtype="int4"))
    mixed_keys = _fill(mixed, [0], "int8")
    mixed.settings = mixed.settings.model_copy(update={"storage_dtype": "fp16"})
    mixed_keys += _fill(mixed, [3], "fp16")
    for store, prompt in ((int4, [keys[0], keys[1], keys[2], keys[0]]), (mixed, mixed_keys)):
        out = {}
        for in_caller in (False, True):
            for prefetch in (False, True):
                with store.open_layers(prompt, "cpu", dtype, prefetch=prefetch, convert_in_caller=in_caller) as src:
                    out[in_caller, prefetch] = [src.layer(layer) for layer in (0, 1, 3, 2)]
        reference = out[False, False]
        for layers in out.values():
            for (k0, v0), (k1, v1) in zip(reference, layers, strict=True):
                assert k1.dtype == dtype and torch.equal(k0, k1) and torch.equal(v0, v1)


def _tensor_bytes_reachable(root: object, depth: int = 6) -> int:
    """Bytes of the tensors an object still refers to (through attributes, dicts, lists, tuples)."""
    seen: set[int] = set()
    total = 0
    level = [root]
    for _ in range(depth):
        nxt: list[object] = []
        for obj in level:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, torch.Tensor):
                total += obj.untyped_storage().nbytes()
            elif isinstance(obj, dict):
                nxt.extend(obj.values())
            elif isinstance(obj, list | tuple | set):
                nxt.extend(obj)
            elif hasattr(obj, "__dict__"):
                nxt.extend(vars(obj).values())
            elif hasattr(obj, "__slots__"):
                nxt.extend(getattr(obj, s, None) for s in obj.__slots__)
        level = nxt
    return total


def test_closed_source_holds_no_layers_of_the_chunks_it_read(tmp_path: Path) -> None:
    """A closed source may live on (in reference cycles, until a garbage collection): it must not keep
    the whole KV it collected for promotion (the memory tier here is too small to take it)."""
    store = TieredKVStore(settings(tmp_path, memory_bytes=1024))
    keys = _fill(store, [0, 1], cache_in_memory=False)
    src = store.open_layers(keys, prefetch=False)
    for layer in range(NUM_LAYERS):
        src.layer(layer)
    assert _tensor_bytes_reachable(src) > 0  # while open it holds the layers it read
    src.close()
    assert _tensor_bytes_reachable(src) == 0
