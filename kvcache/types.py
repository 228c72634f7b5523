"""The chunk-KV format every package agrees on: what the engine produces at ingest and consumes at ask."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class ChunkKV:
    """One chunk's precomputed KV for every layer, computed behind the shared system prefix.

    K is stored *before* RoPE so the engine can rotate it to wherever the chunk lands in a new prompt.
    """

    k: torch.Tensor  # (num_layers, kv_heads, num_tokens, head_dim), pre-RoPE
    v: torch.Tensor  # (num_layers, kv_heads, num_tokens, head_dim)

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.k.shape[2]

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class LayerKVReader(Protocol):
    """Cached KV of the prompt's context chunks (concatenated in prompt order), served layer by layer.

    The engine calls `layer(0)`, `layer(1)`, … in increasing order while it computes, so an
    implementation may read layer l+1 from slow storage while layer l is being computed.
    """

    @property
    def num_layers(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K (pre-RoPE) and V of all context tokens at one layer, each (kv_heads, num_tokens, head_dim)."""
        ...

    def close(self) -> None: ...


class InMemoryLayerReader:
    """A LayerKVReader over chunks already in memory (tests, benchmarks, the memory tier)."""

    def __init__(
        self, chunks: list[ChunkKV], device: torch.device | str = "cpu", dtype: torch.dtype | None = None
    ) -> None:
        if not chunks:
            raise ValueError("InMemoryLayerReader needs at least one chunk")
        self._chunks = chunks
        self._device = torch.device(device)
        self._dtype = dtype

    @property
    def num_layers(self) -> int:
        return self._chunks[0].num_layers

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self._chunks)

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = self._dtype or self._chunks[0].k.dtype
        k = torch.cat([c.k[layer_idx] for c in self._chunks], dim=1)  # (kv_heads, num_tokens, head_dim)
        v = torch.cat([c.v[layer_idx] for c in self._chunks], dim=1)
        return k.to(self._device, dtype), v.to(self._device, dtype)

    def close(self) -> None:
        return None
