"""Which context tokens a blend recomputes: one small interface, several policies at equal budget.

- `deviation` (CacheBlend): the tokens whose fresh KV at the check layer differs most from the cached KV.
- `first_k` (EPIC-like): the first tokens of every chunk, where the missing cross-chunk attention hurts most.
- `random`: a uniform sample, the floor any policy should beat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.types import SelectorName


@dataclass
class SelectionInput:
    """The candidate context tokens at one check layer. Fresh/cached tensors are (kv_heads, n, D)."""

    layer: int
    positions: torch.Tensor  # (n,) absolute positions, ascending
    chunk_index: torch.Tensor  # (n,) which chunk of the layout each candidate belongs to
    fresh: torch.Tensor  # V (or pre-RoPE K) just computed for the candidates
    cached: torch.Tensor  # the stored V (or pre-RoPE K) of the same tokens
    num_keep: int


class TokenSelector(Protocol):
    name: str

    def select(self, inp: SelectionInput) -> torch.Tensor:
        """Indices (into the candidates) of the `num_keep` tokens to keep recomputing, ascending."""
        ...


def kv_deviation(fresh: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
    """‖fresh − cached‖² per token, summed over heads and head dims: (kv_heads, n, D) → (n,) float32."""
    diff = fresh.float() - cached.float()
    return diff.pow(2).sum(dim=(0, 2))


class DeviationSelector:
    name = "deviation"

    def select(self, inp: SelectionInput) -> torch.Tensor:
        n = inp.positions.numel()
        if inp.num_keep >= n:
            return torch.arange(n, device=inp.positions.device)
        scores = kv_deviation(inp.fresh, inp.cached)  # (n,)
        return torch.topk(scores, inp.num_keep, sorted=False).indices.sort().values


class FirstKSelector:
    """The same budget spread evenly over chunks, taken from each chunk's start."""

    name = "first_k"

    def select(self, inp: SelectionInput) -> torch.Tensor:
        n = inp.positions.numel()
        if inp.num_keep >= n:
            return torch.arange(n, device=inp.positions.device)
        chunk = inp.chunk_index
        # rank of each candidate inside its chunk: 0 for the chunk's first candidate, 1 for the next, …
        first_of_chunk = torch.ones_like(chunk, dtype=torch.bool)
        first_of_chunk[1:] = chunk[1:] != chunk[:-1]
        start_idx = torch.cummax(torch.where(first_of_chunk, torch.arange(n, device=chunk.device), 0), 0).values
        rank = torch.arange(n, device=chunk.device) - start_idx
        # Keep the num_keep candidates with the smallest rank (ties → earlier chunk first).
        order = torch.argsort(rank * (n + 1) + torch.arange(n, device=chunk.device))
        return order[: inp.num_keep].sort().values


class RandomSelector:
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def select(self, inp: SelectionInput) -> torch.Tensor:
        n = inp.positions.numel()
        gen = torch.Generator(device="cpu").manual_seed(self.seed + inp.layer)
        return torch.randperm(n, generator=gen)[: inp.num_keep].sort().values.to(inp.positions.device)


def make_selector(name: SelectorName, seed: int = 0) -> TokenSelector:
    if name == "deviation":
        return DeviationSelector()
    if name == "first_k":
        return FirstKSelector()
    if name == "random":
        return RandomSelector(seed)
    raise ValueError(f"unknown selector {name!r}")
