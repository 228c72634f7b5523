"""In-process LRU tier holding `StoredEntry` objects (tensors in storage form) within a byte budget.

`MemoryTier(budget_bytes)`: `get(key) -> StoredEntry | None` (counts hit/miss, marks most recently
used), `peek(key)` (no counting, no reordering), `contains(key)`, `put(key, entry) -> bool` (evicts least
recently used entries until it fits; False and `num_rejected` += 1 if it alone exceeds the budget),
`delete(key) -> bool`, `keys()` (least recently used first), `nbytes_of(key)`, `stats()`. Thread-safe. The
reads, the deletion and the statistics are `HeldTier`'s (kvcache/held_tier.py), shared with the device tier.
"""

from __future__ import annotations

import logging

from kvcache.format import StoredEntry
from kvcache.held_tier import HeldTier
from kvcache.keys import check_key

logger = logging.getLogger(__name__)


class MemoryTier(HeldTier[StoredEntry]):
    name = "memory"

    def _on_hit(self, key: str) -> None:
        self._entries.move_to_end(key)

    def peek(self, key: str) -> StoredEntry | None:
        with self._lock:
            return self._entries.get(key)

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

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._num_bytes = 0
