"""Maintenance behind `blendrag cache stats|verify|prune|convert` (the CLI formats the results).

    stats(store) -> StoreStats                      # same as store.stats()
    verify(store, *, tiers=("disk", "redis")) -> VerifyReport
    prune(store, max_bytes: int) -> PruneReport
    convert(store, to: StorageDType, *, on_entry=None) -> ConvertReport

`verify` rescans the disk tier (picking up entries other processes wrote), then reads every entry of
the chosen persistent tiers completely, checking header, metadata and every tensor's checksum; bad
entries are removed (and counted as faults in `store.stats()`). `prune` evicts least recently used disk
entries until the disk tier holds at most `max_bytes` (it does not change the configured budget).

`convert` rewrites every persistent entry (disk, then Redis) that is not yet in `to` in that format,
in place under the same key. Each entry is replaced atomically (a new file renamed over the old one,
or one Redis SET), so an interrupted run leaves every entry readable, in its old format or its new
one, and running it again resumes: entries already in `to` are skipped. Entries found unreadable are
removed (they are recomputed when needed), as `verify` does.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kvcache.config import STORAGE_DTYPES, StorageDType
from kvcache.errors import KVEntryCorrupt
from kvcache.format import StoredEntry, encode_entry, serialize_entry
from kvcache.reader import BytesEntryReader, FileEntryReader, deserialize_entry
from kvcache.stats import StoreStats
from kvcache.store import TieredKVStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyProblem:
    tier: str
    key: str
    kind: str  # "truncated" | "checksum" | "format" | "io"
    reason: str


@dataclass(frozen=True)
class VerifyReport:
    num_checked: int
    num_ok: int
    num_removed: int
    removed_keys: tuple[str, ...]
    problems: tuple[VerifyProblem, ...]
    checked_by_tier: dict[str, int] = field(default_factory=dict)
    removed_by_tier: dict[str, int] = field(default_factory=dict)
    skipped_tiers: tuple[str, ...] = ()  # asked for but absent or unreachable


@dataclass(frozen=True)
class PruneReport:
    max_bytes: int
    num_bytes_before: int
    num_bytes_after: int
    num_entries_before: int
    num_entries_after: int
    num_evicted: int
    evicted_keys: tuple[str, ...]

    # the names app/cli/cache.py prints
    @property
    def num_removed(self) -> int:
        return self.num_evicted

    @property
    def bytes_removed(self) -> int:
        return self.num_bytes_before - self.num_bytes_after

    @property
    def bytes_after(self) -> int:
        return self.num_bytes_after


def stats(store: TieredKVStore) -> StoreStats:
    return store.stats()


def check_disk_entries(store: TieredKVStore, keys: Sequence[str], *, remove: bool) -> list[VerifyProblem]:
    """Read `keys`' disk entries whole with their checksums (what `verify` does for every entry) and return
    the bad ones; `remove` deletes them from every tier (the chunks' KV is then recomputed)."""
    problems: list[VerifyProblem] = []
    disk = store.disk
    if disk is None:
        return problems
    for key in keys:
        try:
            with FileEntryReader(disk.path_for(key), key) as reader:
                reader.read_all(verify=True)
        except FileNotFoundError:
            continue
        except KVEntryCorrupt as exc:
            problems.append(VerifyProblem("disk", key, exc.kind, exc.reason))
        except OSError as exc:
            problems.append(VerifyProblem("disk", key, "io", str(exc)))
    if remove:
        for problem in problems:
            store.delete(problem.key)
    return problems


def verify(store: TieredKVStore, *, tiers: Sequence[str] = ("disk", "redis")) -> VerifyReport:
    checked: Counter[str] = Counter()
    problems: list[VerifyProblem] = []
    skipped: list[str] = []
    for name in tiers:
        if name == "disk" and store.disk is not None:
            disk = store.disk
            disk.rescan()
            disk_keys = disk.keys()  # a snapshot: entries are removed while we iterate
            for key in disk_keys:
                checked["disk"] += 1
                try:
                    with FileEntryReader(disk.path_for(key), key) as reader:
                        reader.read_all(verify=True)
                except FileNotFoundError:
                    checked["disk"] -= 1  # deleted meanwhile (another process): nothing to verify
                    disk.delete(key)
                except KVEntryCorrupt as exc:
                    disk.remove_corrupt(key, exc)
                    problems.append(VerifyProblem("disk", key, exc.kind, exc.reason))
                except OSError as exc:
                    bad = KVEntryCorrupt(key, str(exc), kind="io")
                    disk.remove_corrupt(key, bad)
                    problems.append(VerifyProblem("disk", key, "io", str(exc)))
        elif name == "redis" and store.redis is not None and store.redis.ping():
            redis_tier = store.redis
            redis_keys = redis_tier.keys()
            for key in redis_keys:
                data = redis_tier.get_bytes(key)
                if data is None:
                    continue  # expired meanwhile or Redis went away
                checked["redis"] += 1
                try:
                    with BytesEntryReader(data, key) as byte_reader:
                        byte_reader.read_all(verify=True)
                except KVEntryCorrupt as exc:
                    redis_tier.remove_corrupt(key, exc)
                    problems.append(VerifyProblem("redis", key, exc.kind, exc.reason))
        elif name in ("disk", "redis"):
            skipped.append(name)
        else:
            raise ValueError(f"verify checks persistent tiers 'disk' and 'redis', not {name!r}")
    # a bad persistent copy may also sit in memory if it was read before it went bad: drop it too
    if store.memory is not None:
        for p in problems:
            store.memory.delete(p.key)
    removed_by_tier = Counter(p.tier for p in problems)
    num_checked = sum(checked.values())
    report = VerifyReport(
        num_checked=num_checked,
        num_ok=num_checked - len(problems),
        num_removed=len(problems),
        removed_keys=tuple(dict.fromkeys(p.key for p in problems)),
        problems=tuple(problems),
        checked_by_tier=dict(checked),
        removed_by_tier=dict(removed_by_tier),
        skipped_tiers=tuple(skipped),
    )
    logger.info("kv verify: %d checked, %d removed", report.num_checked, report.num_removed)
    return report


def prune(store: TieredKVStore, max_bytes: int) -> PruneReport:
    if max_bytes < 0:
        raise ValueError("max_bytes must be >= 0")
    if store.disk is None:
        raise ValueError("the store has no disk tier (settings.dir is None)")
    before = store.disk.stats()
    evicted = store.disk.evict_to(max_bytes)
    after = store.disk.stats()
    logger.info("kv prune: evicted %d entries, %d -> %d bytes", len(evicted), before.num_bytes, after.num_bytes)
    return PruneReport(
        max_bytes=max_bytes,
        num_bytes_before=before.num_bytes,
        num_bytes_after=after.num_bytes,
        num_entries_before=before.num_entries,
        num_entries_after=after.num_entries,
        num_evicted=len(evicted),
        evicted_keys=tuple(evicted),
    )


@dataclass(frozen=True)
class ConvertReport:
    to: str
    num_converted: int
    num_already: int  # already in the target format (skipped)
    num_removed: int  # unreadable, removed
    num_bytes_before: int  # of the converted entries
    num_bytes_after: int
    converted_by_tier: dict[str, int] = field(default_factory=dict)
    skipped_tiers: tuple[str, ...] = ()


def _reencode(entry: StoredEntry, store: TieredKVStore, to: StorageDType) -> bytes:
    kv = entry.to_chunk_kv(torch.float32)
    new = encode_entry(
        kv,
        key=entry.key,
        model_fingerprint=entry.meta.model_fingerprint,
        storage_dtype=to,
        created_at=entry.meta.created_at,
        int4=store.int4,
    )
    return serialize_entry(new)


def convert(
    store: TieredKVStore, to: StorageDType, *, on_entry: Callable[[str, str], None] | None = None
) -> ConvertReport:
    """Rewrite persistent entries into `to` (see the module docstring). `on_entry(tier, key)` is called
    after each entry is done (converted or skipped), e.g. for progress."""
    if to not in STORAGE_DTYPES:
        raise ValueError(f"storage dtype must be one of {', '.join(STORAGE_DTYPES)}, not {to!r}")
    converted: Counter[str] = Counter()
    num_already = num_removed = bytes_before = bytes_after = 0
    skipped: list[str] = []
    if store.disk is not None:
        disk = store.disk
        disk.rescan()
        disk_keys = disk.keys()  # a snapshot, next victim first
        for key in disk_keys:
            try:
                with FileEntryReader(disk.path_for(key), key) as reader:
                    if reader.meta.storage_dtype == to:
                        num_already += 1
                        if on_entry is not None:
                            on_entry("disk", key)
                        continue
                    entry = reader.read_all(verify=True)
                    old_size = reader.nbytes
            except FileNotFoundError:
                disk.delete(key)  # deleted meanwhile (another process)
                continue
            except KVEntryCorrupt as exc:
                disk.remove_corrupt(key, exc)
                num_removed += 1
                continue
            data = _reencode(entry, store, to)
            if disk.replace_bytes(key, data):
                converted["disk"] += 1
                bytes_before += old_size
                bytes_after += len(data)
            if store.memory is not None:
                store.memory.delete(key)  # the next read takes the new format
            if on_entry is not None:
                on_entry("disk", key)
    else:
        skipped.append("disk")
    if store.redis is not None and store.redis.ping():
        redis_tier = store.redis
        redis_keys = redis_tier.keys()
        for key in redis_keys:
            raw = redis_tier.get_bytes(key)
            if raw is None:
                continue
            try:
                with BytesEntryReader(raw, key) as byte_reader:
                    if byte_reader.meta.storage_dtype == to:
                        num_already += 1
                        continue
                entry = deserialize_entry(raw, key, verify=True)
            except KVEntryCorrupt as exc:
                redis_tier.remove_corrupt(key, exc)
                num_removed += 1
                continue
            data = _reencode(entry, store, to)
            if redis_tier.put_bytes(key, data, overwrite=True):
                converted["redis"] += 1
                bytes_before += len(raw)
                bytes_after += len(data)
            if on_entry is not None:
                on_entry("redis", key)
    else:
        skipped.append("redis")
    report = ConvertReport(
        to=to,
        num_converted=sum(converted.values()),
        num_already=num_already,
        num_removed=num_removed,
        num_bytes_before=bytes_before,
        num_bytes_after=bytes_after,
        converted_by_tier=dict(converted),
        skipped_tiers=tuple(skipped),
    )
    logger.info(
        "kv convert to %s: %d converted (%d -> %d bytes), %d already, %d removed",
        to,
        report.num_converted,
        bytes_before,
        bytes_after,
        num_already,
        num_removed,
    )
    return report
