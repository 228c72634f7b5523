"""Working caches allocated once per size class and reused by the requests that follow.

    pool = WorkingCachePool(layout, max_bytes=1 << 30)
    cache = pool.acquire(prompt_tokens + max_new_tokens)   # a WorkingCache of the class's capacity, length 0
    ...                                                      # the prompt pass and decode fill it
    pool.release(cache)                                      # back to its class (also when it is dropped)

Why a pool: a request's working cache is the largest tensor it allocates (a 3.5k-token prompt of a 7B model:
0.5 GB in bfloat16). Allocated per request it costs fresh pages on a CPU (faulted in and zeroed by the kernel
on first touch) and, on a GPU, a capacity that changes with every prompt; decode captured in a CUDA graph
(engine/decode_graphs.py) needs its caches at addresses that stay put from one request to the next.

Size classes are powers of two from MIN_CLASS_TOKENS up: a prompt of 3.5k tokens and its 320 answer tokens take
a 4096-token class. Doubling keeps the classes few (seven from 512 to a 32k context), so the classes a server
uses stay warm and one decode graph per class and batch size is enough; the cost is at most half a class of
unused rows, which the byte cap bounds. vLLM-like block multiples would waste less per request but make tens
of classes, each rarely reused and each needing its own graphs.

The unit of allocation is a slab: `slots` caches of one class in one tensor, (layers, slots, kv_heads,
capacity, head_dim). A cache handed out is a view of one slot (the same view object every time that slot is
handed out). On a CPU a slab holds one slot; for decode graphs it holds a server's worth of requests plus a
scratch slot that padding rows of a batch write to, so a batch of requests is a set of slot indices into one
tensor. Slabs with a scratch slot are zeroed once when allocated: a captured decode step reads a slot's rows
past the request's length (masked), and masked rows must hold finite values (0 · NaN is NaN).

`max_bytes` caps every slab the pool holds, in use or idle: a new slab first evicts idle slabs (least recently
released first), then takes as many slots as fit; a request that finds no room at all gets a plain, unpooled
cache (decoded eagerly, dropped when it finishes). A cache goes back to its slot when its request releases it
(`RequestRun.release`) or, for a cache nobody releases (a `score` or a bench caller's prompt pass), when the
cache is garbage collected.

Nothing of an earlier request survives into the next one's answer: a cache is handed out with length 0 and no
key bias, and every row below `length` is written before it is read (the prompt pass writes all its positions,
decode one more each step); rows beyond `length` are never read by the eager path and are masked with -inf in a
captured one.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from dataclasses import dataclass

import torch

from engine.cache_slab import CacheSlot, Slab
from engine.working_cache import WorkingCache

logger = logging.getLogger(__name__)

MIN_CLASS_TOKENS = 512


def size_class(tokens: int, min_tokens: int = MIN_CLASS_TOKENS) -> int:
    """The capacity of the class a cache of `tokens` positions comes from: the least power of two ≥ both."""
    capacity = min_tokens
    while capacity < tokens:
        capacity *= 2
    return capacity


@dataclass(frozen=True)
class CacheLayout:
    """The shape of one working cache apart from its capacity."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    def slot_bytes(self, capacity: int) -> int:
        """K and V of one cache of `capacity` positions."""
        elements = self.num_layers * self.num_kv_heads * capacity * self.head_dim
        return 2 * elements * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class PoolStats:
    held_bytes: int  # every slab, in use or idle
    idle_bytes: int  # slabs none of whose slots is in use
    num_slabs: int
    hits: int  # caches handed out from a slab already allocated (no allocation)
    allocated_slabs: int  # slabs allocated since the start (evicted ones included)
    unpooled: int  # caches allocated outside the pool: no room under the cap, or larger than the largest class


class WorkingCachePool:
    """Working caches by size class, in slabs of `slots` (see the module docstring). Thread-safe."""

    def __init__(
        self,
        layout: CacheLayout,
        max_bytes: int,
        slots: int = 1,
        scratch: bool = False,
        max_capacity: int | None = None,
        min_tokens: int = MIN_CLASS_TOKENS,
    ) -> None:
        """`slots`: caches per slab; `scratch`: one more slot per slab for padding rows (decode graphs);
        `max_capacity`: the largest class (the model's context); a longer cache is allocated unpooled."""
        if slots < 1:
            raise ValueError(f"a slab needs at least one slot, got {slots}")
        self.layout = layout
        self.max_bytes = max_bytes
        self.slots = slots
        self.scratch = scratch
        self.max_capacity = max_capacity
        self.min_tokens = min_tokens
        # Reentrant: a collection that runs while the lock is held (allocating a slab allocates Python objects)
        # may finalize a dropped cache of this thread, whose slot comes back through `_give_back`.
        self._lock = threading.RLock()
        self._slabs: dict[int, list[Slab]] = {}  # by capacity
        self._tick = itertools.count(1)
        self._hits = 0
        self._allocated_slabs = 0
        self._unpooled = 0

    # ------------------------------------------------------------------------------------ hand out
    def acquire(self, capacity: int) -> WorkingCache:
        """A working cache with room for `capacity` positions (its class's), length 0 and no key bias."""
        cls = size_class(capacity, self.min_tokens)
        too_long = self.max_capacity is not None and cls > max(self.max_capacity, self.min_tokens)
        with self._lock:
            slab = None if too_long else self._slab_with_room(cls)
            if slab is None:
                self._unpooled += 1
            else:
                index = slab.free.pop()
        if slab is None:
            return self._unpooled_cache(capacity)
        k, v = slab.views[index]
        cache = WorkingCache(k=k, v=v)
        # The finalizer holds the slab and index, never the cache: it runs once, on `release` or when the cache
        # object is collected, whichever comes first.
        cache.slot = CacheSlot(slab, index, weakref.finalize(cache, self._give_back, slab, index))
        return cache

    def release(self, cache: WorkingCache) -> None:
        """Give a pooled cache's slot back now (nothing for an unpooled one). The caller must not use the cache
        afterwards: the slot's next request writes into the same rows."""
        slot = cache.slot
        if slot is not None:
            cache.slot = None
            slot.release()

    def _give_back(self, slab: Slab, index: int) -> None:
        with self._lock:
            slab.free.append(index)
            slab.last_release = next(self._tick)

    def _slab_with_room(self, capacity: int) -> Slab | None:
        """A slab of the class with a free slot, allocating one (evicting idle slabs to fit the cap) if none has;
        None when no new slab fits. Called under the lock."""
        slabs = self._slabs.setdefault(capacity, [])
        with_room = [s for s in slabs if s.free]
        if with_room:
            self._hits += 1
            return max(with_room, key=lambda s: s.last_release)
        slot_bytes = self.layout.slot_bytes(capacity)

        def room() -> int:  # slots for requests a new slab could have under the cap (its scratch slot aside)
            return (self.max_bytes - self._held_bytes()) // slot_bytes - int(self.scratch)

        while room() < self.slots:
            idle = [s for group in self._slabs.values() for s in group if s.idle]
            if not idle:
                break
            oldest = min(idle, key=lambda s: s.last_release)
            self._slabs[oldest.capacity].remove(oldest)
            logger.debug("working cache pool: evicted an idle %d-token slab (%d bytes)", oldest.capacity, oldest.nbytes)
        # A smaller slab where a whole one does not fit (a small GPU): fewer requests share one decode graph.
        num_slots = min(self.slots, room())
        if num_slots < 1:
            return None
        slab = self._new_slab(capacity, num_slots)
        slabs.append(slab)
        self._allocated_slabs += 1
        return slab

    def _new_slab(self, capacity: int, num_slots: int) -> Slab:
        lay = self.layout
        total = num_slots + int(self.scratch)
        shape = (lay.num_layers, total, lay.num_kv_heads, capacity, lay.head_dim)
        # With a scratch slot (decode graphs) zeros: a captured step reads masked rows past a request's length
        # (module docstring). Eager decode reads no row it has not written: empty, no page touched before use.
        new = torch.zeros if self.scratch else torch.empty
        k = new(shape, dtype=lay.dtype, device=lay.device)
        v = new(shape, dtype=lay.dtype, device=lay.device)
        views = [(k[:, s : s + 1], v[:, s : s + 1]) for s in range(num_slots)]
        return Slab(
            capacity=capacity,
            k=k,
            v=v,
            num_slots=num_slots,
            scratch=num_slots if self.scratch else None,
            free=list(range(num_slots - 1, -1, -1)),  # slot 0 is handed out first
            views=views,
        )

    def _unpooled_cache(self, capacity: int) -> WorkingCache:
        lay = self.layout
        return WorkingCache.allocate(lay.num_layers, lay.num_kv_heads, lay.head_dim, capacity, lay.dtype, lay.device)

    # ----------------------------------------------------------------------------------- accounting
    def _held_bytes(self) -> int:
        return sum(s.nbytes for group in self._slabs.values() for s in group)

    def stats(self) -> PoolStats:
        with self._lock:
            slabs = [s for group in self._slabs.values() for s in group]
            return PoolStats(
                held_bytes=sum(s.nbytes for s in slabs),
                idle_bytes=sum(s.nbytes for s in slabs if s.idle),
                num_slabs=len(slabs),
                hits=self._hits,
                allocated_slabs=self._allocated_slabs,
                unpooled=self._unpooled,
            )
