"""Which disk entry to evict when the budget is full: retrieval frequency and recency, or plain LRU.

A chunk some questions retrieve again and again should outlive one that a single question touched,
even if that one was touched last; plain LRU gets this wrong under a skewed question stream (a
burst of one-off chunks flushes the hot ones). `FrequencyPolicy` keeps, per key, a retrieval count
that decays with a half-life of `half_life` retrievals (LRFU): every retrieval adds 1, and the
count halves every `half_life` retrievals of any chunk, so a chunk popular long ago fades out.
The entry with the lowest decayed count is evicted first; at equal counts the least recent one.

Retrievals are counted for keys the tier does not hold too (a question that missed): when such a
chunk is recomputed and stored again it comes back with its history, which is what makes the policy
admission-aware — a chunk retrieved often is stored again with a high count and stays, a one-off
chunk enters with count 1 and is the next to go. Nothing is ever refused: a put always stores.

Implementation: a decayed count c at clock t is kept as its log-priority p = log2(c) + t / half_life,
which does not change while time passes (all counts decay alike), so priorities compare directly and
sit in a heap with lazy deletion. History of keys not held is kept for at most `max_history` keys.

Both policies: `record_retrieval(key)`, `admit(key)` (now held), `forget(key)` (no longer held),
`victim(exclude) -> key | None`, `order() -> list[str]` (next victim first), `priorities()` /
`load_priorities()` (persist `FrequencyPolicy` counts across restarts). Not thread-safe: the disk
tier calls them under its lock.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from typing import Literal, Protocol

EvictionName = Literal["frequency", "lru"]


class EvictionPolicy(Protocol):
    name: str

    def record_retrieval(self, key: str) -> None: ...

    def admit(self, key: str) -> None: ...

    def forget(self, key: str) -> None: ...

    def victim(self, exclude: str | None = None) -> str | None: ...

    def order(self) -> list[str]: ...

    def priorities(self) -> dict[str, float]: ...

    def load_priorities(self, saved: dict[str, float]) -> None: ...


class LRUPolicy:
    """Least recently used (retrieved or stored) first; history of evicted keys is not kept."""

    name = "lru"

    def __init__(self) -> None:
        self._held: OrderedDict[str, None] = OrderedDict()  # least recent first

    def record_retrieval(self, key: str) -> None:
        if key in self._held:
            self._held.move_to_end(key)

    def admit(self, key: str) -> None:
        self._held[key] = None
        self._held.move_to_end(key)

    def forget(self, key: str) -> None:
        self._held.pop(key, None)

    def victim(self, exclude: str | None = None) -> str | None:
        return next((k for k in self._held if k != exclude), None)

    def order(self) -> list[str]:
        return list(self._held)

    def priorities(self) -> dict[str, float]:
        return {}

    def load_priorities(self, saved: dict[str, float]) -> None:
        return None


class FrequencyPolicy:
    """Decayed retrieval count with recency as the tie-break (see the module docstring)."""

    name = "frequency"

    def __init__(self, half_life: float = 100_000.0, max_history: int = 1_000_000) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be positive")
        self.half_life = float(half_life)
        self.max_history = max_history
        self._clock = 0  # retrievals recorded so far
        self._priority: dict[str, float] = {}  # held keys -> log-priority
        self._history: OrderedDict[str, float] = OrderedDict()  # keys not held -> log-priority, oldest first
        self._heap: list[tuple[float, int, str]] = []  # (priority, seq, key); stale rows skipped
        self._live_seq: dict[str, int] = {}  # held key -> seq of its current heap row
        self._seq = 0  # also the tie-break: at equal priority the older row goes first

    def _now(self) -> float:
        return self._clock / self.half_life

    def _known(self, key: str) -> float | None:
        p = self._priority.get(key)
        return self._history.get(key) if p is None else p

    def count(self, key: str) -> float:
        """The key's decayed retrieval count now (0 if never seen)."""
        p = self._known(key)
        return 0.0 if p is None else 2.0 ** (p - self._now())

    def _set_held(self, key: str, p: float) -> None:
        self._priority[key] = p
        self._seq += 1
        self._live_seq[key] = self._seq
        heapq.heappush(self._heap, (p, self._seq, key))
        if len(self._heap) > 4 * len(self._priority) + 64:
            self._heap = [row for row in self._heap if self._live_seq.get(row[2]) == row[1]]
            heapq.heapify(self._heap)

    def _set_history(self, key: str, p: float) -> None:
        self._history[key] = p
        self._history.move_to_end(key)
        while len(self._history) > self.max_history:
            self._history.popitem(last=False)

    def record_retrieval(self, key: str) -> None:
        self._clock += 1
        now = self._now()
        old = self._known(key)
        # c_now = c_then * 2^-(elapsed / half_life) + 1, in log form
        p = now if old is None else now + math.log2(2.0 ** (old - now) + 1.0)
        if key in self._priority:
            self._set_held(key, p)
        else:
            self._set_history(key, p)

    def admit(self, key: str) -> None:
        """`key` is now held: it keeps its history, and counts at least as one retrieval now."""
        if key in self._priority:
            return
        old = self._history.pop(key, None)
        now = self._now()
        self._set_held(key, now if old is None else max(old, now))

    def forget(self, key: str) -> None:
        p = self._priority.pop(key, None)
        if p is not None:
            del self._live_seq[key]
            self._set_history(key, p)

    def victim(self, exclude: str | None = None) -> str | None:
        skipped: list[tuple[float, int, str]] = []
        found = None
        while self._heap:
            row = heapq.heappop(self._heap)
            _, seq, key = row
            if self._live_seq.get(key) != seq:
                continue  # stale row: the key was retrieved again or dropped
            if key == exclude:
                skipped.append(row)
                continue
            found = key
            heapq.heappush(self._heap, row)  # still held until the caller forgets it
            break
        for row in skipped:
            heapq.heappush(self._heap, row)
        return found

    def order(self) -> list[str]:
        return sorted(self._priority, key=lambda k: (self._priority[k], self._live_seq[k]))

    def priorities(self) -> dict[str, float]:
        """Held keys' log-counts relative to now (log2 of the decayed count), for saving."""
        now = self._now()
        return {k: p - now for k, p in self._priority.items()}

    def load_priorities(self, saved: dict[str, float]) -> None:
        """Restore saved counts of held keys (keys not held are ignored)."""
        now = self._now()
        for key, rel in saved.items():
            if key in self._priority and math.isfinite(rel):
                self._set_held(key, max(self._priority[key], now + rel))


def make_policy(name: EvictionName, half_life: float) -> EvictionPolicy:
    if name == "lru":
        return LRUPolicy()
    if name == "frequency":
        return FrequencyPolicy(half_life)
    raise ValueError(f"unknown eviction policy {name!r}")
