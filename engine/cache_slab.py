"""Where a pooled working cache lives: a slab (the caches of one size class in one tensor) and a slot of it.

A module of their own because both the pool (engine/cache_pool.py, which hands out and takes back slots) and the
working cache (engine/working_cache.py, which remembers its slot) name them: here, neither imports the other to
know them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch


@dataclass(eq=False)  # identity: decode graphs key their state by slab
class Slab:
    """`num_slots` caches of one class in one tensor (plus a scratch slot when `scratch` is set)."""

    capacity: int  # positions per slot (the class)
    k: torch.Tensor  # (num_layers, slots, kv_heads, capacity, head_dim), RoPE applied
    v: torch.Tensor  # (num_layers, slots, kv_heads, capacity, head_dim)
    num_slots: int  # slots handed out to requests: 0…num_slots-1
    scratch: int | None  # the slot after them, written by a captured batch's padding rows; None: no such slot
    free: list[int]  # slots not in use, the most recently released last (handed out first: warm in cache)
    views: list[tuple[torch.Tensor, torch.Tensor]]  # slot s's (k, v), each (num_layers, 1, kv_heads, capacity, D)
    last_release: int = 0  # the pool's tick when a slot was last released (least recent is evicted first)

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def idle(self) -> bool:
        return len(self.free) == self.num_slots


@dataclass(eq=False)
class CacheSlot:
    """Where a pooled working cache lives: `slab`'s slot `index`."""

    slab: Slab
    index: int
    release: weakref.finalize = field(repr=False)  # gives the slot back once (explicitly or when the cache dies)
