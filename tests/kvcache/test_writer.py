"""The one KV writer: computes only what is missing, stores it, and one policy for a put that failed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kvtest_helpers import FINGERPRINT, PREFIX_IDS, make_kv, settings

from kvcache.keys import chunk_key
from kvcache.space import KVSpace
from kvcache.store import TieredKVStore
from kvcache.types import ChunkKV
from kvcache.writer import ComputeKV

CHUNKS = [[100 + i, 7, 8] for i in range(5)]


class Compute:
    """A stand-in for the engine's chunk precompute: deterministic KV per chunk, every call recorded."""

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []

    def __call__(self, chunks: list[list[int]]) -> list[ChunkKV]:
        self.calls.append(chunks)
        return [make_kv(ids[0]) for ids in chunks]


def _ensure(store: TieredKVStore, chunks: list[list[int]], compute: ComputeKV, **kwargs):
    return KVSpace(store, FINGERPRINT, PREFIX_IDS).ensure(chunks, compute=compute, **kwargs)


def test_only_missing_chunks_are_computed_in_batches_and_stored(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    first = Compute()
    _ensure(store, CHUNKS[:2], first)
    compute = Compute()
    progress: list[int] = []
    written = _ensure(store, CHUNKS + [CHUNKS[3]], compute, batch_chunks=2, on_batch=progress.append)
    assert written.keys == [chunk_key(FINGERPRINT, PREFIX_IDS, ids) for ids in CHUNKS + [CHUNKS[3]]]
    assert (written.num_present, written.num_computed, written.unwritten) == (2, 3, frozenset())
    assert compute.calls == [[CHUNKS[2], CHUNKS[3]], [CHUNKS[4]]]  # the duplicate is computed once
    assert progress == [5, 6]  # 2 present + 3 after the first batch (the duplicate too), then all 6
    assert written.computed == {}  # not kept unless asked
    for key in written.keys:
        assert store.contains(key) == "memory"


def test_known_missing_keys_skip_the_lookup(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    compute = Compute()
    missing = chunk_key(FINGERPRINT, PREFIX_IDS, CHUNKS[1])
    written = _ensure(store, CHUNKS[:3], compute, missing_keys=[missing])
    assert compute.calls == [[CHUNKS[1]]]
    assert (written.num_present, written.num_computed) == (2, 1)


def test_kept_entries_are_what_the_store_serves(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, storage_dtype="int8"))
    written = _ensure(store, CHUNKS[:1], Compute(), keep_entries=True)
    (key,) = written.keys
    served = store.get(key, dtype=torch.float32)
    kept = written.computed[key].to_chunk_kv(torch.float32, "cpu")
    assert served is not None and torch.equal(kept.k, served.k) and torch.equal(kept.v, served.v)


@pytest.mark.parametrize(
    ("overrides", "with_dir", "written_ok"),
    [
        ({"memory_bytes": 0, "disk_bytes": 1}, True, False),  # the disk refuses every entry (over budget)
        ({"disk_bytes": 1}, True, False),  # memory holds it, but no tier that outlives the process does
        ({}, True, True),
        ({"memory_bytes": 1}, False, False),  # memory only, and it refuses
        ({}, False, True),  # memory only: stored is all it can be
    ],
)
def test_one_policy_for_a_failed_put(tmp_path: Path, overrides: dict, with_dir: bool, written_ok: bool) -> None:
    store = TieredKVStore(settings(tmp_path if with_dir else None, **overrides))
    written = _ensure(store, CHUNKS[:2], Compute(), keep_entries=True)
    assert written.unwritten == (frozenset() if written_ok else frozenset(written.keys))
    assert set(written.computed) == set(written.keys)  # the caller can serve them either way


def test_open_layers_serves_computed_entries_the_store_did_not_keep(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, memory_bytes=0, disk_bytes=1))
    written = _ensure(store, CHUNKS[:2], Compute(), keep_entries=True)
    assert store.contains(written.keys[0]) is None
    with store.open_layers(written.keys, dtype=torch.float32, computed=written.computed) as source:
        k, v = source.layer(1)
    expected = [make_kv(ids[0]) for ids in CHUNKS[:2]]
    torch.testing.assert_close(k, torch.cat([e.k[1] for e in expected], dim=1).float())
    torch.testing.assert_close(v, torch.cat([e.v[1] for e in expected], dim=1).float())


def test_a_batch_is_stored_while_the_next_one_is_computed(tmp_path: Path) -> None:
    """Encoding and writing batch 1 overlaps computing batch 2: here the put of batch 1 waits until batch 2's
    compute has begun, which a writer that stores before it computes again would never let happen."""
    import threading

    store = TieredKVStore(settings(tmp_path))
    second_compute_started = threading.Event()
    overlapped: list[bool] = []
    compute = Compute()

    def compute_and_signal(chunks: list[list[int]]) -> list[ChunkKV]:
        if compute.calls:
            second_compute_started.set()
        return compute(chunks)

    real_put = store.put_entry

    def put_entry(entry, **kwargs):
        if not overlapped:
            overlapped.append(second_compute_started.wait(30))
            overlapped.append(threading.current_thread() is not threading.main_thread())
        return real_put(entry, **kwargs)

    store.put_entry = put_entry  # type: ignore[method-assign]
    progress: list[int] = []
    written = _ensure(store, CHUNKS[:4], compute_and_signal, batch_chunks=2, on_batch=progress.append)
    assert overlapped == [True, True]
    assert compute.calls == [CHUNKS[:2], CHUNKS[2:4]] and progress == [2, 4]
    assert written.num_computed == 4 and written.unwritten == frozenset()
    assert [store.contains(key) for key in written.keys] == ["memory"] * 4


def test_a_cancel_from_on_batch_stops_the_writer(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path))
    compute = Compute()

    def cancel_after_first(num_done: int) -> None:
        raise RuntimeError(f"cancelled at {num_done}")

    with pytest.raises(RuntimeError, match="cancelled at 2"):
        _ensure(store, CHUNKS, compute, batch_chunks=2, on_batch=cancel_after_first)
    # The batch after the first was already being computed when its cancel surfaced; nothing later was.
    assert compute.calls == [CHUNKS[:2], CHUNKS[2:4]]


def test_the_writer_imports_no_engine_and_no_app() -> None:
    import ast

    import kvcache.writer

    tree = ast.parse(Path(kvcache.writer.__file__).read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    stdlib = {"__future__", "logging", "collections", "concurrent", "dataclasses"}
    assert {m.split(".")[0] for m in modules} <= stdlib | {"kvcache"}
