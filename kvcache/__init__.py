"""Chunk-KV storage for blendrag: format, content-addressed keys, tiered store, layer-wise loader.

Typical use (the app builds one store from its settings and shares it across worker threads):

    from kvcache import KVCacheSettings, KVSpace, TieredKVStore, KVEntryMissing
    store = TieredKVStore(KVCacheSettings(dir=data_dir / "kv"))
    space = KVSpace(store, model_fingerprint, prefix_token_ids)            # the served model's entries
    key = space.key(chunk_token_ids)
    written = space.ensure(chunks, compute=engine.precompute_chunks)       # compute and store what is missing
    try:
        with space.open(keys, device, dtype) as source:                     # at question time
            k, v = source.layer(0)                                          # (kv_heads, T, head_dim)
    except KVEntryMissing as exc:
        ...  # space.ensure(..., missing_keys=exc.keys, keep_entries=True), open again with computed=

Modules: config (settings), keys, format / reader (entry bytes of every storage dtype), quant (int8), quant_int4
(int4: grouped, asymmetric, packed), held_tier (what the in-process tiers share), memory_tier, device_tier,
disk_tier (byte budget), eviction (which disk entry goes: retrieval frequency or LRU), redis_tier, store, loader
and hostcopy (layer-wise reads off torch's threads), space (a model's entries behind one prefix: key, ensure, open),
writer (the one KV writer: compute what the store lacks and put it, one policy for a failed put), stats, coverage,
admin (stats, verify, prune, convert), errors, types (the shared contract). Files are replaced through fsio.atomic.
"""

from kvcache.config import KVCacheSettings, StorageDType
from kvcache.coverage import ChunkRef, ChunkState, CoverageCounts, CoverageReport, compute_coverage
from kvcache.errors import KVCacheError, KVEntryCorrupt, KVEntryMissing
from kvcache.format import StoredEntry
from kvcache.keys import chunk_key, is_valid_key
from kvcache.loader import StoreLayerReader
from kvcache.space import KVSpace
from kvcache.stats import StoreStats, TierStats
from kvcache.store import EntryLocation, PutResult, TieredKVStore
from kvcache.types import ChunkKV, InMemoryLayerReader, LayerKVReader

__all__ = [
    "ChunkKV",
    "ChunkRef",
    "ChunkState",
    "CoverageCounts",
    "CoverageReport",
    "EntryLocation",
    "InMemoryLayerReader",
    "KVCacheError",
    "KVCacheSettings",
    "KVEntryCorrupt",
    "KVEntryMissing",
    "KVSpace",
    "LayerKVReader",
    "PutResult",
    "StorageDType",
    "StoreLayerReader",
    "StoreStats",
    "StoredEntry",
    "TierStats",
    "TieredKVStore",
    "chunk_key",
    "compute_coverage",
    "is_valid_key",
]
