"""What the two in-process tiers share (`MemoryTier`, `DeviceTier`): entries held by key within a byte budget,
under one lock, with the tier's counters. Each tier decides what a put admits and evicts; the reads, the
deletion and the statistics are the same for both.

`HeldTier(budget_bytes)`: `get(key)` (counts a hit or a miss), `contains(key)`, `delete(key) -> bool`,
`keys()` (in the order held: least recently used first where a tier keeps that order), `nbytes_of(key)`,
`stats()`. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, Protocol, TypeVar

from kvcache.stats import TierCounters, TierStats


class Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


E = TypeVar("E", bound=Sized)


class HeldTier(Generic[E]):
    name = "held"

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"{self.name} tier budget must be positive")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, E] = OrderedDict()
        self._num_bytes = 0
        self._lock = threading.Lock()
        self.counters = TierCounters()

    def _on_hit(self, key: str) -> None:
        """Called under the lock when `get` finds `key` (the memory tier's LRU moves it to the end)."""

    def _on_delete(self, key: str) -> None:
        """Called under the lock once `key` left (the device tier's eviction policy forgets it)."""

    def get(self, key: str) -> E | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._on_hit(key)
        (self.counters.hit if entry is not None else self.counters.miss)()
        return entry

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def delete(self, key: str) -> bool:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return False
            self._num_bytes -= entry.nbytes
            self._on_delete(key)
            return True

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def nbytes_of(self, key: str) -> int | None:
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry.nbytes

    def stats(self) -> TierStats:
        with self._lock:
            num_entries, num_bytes = len(self._entries), self._num_bytes
        return self.counters.snapshot(
            name=self.name, available=True, num_entries=num_entries, num_bytes=num_bytes, budget_bytes=self.budget_bytes
        )
