"""Accounting of the KV store: per-tier counters and the `StoreStats` that `TieredKVStore.stats()` returns.

Counters per tier: hits, misses (a read found nothing there), evictions (LRU), faults (something went
wrong and was survived: corrupt/truncated entry, file deleted behind our back, write failure, Redis
down; `faults_by_kind` splits them), rejected (an entry larger than the tier's budget). The store also
counts per-key outcomes of its own reads (`num_hits` / `num_misses`: found in some tier or in none).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TierStats:
    name: str  # "memory" | "disk" | "redis"
    available: bool  # False while Redis is unreachable
    num_entries: int
    num_bytes: int
    budget_bytes: int | None  # None: not enforced by us (Redis)
    num_hits: int
    num_misses: int
    num_evictions: int
    num_faults: int
    num_rejected: int
    faults_by_kind: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StoreStats:
    tiers: tuple[TierStats, ...]  # in lookup order: memory, disk, redis (absent tiers left out)
    num_hits: int  # keys a store read found in some tier
    num_misses: int  # keys a store read found in no tier
    storage_dtype: str

    def tier(self, name: str) -> TierStats | None:
        return next((t for t in self.tiers if t.name == name), None)

    @property
    def num_faults(self) -> int:
        return sum(t.num_faults for t in self.tiers)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (for `blendrag cache stats --json` and /metrics)."""
        return asdict(self)


class TierCounters:
    """Thread-safe counters one tier owns; `snapshot` feeds `TierStats`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.num_hits = 0
        self.num_misses = 0
        self.num_evictions = 0
        self.num_rejected = 0
        self.faults_by_kind: Counter[str] = Counter()

    def hit(self) -> None:
        with self._lock:
            self.num_hits += 1

    def miss(self) -> None:
        with self._lock:
            self.num_misses += 1

    def evicted(self, n: int = 1) -> None:
        with self._lock:
            self.num_evictions += n

    def rejected(self) -> None:
        with self._lock:
            self.num_rejected += 1

    def fault(self, kind: str) -> None:
        with self._lock:
            self.faults_by_kind[kind] += 1

    @property
    def num_faults(self) -> int:
        with self._lock:
            return sum(self.faults_by_kind.values())

    def snapshot(
        self, *, name: str, available: bool, num_entries: int, num_bytes: int, budget_bytes: int | None
    ) -> TierStats:
        with self._lock:
            return TierStats(
                name=name,
                available=available,
                num_entries=num_entries,
                num_bytes=num_bytes,
                budget_bytes=budget_bytes,
                num_hits=self.num_hits,
                num_misses=self.num_misses,
                num_evictions=self.num_evictions,
                num_faults=sum(self.faults_by_kind.values()),
                num_rejected=self.num_rejected,
                faults_by_kind=dict(sorted(self.faults_by_kind.items())),
            )
