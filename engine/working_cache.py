"""The working KV cache of one request: preallocated, appended to by decode without copying.

K is stored *after* RoPE (at the token's absolute position) so attention reads it as is; the chunk
KV that comes from the store is rotated once when it is written here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.cache_slab import CacheSlot


@dataclass
class WorkingCache:
    k: torch.Tensor  # (num_layers, batch, kv_heads, capacity, head_dim), RoPE applied
    v: torch.Tensor  # (num_layers, batch, kv_heads, capacity, head_dim)
    length: int = 0  # positions 0…length-1 are valid
    # (capacity,) additive attention bias per key position, in the cache's dtype, that every row attending
    # over this cache adds to its logits (a blend's `stale_key_bias`); None: none. Positions a row writes
    # later (the suffix, decoded tokens) hold 0.
    key_bias: torch.Tensor | None = None
    # The pool slot whose rows k and v are (engine/cache_pool.py); None: allocated on its own. A cache that grows
    # (`ensure_capacity`) leaves its slot's rows but keeps the slot until it is released.
    slot: CacheSlot | None = field(default=None, repr=False, compare=False)

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
        batch: int = 1,
    ) -> WorkingCache:
        shape = (num_layers, batch, num_kv_heads, capacity, head_dim)
        # empty, not zeros: every row below `length` is written before it is read.
        return cls(k=torch.empty(shape, dtype=dtype, device=device), v=torch.empty(shape, dtype=dtype, device=device))

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def in_slot(self) -> bool:
        """k and v are still its pool slot's rows (it never grew): a captured decode step can address it."""
        return self.slot is not None and self.capacity == self.slot.slab.capacity

    def ensure_capacity(self, needed: int) -> None:
        """Grow (by doubling) so positions up to needed-1 fit; amortised O(1) per decoded token."""
        if needed <= self.capacity:
            return
        new_cap = max(needed, 2 * self.capacity)
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = old.new_empty((*old.shape[:3], new_cap, old.shape[4]))
            grown[:, :, :, : self.length] = old[:, :, :, : self.length]
            setattr(self, name, grown)
        if self.key_bias is not None:
            grown_bias = self.key_bias.new_zeros(new_cap)
            grown_bias[: self.key_bias.numel()] = self.key_bias
            self.key_bias = grown_bias

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
