"""In-process LRU tier holding `StoredEntry` objects (tensors in storage form) within a byte budget.

`MemoryTier(budget_bytes)`: `get(key) -> StoredEntry | None` (counts hit/miss, marks most recently
used), `peek(key)` (no counting, no reordering), `contains(key)`, `put(key, entry) -> bool` (evicts least
recently used entries until it fits; False and `num_rejected` += 1 if it alone exceeds the budget),
`delete(key) -> bool`, `keys()` (least recently used first), `nbytes_of(key)`, `stats()`. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from kvcache.format import StoredEntry
from kvcache.keys import check_key
from kvcache.stats import TierCounters, TierStats

logger = logging.getLogger(__name__)


class MemoryTier:
    name = "memory"

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError("memory tier budget must be positive")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, StoredEntry] = OrderedDict()  # LRU first
        self._num_bytes = 0
        self._lock = threading.Lock()
        self.counters = TierCounters()

    def get(self, key: str) -> StoredEntry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        (self.counters.hit if entry is not None else self.counters.miss)()
        return entry

    def peek(self, key: str) -> StoredEntry | None:
        with self._lock:
            return self._entries.get(key)

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def put(self, key: str, entry: StoredEntry) -> bool:
        check_key(key)
        if entry.key != key:
            raise ValueError("entry belongs to another key")
        size = entry.nbytes
        if size > self.budget_bytes:
            self.counters.rejected()
            logger.debug("memory tier: entry %s (%d B) exceeds the budget", key[:12], size)
            return False
        evicted = 0
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._num_bytes -= old.nbytes
            while self._entries and self._num_bytes + size > self.budget_bytes:
                _, victim = self._entries.popitem(last=False)
                self._num_bytes -= victim.nbytes
                evicted += 1
            self._entries[key] = entry
            self._num_bytes += size
        if evicted:
            self.counters.evicted(evicted)
        return True

    def delete(self, key: str) -> bool:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._num_bytes -= old.nbytes
        return old is not None

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def nbytes_of(self, key: str) -> int | None:
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry.nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._num_bytes = 0

    def stats(self) -> TierStats:
        with self._lock:
            num_entries, num_bytes = len(self._entries), self._num_bytes
        return self.counters.snapshot(
            name=self.name, available=True, num_entries=num_entries, num_bytes=num_bytes, budget_bytes=self.budget_bytes
        )
