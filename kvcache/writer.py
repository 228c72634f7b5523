"""The one KV writer: compute the chunks the store lacks, store them, and say what could not be kept.

    written = space.ensure(chunks, compute=scheduler_or_engine_precompute)   # kvcache.space.KVSpace
    written.keys         # the key of every chunk, in order (KVSpace.key)
    written.computed     # key -> StoredEntry computed now (with keep_entries=True): what the store would serve
    written.unwritten    # computed keys the store could not keep (see `entry_written`)

Questions (app/services/ask/kv.py, the chunks and a conversation's turns), ingest, `blendrag doctor
--repair`, calibration and bench all write KV through `KVSpace.ensure` (kvcache/space.py: it names the
chunks' keys and finds the missing ones) and the batches and policy here, so a failed put means the same
everywhere: the entry is not in a tier that outlives this process (disk or Redis), or, for a store with
memory only, not stored at all.
It is logged here once per call; each caller then does what its contract asks: a question still serves the
KV it just computed (`TieredKVStore.open_layers(..., computed=written.computed)`), ingest fails the
documents concerned, doctor reports the chunks as still missing, bench stops.

kvcache imports no engine: `compute(chunks) -> list[ChunkKV]` is the caller's (the scheduler's
`precompute_chunks` in the server, `Engine.precompute_chunks` in CLI tools and bench).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from kvcache.format import StoredEntry
from kvcache.store import PutResult, TieredKVStore
from kvcache.types import ChunkKV

logger = logging.getLogger(__name__)

ComputeKV = Callable[[list[list[int]]], list[ChunkKV]]
DEFAULT_BATCH_CHUNKS = 8  # chunks computed per call of `compute` (padded to the longest of the batch)


@dataclass(frozen=True)
class ChunkKVWrite:
    """What `KVSpace.ensure` found and did."""

    keys: list[str]  # one per chunk given, in order (duplicates share a key)
    num_present: int  # unique keys the store already held
    num_computed: int  # unique keys computed now
    unwritten: frozenset[str]  # computed keys the store could not keep (`entry_written` is False)
    computed: dict[str, StoredEntry] = field(default_factory=dict)  # with keep_entries: key -> entry
    num_bytes_written: int = 0  # serialized bytes of the entries written now (the cache's bill)
    num_tokens_written: int = 0  # their tokens


def entry_written(store: TieredKVStore, result: PutResult, *, persist: bool = True) -> bool:
    """The policy for a put: written = held by a tier that outlives the process, when the store has one (and
    the put asked for one: `persist`)."""
    if persist and (store.disk is not None or store.redis is not None):
        return result.persisted
    return bool(result.stored_in)


def write_batches(
    stored: BatchStorer, todo: list[str], ids_by_key: dict[str, list[int]], compute: ComputeKV, batch_chunks: int
) -> None:
    """Compute the chunks of `todo` (keys) `batch_chunks` at a time and hand each batch to `stored`.

    Batch i is encoded and written on a worker thread while batch i+1 is computed: the encode (int4
    quantization) and the write (with its fsync) otherwise add a quarter to a half of the compute time at
    ingest. One batch in flight at most, so progress reports and a cancel (`on_batch` raising) stay in order.
    If `compute` raises, leaving the executor still waits for the batch being stored.
    """
    if not todo:
        return
    step = max(1, batch_chunks)
    with ThreadPoolExecutor(1, thread_name_prefix="kv-store") as worker:
        in_flight: Future[None] | None = None
        for start in range(0, len(todo), step):
            batch = todo[start : start + step]
            kvs = compute([ids_by_key[key] for key in batch])
            if in_flight is not None:
                in_flight.result()  # re-raises what storing the previous batch raised (a cancel)
            in_flight = worker.submit(stored.put_batch, batch, kvs)
        assert in_flight is not None
        in_flight.result()


def report(stored: BatchStorer, keys: list[str], num_unique: int, num_todo: int) -> ChunkKVWrite:
    """What a write did, logged once when something could not be kept."""
    if stored.unwritten:
        logger.warning(
            "KV of %d chunk(s) could not be stored (%s failed; disk full or unwritable?)",
            len(stored.unwritten),
            ", ".join(sorted(stored.failed_tiers)) or "no tier kept it",
        )
    return ChunkKVWrite(
        keys=keys,
        num_present=num_unique - num_todo,
        num_computed=num_todo,
        unwritten=frozenset(stored.unwritten),
        computed=stored.computed,
        num_bytes_written=stored.num_bytes_written,
        num_tokens_written=stored.num_tokens_written,
    )


class BatchStorer:
    """Encodes and puts computed batches, in order, and keeps the tally `KVSpace.ensure` returns."""

    def __init__(
        self,
        store: TieredKVStore,
        model_fingerprint: str,
        keys: list[str],
        num_done: int,
        keep_entries: bool,
        history_keys: Collection[str],
        on_batch: Callable[[int], None] | None,
        persist: bool = True,
    ) -> None:
        self.store, self.model_fingerprint, self.keys = store, model_fingerprint, keys
        self.num_done, self.keep_entries, self.history_keys = num_done, keep_entries, history_keys
        self.persist = persist
        self.on_batch = on_batch
        self.computed: dict[str, StoredEntry] = {}
        self.unwritten: set[str] = set()
        self.failed_tiers: set[str] = set()
        self.num_bytes_written = self.num_tokens_written = 0

    def put_batch(self, batch: list[str], kvs: list[ChunkKV]) -> None:
        for key, kv in zip(batch, kvs, strict=True):
            entry = self.store.encode(key, kv, model_fingerprint=self.model_fingerprint)
            result = self.store.put_entry(entry, history=key in self.history_keys, persist=self.persist)
            if not entry_written(self.store, result, persist=self.persist):
                self.unwritten.add(key)
                self.failed_tiers.update(result.failed)
            else:
                self.num_bytes_written += result.num_bytes
                self.num_tokens_written += kv.num_tokens
            if self.keep_entries:
                self.computed[key] = entry
        batch_keys = set(batch)
        self.num_done += sum(1 for key in self.keys if key in batch_keys)
        if self.on_batch is not None:
            self.on_batch(self.num_done)
