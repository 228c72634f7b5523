"""The device tier: hot chunks' KV resident in accelerator memory, in the compute dtype, in front of every other
tier (memory → disk → Redis).

A blend whose chunks are all here copies nothing across the bus: each layer is a view of tensors already on the
device. Entries arrive by promotion, after a request read a chunk through the staging path (`kvcache.loader`),
as the (num_layers, kv_heads, num_tokens, head_dim) K (pre-RoPE) and V that the loader produced for it. The
budget is `kvcache.device_bytes` (None: a share of the device's free memory when the tier is first used; 0: no
device tier). Eviction keeps what retrieval returns often (`FrequencyPolicy`, the disk tier's): a new chunk is
admitted only by evicting chunks retrieved less often than it, so one sweep over a cold corpus cannot flush the
hot set. A CPU server has no device tier.

`DeviceTier(budget_bytes, device)`: `record_retrieval(keys)`, `get(key) -> DeviceEntry | None` (counts hit or
miss), `contains`, `put(key, entry) -> bool`, `delete`, `keys()`, `stats()`. Thread-safe. The reads, the deletion
and the statistics are `HeldTier`'s (kvcache/held_tier.py), shared with the memory tier.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from kvcache.eviction import FrequencyPolicy
from kvcache.format import EntryMeta
from kvcache.held_tier import HeldTier

logger = logging.getLogger(__name__)

# The share of the device's free memory the tier takes when `kvcache.device_bytes` is None (the model, the working
# caches and the activations of the prompt passes keep the rest).
AUTO_SHARE = 0.25


@dataclass(frozen=True)
class DeviceEntry:
    """One chunk's KV on the device, in the compute dtype, with the metadata of the stored entry it came from."""

    meta: EntryMeta
    k: torch.Tensor  # (num_layers, kv_heads, num_tokens, head_dim), pre-RoPE
    v: torch.Tensor  # (num_layers, kv_heads, num_tokens, head_dim)

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    @property
    def num_tokens(self) -> int:
        return self.k.shape[2]


def auto_budget(device: torch.device) -> int:
    """`AUTO_SHARE` of the device's free memory now (0 where it cannot be read)."""
    if device.type != "cuda":
        return 0
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * AUTO_SHARE)


class DeviceTier(HeldTier[DeviceEntry]):
    name = "device"

    def __init__(self, budget_bytes: int, device: torch.device | str, half_life: float = 100_000.0) -> None:
        super().__init__(budget_bytes)
        self.device = torch.device(device)
        self._policy = FrequencyPolicy(half_life)

    def record_retrieval(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                self._policy.record_retrieval(key)

    def put(self, key: str, entry: DeviceEntry) -> bool:
        """Hold `entry` if it fits, evicting chunks retrieved less often than it; False if it does not earn
        its place (or alone exceeds the budget)."""
        if entry.k.device != self.device and not (entry.k.device.type == self.device.type == "cuda"):
            raise ValueError(f"a device tier on {self.device} cannot hold tensors on {entry.k.device}")
        size = entry.nbytes
        if size > self.budget_bytes:
            self.counters.rejected()
            return False
        with self._lock:
            if key in self._entries:
                return True
            count = self._policy.count(key)
            victims: list[str] = []
            freed = 0
            while self._num_bytes - freed + size > self.budget_bytes:
                victim = self._policy.victim(exclude=key)
                if victim is None or victim in victims or self._policy.count(victim) > count:
                    return False  # only colder chunks make room; the held ones stay
                victims.append(victim)
                self._policy.forget(victim)
                freed += self._entries[victim].nbytes
            for victim in victims:
                del self._entries[victim]
            self._num_bytes -= freed
            self._entries[key] = entry
            self._num_bytes += size
            self._policy.admit(key)
        if victims:
            self.counters.evicted(len(victims))
        return True

    def _on_delete(self, key: str) -> None:
        self._policy.forget(key)
