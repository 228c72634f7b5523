"""Settings of the KV store (`kvcache`), composed into the app's settings tree by `app/settings.py`.

`KVCacheSettings` is a plain pydantic model: it never reads the environment. The app fills `dir` with
`<data_dir>/kv`; `dir=None` runs the store without a disk tier (tests, benchmarks).

Budgets: `memory_bytes` (0 turns the memory tier off, LRU eviction) and `disk_bytes` are enforced by this
process. `disk_bytes=None` (the default) sizes the disk tier at start: what it already holds plus
`disk_free_share` of the free space of its file system (logged). The disk tier evicts by `eviction`:
"frequency" (retrieval count decaying with `eviction_half_life` retrievals, see `kvcache.eviction`)
or "lru". An evicted chunk is recomputed when a question needs it and stored again.

Redis's own budget belongs to the Redis server (`maxmemory` + `maxmemory-policy
allkeys-lru`), because replicas share it and no single client can account for it; here we only cap the
size of one entry (`redis_max_entry_bytes`) and set a TTL that is refreshed on every hit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvcache.eviction import EvictionName

StorageDType = Literal["fp16", "bf16", "int8", "int4"]
STORAGE_DTYPES: tuple[StorageDType, ...] = ("fp16", "bf16", "int8", "int4")

MiB = 1024 * 1024
GiB = 1024 * MiB


class KVCacheSettings(BaseModel):
    """Everything the tiered chunk-KV store needs; see the module docstring."""

    model_config = ConfigDict(extra="forbid")

    dir: Path | None = Field(default=None, description="Disk tier root (<data_dir>/kv); None: no disk tier")
    # int4: the smallest format whose default blend stays within +0.01 first-token KL of fp16's with the
    # same look-up answers (docs/benchmarks.md, "KV footprint"); a quarter of fp16's bytes
    storage_dtype: StorageDType = Field(
        default="int4", description="How new entries store K/V; entries of any dtype are read"
    )
    int4_k_group: int = Field(default=128, ge=1, le=4096, description="int4: target tokens per K group")
    int4_v_group: int = Field(
        default=192, ge=2, le=4096, description="int4: channels per V group (at most; all heads of a token)"
    )
    device_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Device tier budget on an accelerator (hot chunks' KV in GPU memory, in the compute dtype, in "
        "front of every other tier); None: a quarter of the device's free memory at first use; 0 disables it. "
        "A CPU server has no device tier",
    )
    memory_bytes: int = Field(default=512 * MiB, ge=0, description="Memory tier budget; 0 disables it")
    history_memory_bytes: int = Field(
        default=128 * MiB,
        ge=0,
        description="Memory tier budget of conversation-turn entries, apart from the chunks'; 0 disables it",
    )
    disk_bytes: int | None = Field(
        default=None, gt=0, description="Disk tier budget; None: held + disk_free_share of the free space"
    )
    disk_free_share: float = Field(default=0.5, gt=0, le=1, description="Share of free space for disk_bytes=None")
    eviction: EvictionName = Field(default="frequency", description="Disk tier eviction: frequency or lru")
    eviction_half_life: float = Field(default=100_000, gt=0, description="Retrievals for a count to halve")
    redis_url: str | None = Field(default=None, description="redis://host:port/db; None: no Redis tier")
    redis_key_prefix: str = Field(
        default="blendrag:kv:", min_length=1, description="Prefix of every Redis key the KV tier writes"
    )
    redis_ttl_s: int | None = Field(default=7 * 24 * 3600, gt=0, description="Refreshed on each hit")
    redis_max_entry_bytes: int = Field(
        default=256 * MiB, gt=0, le=512 * MiB, description="Entries larger than this are not put in Redis"
    )
    redis_timeout_s: float = Field(default=1.0, gt=0, description="Connect and per-command timeout")
    redis_retry_s: float = Field(default=5.0, ge=0, description="After a Redis failure, skip it this long")
    prefetch: bool = Field(
        default=True, description="Read layer l+1 in a background thread (and, off the CPU, dequantize it there)"
    )
    verify_checksums: bool = Field(default=True, description="Check per-tensor CRC32 on every read")
    promote_on_load: bool = Field(default=True, description="Copy lower-tier hits into higher tiers")
    fsync: bool = Field(default=True, description="fsync entry files (and their dir) before rename")

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("redis_url must start with redis://, rediss:// or unix://")
        return value
