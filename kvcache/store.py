"""`TieredKVStore`: the chunk-KV store the app, the engine's callers and bench use.

Tiers, in lookup order: memory (LRU, `memory_bytes`; absent when 0) -> history memory (conversation
turns' entries, `put(..., history=True)`, LRU within its own `history_memory_bytes`, so a long chat never
evicts the chunks' entries and the other way round) -> disk (`dir`, `disk_bytes`, evicting by `eviction`;
absent when `dir` is None) -> Redis (`redis_url`; absent when None). Every key a read asks for is recorded
as a retrieval by the disk tier's eviction policy, whichever tier serves it (or none). New entries are
written in `storage_dtype`; entries of any other dtype are read as they are.
Writes go to every tier; a read that hits a lower tier promotes the entry into the tiers above it.
Every storage fault (corrupt or truncated entry, file deleted behind our back, full disk, Redis
down) is survived, counted in `stats()`, logged, and turns into "not stored" / "not found", i.e.
"recompute this chunk", never an exception from `put`/`get`/`contains` and never a wrong tensor.

Public API (all methods thread-safe):

    store = TieredKVStore(settings: KVCacheSettings)
    store.key_for(model_fingerprint: str, prefix_token_ids, chunk_token_ids) -> str
    store.put(key: str, kv: ChunkKV, *, model_fingerprint: str, overwrite: bool = False,
              cache_in_memory: bool = True, history: bool = False) -> PutResult
    store.get(key: str, *, device="cpu", dtype: torch.dtype | None = None) -> ChunkKV | None
    store.get_entry(key: str) -> StoredEntry | None
    store.contains(key: str) -> str | None              # "memory" | "disk" | "redis" | None
    store.locate_many(keys: Sequence[str]) -> dict[str, EntryLocation]   # present keys only
    store.delete(key: str) -> bool                       # from every tier
    store.keys() -> list[str]                            # sorted union over the tiers
    store.open_layers(keys: list[str], device="cpu", dtype=None, *, prefetch: bool | None = None,
                      convert_on_device: bool | None = None, convert_in_caller: bool | None = None,
                      computed: Mapping[str, StoredEntry] | None = None, history_keys: Collection[str] = ())
        -> StoreLayerReader                              # raises KVEntryMissing(keys) up front
    store.stats() -> StoreStats
    store.close()

`dtype=None` on reads means the stored dtype (float32 for int8 entries). `put` raises ValueError only
for a malformed key or ChunkKV (wrong rank, empty, non-finite after conversion to the storage dtype).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from kvcache.config import KVCacheSettings, StorageDType
from kvcache.device_tier import DeviceTier, auto_budget
from kvcache.disk_tier import DiskTier
from kvcache.errors import KVEntryCorrupt, KVEntryMissing
from kvcache.eviction import make_policy
from kvcache.format import (
    Int4Params,
    LayerData,
    StoredEntry,
    default_compute_dtype,
    encode_entry,
    serialize_entry,
)
from kvcache.keys import check_key, chunk_key
from kvcache.loader import ResolvedChunk, StoreLayerReader
from kvcache.memory_tier import MemoryTier
from kvcache.reader import BytesEntryReader, deserialize_entry
from kvcache.redis_tier import RedisTier
from kvcache.staging import StagingPool
from kvcache.stats import StoreStats
from kvcache.types import ChunkKV

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PutResult:
    key: str
    stored_in: tuple[str, ...]  # tiers holding the entry after the put (lookup order)
    failed: tuple[str, ...]  # tiers that could not store it (fault or over budget; see stats())
    num_bytes: int  # serialized size

    @property
    def persisted(self) -> bool:
        """Stored in a tier that outlives this process (disk or Redis)."""
        return any(t in ("disk", "redis") for t in self.stored_in)


@dataclass(frozen=True)
class EntryLocation:
    key: str
    tiers: tuple[str, ...]  # every tier holding the entry, lookup order; tiers[0] serves reads
    num_bytes_by_tier: dict[str, int]  # memory: tensor bytes; disk / redis: serialized bytes

    @property
    def tier(self) -> str:
        return self.tiers[0]


class TieredKVStore:
    def __init__(self, settings: KVCacheSettings, device_tier: DeviceTier | None = None) -> None:
        self.settings = settings
        # Made for the engine's accelerator at its first read there (`device_tier_for`); given: tests on a CPU.
        self.device_tier: DeviceTier | None = device_tier
        self.memory: MemoryTier | None = MemoryTier(settings.memory_bytes) if settings.memory_bytes else None
        # Made at the first turn stored (a server that never holds a conversation shows no such tier).
        self.history_memory: MemoryTier | None = None
        self.disk: DiskTier | None = None
        if settings.dir:
            self.disk = DiskTier(
                settings.dir,
                settings.disk_bytes,
                fsync=settings.fsync,
                policy=make_policy(settings.eviction, settings.eviction_half_life),
                free_share=settings.disk_free_share,
            )
        self.int4 = Int4Params(k_group=settings.int4_k_group, v_group=settings.int4_v_group)
        self.redis: RedisTier | None = None
        if settings.redis_url:
            self.redis = RedisTier(
                settings.redis_url,
                key_prefix=settings.redis_key_prefix,
                ttl_s=settings.redis_ttl_s,
                timeout_s=settings.redis_timeout_s,
                retry_after_s=settings.redis_retry_s,
                max_entry_bytes=settings.redis_max_entry_bytes,
            )
        self._lock = threading.Lock()
        self._staging_pools: dict[str, StagingPool] = {}
        self._num_hits = 0
        self._num_misses = 0

    @property
    def storage_dtype(self) -> StorageDType:
        return self.settings.storage_dtype

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self._tiers() if t is not None)

    def _tiers(self) -> tuple[DeviceTier | MemoryTier | DiskTier | RedisTier | None, ...]:
        return (self.device_tier, self.memory, self.history_memory, self.disk, self.redis)

    def device_tier_for(self, device: torch.device) -> DeviceTier | None:
        """The device tier of `device`, made at first use on an accelerator (`kvcache.device_bytes`; None:
        a share of its free memory); None on a CPU (unless one was given) or with the tier off."""
        tier = self.device_tier
        if tier is not None:
            return tier if tier.device.type == device.type else None
        if device.type == "cpu" or self.settings.device_bytes == 0:
            return None
        with self._lock:
            if self.device_tier is None:
                budget = self.settings.device_bytes or auto_budget(device)
                if budget <= 0:
                    return None
                self.device_tier = DeviceTier(budget, device, self.settings.eviction_half_life)
                logger.info("kv store: device tier on %s, %.2f GiB", device, budget / 2**30)
            return self.device_tier

    def _memory_for(self, history: bool) -> MemoryTier | None:
        if not history:
            return self.memory
        if self.history_memory is None and self.settings.history_memory_bytes:
            with self._lock:
                if self.history_memory is None:
                    tier = MemoryTier(self.settings.history_memory_bytes)
                    tier.name = "history_memory"
                    self.history_memory = tier
        return self.history_memory

    def _memory_get(self, key: str) -> StoredEntry | None:
        for tier in (self.memory, self.history_memory):
            entry = tier.get(key) if tier is not None else None
            if entry is not None:
                return entry
        return None

    def key_for(self, model_fingerprint: str, prefix_token_ids: Iterable[int], chunk_token_ids: Iterable[int]) -> str:
        """`chunk_key(...)`: the same whatever the storage dtype (the entry records its own format)."""
        return chunk_key(model_fingerprint, prefix_token_ids, chunk_token_ids)

    def _count(self, num_hits: int, num_misses: int) -> None:
        with self._lock:
            self._num_hits += num_hits
            self._num_misses += num_misses

    # -- writes --------------------------------------------------------------------------------------

    def put(
        self,
        key: str,
        kv: ChunkKV,
        *,
        model_fingerprint: str,
        overwrite: bool = False,
        cache_in_memory: bool = True,
        history: bool = False,
    ) -> PutResult:
        """Store a chunk's KV in every tier (persistent ones first). Storage faults never raise.

        `history`: a conversation turn's entry; its memory copy goes to the history memory tier."""
        entry = self.encode(key, kv, model_fingerprint=model_fingerprint)
        return self.put_entry(entry, overwrite=overwrite, cache_in_memory=cache_in_memory, history=history)

    def encode(
        self, key: str, kv: ChunkKV, *, model_fingerprint: str, storage_dtype: StorageDType | None = None
    ) -> StoredEntry:
        """`kv` in this store's storage form (or `storage_dtype`'s), as `put` would store it."""
        return encode_entry(
            kv,
            key=key,
            model_fingerprint=model_fingerprint,
            storage_dtype=storage_dtype or self.storage_dtype,
            int4=self.int4,
        )

    def put_entry(
        self,
        entry: StoredEntry,
        *,
        overwrite: bool = False,
        cache_in_memory: bool = True,
        history: bool = False,
        persist: bool = True,
    ) -> PutResult:
        """Store `entry` in memory (the history tier for `history`) and, with `persist`, on disk and in Redis.
        `persist=False`: memory only, gone with the process or pushed out by its LRU (a stateless client's turn,
        which no stored record names)."""
        key = check_key(entry.key)
        data = serialize_entry(entry) if persist and (self.disk or self.redis) else None
        stored: list[str] = []
        failed: list[str] = []
        memory = self._memory_for(history)
        if memory is not None and cache_in_memory:
            (stored if memory.put(key, entry) else failed).append(memory.name)
        if self.disk is not None and data is not None:
            (stored if self.disk.put_bytes(key, data, overwrite=overwrite) else failed).append("disk")
        if self.redis is not None and data is not None:
            (stored if self.redis.put_bytes(key, data, overwrite=overwrite) else failed).append("redis")
        return PutResult(
            key=key,
            stored_in=tuple(stored),
            failed=tuple(failed),
            num_bytes=len(data) if data is not None else entry.nbytes,
        )

    def delete(self, key: str) -> bool:
        check_key(key)
        removed = False
        for tier in self._tiers():
            if tier is not None:
                removed = tier.delete(key) or removed
        return removed

    # -- whole-entry reads ---------------------------------------------------------------------------

    def get_entry(self, key: str) -> StoredEntry | None:
        """The entry in storage form from the highest tier that has a valid copy; promotes it."""
        check_key(key)
        promote = self.settings.promote_on_load
        verify = self.settings.verify_checksums
        if self.disk is not None:
            self.disk.record_retrieval([key])
        entry = self._memory_get(key)
        if entry is not None:
            self._count(1, 0)
            return entry
        if self.disk is not None:
            entry = self.disk.get(key, verify=verify)
            if entry is not None:
                if promote and self.memory is not None:
                    self.memory.put(key, entry)
                self._count(1, 0)
                return entry
        if self.redis is not None:
            data = self.redis.get_bytes(key)
            if data is not None:
                try:
                    entry = deserialize_entry(data, key, verify=verify)
                except KVEntryCorrupt as exc:
                    self.redis.remove_corrupt(key, exc)
                else:
                    if promote:
                        if self.disk is not None:
                            self.disk.put_bytes(key, data)
                        if self.memory is not None:
                            self.memory.put(key, entry)
                    self._count(1, 0)
                    return entry
        self._count(0, 1)
        return None

    def get(self, key: str, *, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> ChunkKV | None:
        entry = self.get_entry(key)
        return None if entry is None else entry.to_chunk_kv(dtype, device)

    # -- presence ------------------------------------------------------------------------------------

    def contains(self, key: str) -> str | None:
        """Name of the highest tier holding `key`, or None. Does not read or promote the entry."""
        check_key(key)
        for memory in (self.device_tier, self.memory, self.history_memory):
            if memory is not None and memory.contains(key):
                return memory.name
        if self.disk is not None and self.disk.contains(key):
            return "disk"
        if self.redis is not None and self.redis.contains(key):
            return "redis"
        return None

    def locate_many(self, keys: Sequence[str]) -> dict[str, EntryLocation]:
        """Where each present key lives and its size per tier (one Redis round trip for all keys)."""
        unique = [check_key(k) for k in dict.fromkeys(keys)]
        sizes: dict[str, dict[str, int]] = {k: {} for k in unique}
        for memory in (self.device_tier, self.memory, self.history_memory):
            if memory is None:
                continue
            for k in unique:
                n = memory.nbytes_of(k)
                if n is not None:
                    sizes[k][memory.name] = n
        if self.disk is not None:
            for k in unique:
                n = self.disk.nbytes_of(k)
                if n is not None:
                    sizes[k]["disk"] = n
        if self.redis is not None:
            for k, n in self.redis.nbytes_many(unique).items():
                sizes[k]["redis"] = n
        return {
            k: EntryLocation(key=k, tiers=tuple(by_tier), num_bytes_by_tier=by_tier)
            for k, by_tier in sizes.items()
            if by_tier
        }

    def keys(self) -> list[str]:
        found: set[str] = set()
        for tier in self._tiers():
            if tier is not None:
                found.update(tier.keys())
        return sorted(found)

    # -- layer-wise reads ----------------------------------------------------------------------------

    def open_layers(
        self,
        keys: list[str],
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        *,
        prefetch: bool | None = None,
        convert_on_device: bool | None = None,
        convert_in_caller: bool | None = None,
        computed: Mapping[str, StoredEntry] | None = None,
        history_keys: Collection[str] = (),
    ) -> StoreLayerReader:
        """Serve the prompt's chunks (in this order) layer by layer; see `kvcache.loader`.

        Raises `KVEntryMissing` listing every key no tier could serve, before reading any layer, so
        the caller can recompute exactly those chunks and store them. `prefetch=None` uses the
        settings; `convert_on_device=None` converts/dequantizes on `device` unless it is the CPU;
        `convert_in_caller=None` converts on the thread that asks for a layer when `device` is the CPU.
        `computed`: entries the caller has just computed (`KVSpace.ensure`), served as
        they are whether or not a tier kept them, so a store that refuses writes still answers.
        `history_keys`: those of `keys` that are conversation turns (promoted into the history memory tier).
        """
        if not keys:
            raise ValueError("open_layers needs at least one key")
        unique = [check_key(k) for k in dict.fromkeys(keys)]
        if self.disk is not None:
            self.disk.record_retrieval(unique)
        device_tier = self.device_tier_for(torch.device(device))
        if device_tier is not None:
            device_tier.record_retrieval(unique)
        resolved: dict[str, ResolvedChunk] = {}
        need_redis: list[str] = []
        for key in unique:
            fresh = computed.get(key) if computed else None
            if fresh is not None:
                resolved[key] = ResolvedChunk(key=key, tier="memory", meta=fresh.meta, entry=fresh)
                continue
            resident = device_tier.get(key) if device_tier is not None else None
            if resident is not None:
                resolved[key] = ResolvedChunk(key=key, tier="device", meta=resident.meta, resident=resident)
                continue
            entry = self._memory_get(key)
            if entry is not None:
                resolved[key] = ResolvedChunk(key=key, tier="memory", meta=entry.meta, entry=entry)
                continue
            reader = self.disk.open_reader(key) if self.disk is not None else None
            if reader is not None:
                resolved[key] = ResolvedChunk(key=key, tier="disk", meta=reader.meta, reader=reader)
                continue
            need_redis.append(key)
        if need_redis and self.redis is not None:
            for key, data in self.redis.get_many_bytes(need_redis).items():
                try:
                    byte_reader = BytesEntryReader(data, key)
                except KVEntryCorrupt as exc:
                    self.redis.remove_corrupt(key, exc)
                    continue
                resolved[key] = ResolvedChunk(
                    key=key, tier="redis", meta=byte_reader.meta, reader=byte_reader, raw=data
                )
        missing = [k for k in unique if k not in resolved]
        num_computed = sum(1 for k in unique if computed and k in computed)
        self._count(len(unique) - len(missing) - num_computed, len(missing))
        if missing:
            for chunk in resolved.values():
                chunk.close()
            raise KVEntryMissing(missing)
        first = resolved[unique[0]].meta
        promote = self.settings.promote_on_load
        history = frozenset(history_keys)

        def on_promote(chunk: ResolvedChunk, layers: list[LayerData] | None) -> None:
            self._on_promote(chunk, layers, history=chunk.key in history)

        return StoreLayerReader(
            [resolved[k] for k in keys],
            device=device,
            dtype=dtype or default_compute_dtype(first.storage_dtype),
            prefetch=self.settings.prefetch if prefetch is None else prefetch,
            verify=self.settings.verify_checksums,
            on_corrupt=self._on_corrupt,
            on_promote=on_promote if promote else None,
            collect_layers=promote
            and (self.memory is not None or (bool(history) and bool(self.settings.history_memory_bytes))),
            convert_on_device=convert_on_device,
            convert_in_caller=convert_in_caller,
            staging_pool=self.staging_pool(torch.device(device)),
            on_resident=None if device_tier is None else device_tier.put,
        )

    def staging_pool(self, device: torch.device) -> StagingPool:
        """The host staging buffers every prompt's loads to `device` share (pinned for CUDA; kvcache.staging)."""
        with self._lock:
            pool = self._staging_pools.get(device.type)
            if pool is None:
                pool = self._staging_pools[device.type] = StagingPool(pin=device.type == "cuda")
            return pool

    def _on_corrupt(self, chunk: ResolvedChunk, exc: KVEntryCorrupt) -> None:
        tier = self.disk if chunk.tier == "disk" else self.redis if chunk.tier == "redis" else None
        if tier is not None:
            tier.remove_corrupt(chunk.key, exc)

    def _on_promote(self, chunk: ResolvedChunk, layers: list[LayerData] | None, history: bool = False) -> None:
        if chunk.tier == "redis" and chunk.raw is not None and self.disk is not None:
            self.disk.put_bytes(chunk.key, chunk.raw)
        memory = self._memory_for(history)
        if layers is not None and memory is not None:
            memory.put(chunk.key, StoredEntry.from_layers(chunk.meta, layers))

    # -- accounting ----------------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        tiers = tuple(t.stats() for t in self._tiers() if t is not None)
        with self._lock:
            return StoreStats(
                tiers=tiers, num_hits=self._num_hits, num_misses=self._num_misses, storage_dtype=self.storage_dtype
            )

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()
        if self.redis is not None:
            self.redis.close()
