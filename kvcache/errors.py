"""Typed errors of the KV store. Callers catch these to fall back to recomputing chunks.

- `KVEntryMissing(keys)`: raised by `TieredKVStore.open_layers` *before* any layer is served, listing
  every requested key that no tier could serve (absent, or found unreadable and removed).
- `KVEntryCorrupt(key, reason, kind=..., layer_idx=..., tier=...)`: an entry failed validation or a
  checksum while being read; the store has already removed it from that tier and counted a fault.
"""

from __future__ import annotations

from collections.abc import Sequence


class KVCacheError(Exception):
    """Base class of every error the kvcache package raises on purpose."""


class KVEntryMissing(KVCacheError):
    """Some requested entries are in no tier; `keys` lists them in request order, without repeats."""

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys: tuple[str, ...] = tuple(dict.fromkeys(keys))
        shown = ", ".join(k[:12] for k in self.keys[:8])
        more = f" (+{len(self.keys) - 8} more)" if len(self.keys) > 8 else ""
        noun = "entry" if len(self.keys) == 1 else "entries"
        super().__init__(f"{len(self.keys)} KV {noun} missing: {shown}{more}")


class KVEntryCorrupt(KVCacheError):
    """An entry is unreadable: `kind` is "truncated", "checksum" or "format"."""

    def __init__(
        self, key: str, reason: str, *, kind: str = "format", layer_idx: int | None = None, tier: str | None = None
    ) -> None:
        self.key = key
        self.reason = reason
        self.kind = kind
        self.layer_idx = layer_idx
        self.tier = tier
        where = f" layer {layer_idx}" if layer_idx is not None else ""
        super().__init__(f"KV entry {key[:12]}{where} corrupt ({kind}): {reason}")
