"""Which context tokens a blend recomputes: one small interface, several policies at equal budget.

Two kinds of selector, told apart by `upfront`:

- up-front selectors decide before the prompt pass; the chosen rows are then fresh from layer 0 to the
  last layer and every other context row keeps its stored (re-rotated) KV in every layer:
  - `query` (ProphetKV / A³ / InfoFlow-style): the tokens the question attends to most over the reused
    cache, scored by a cheap pass of the suffix rows alone (`engine.blend.scoring.score_context`);
  - `first_k` (EPIC-like): the first tokens of every chunk;
  - `random`: a uniform sample, the floor any policy should beat.
- check-layer selectors decide inside the layer loop, after every non-prefix row went through layers
  0…c fresh: `deviation` (CacheBlend) keeps the tokens whose fresh KV differs most from the stored KV.

Every selector keeps exactly `num_recompute_tokens(ratio, N)` context tokens, so they compare at
equal budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from engine.host_sync import to_device

if TYPE_CHECKING:
    from engine.blend.config import BlendConfig


def num_recompute_tokens(ratio: float, num_context_tokens: int) -> int:
    """The recompute budget of every selector: round(ratio · N), halves rounded up."""
    return min(num_context_tokens, int(math.floor(ratio * num_context_tokens + 0.5)))


def adaptive_num_keep(scores: torch.Tensor, share: float, num_min: int, num_max: int) -> int:
    """The fewest top-scored tokens whose scores hold `share` of the total, clamped to [num_min, num_max].

    `scores` (N,) are the question's attention to each context token (`engine.blend.scoring.score_context`), so the
    share is of the attention the question pays the context (the prefix's attention sink is not counted).
    A question that looks at a few tokens gets a small budget, one that spreads its attention a larger one.
    """
    n = scores.numel()
    if n == 0:
        return 0
    ordered = torch.sort(scores.float().clamp_min(0), descending=True).values
    mass = torch.cumsum(ordered, 0)
    total = float(mass[-1])
    needed = n if total <= 0 else int(torch.searchsorted(mass, share * total).item()) + 1
    return max(min(num_min, n), min(needed, num_max, n))


@dataclass
class SelectionInput:
    """The candidate context tokens. Up-front selectors see `scores` (query) or nothing else; the
    check-layer selector sees the fresh and the stored V (or pre-RoPE K), each (kv_heads, n, D)."""

    positions: torch.Tensor  # (n,) absolute positions, ascending
    chunk_index: torch.Tensor  # (n,) which chunk of the layout each candidate belongs to
    num_keep: int
    layer: int = -1  # the check layer; -1 before the prompt pass (up-front)
    fresh: torch.Tensor | None = None
    cached: torch.Tensor | None = None
    scores: torch.Tensor | None = None  # (n,) float32 question attention per candidate (query selector)
    # How many candidates each segment holds, in order (the candidates of a segment are consecutive): known on
    # the host from the layout, so per-segment choices need no read of `chunk_index` back from a device.
    # None: counted from `chunk_index` (one read back).
    segment_sizes: tuple[int, ...] | None = None

    def sizes_per_segment(self) -> list[int]:
        if self.segment_sizes is not None:
            return list(self.segment_sizes)
        return torch.unique_consecutive(self.chunk_index, return_counts=True)[1].tolist()


class TokenSelector(Protocol):
    name: str
    upfront: bool  # True: decides before the prompt pass; False: at the check layer(s)

    def select(self, inp: SelectionInput) -> torch.Tensor:
        """Indices (into the candidates) of the `num_keep` tokens to recompute, ascending."""
        ...


def _all(inp: SelectionInput) -> torch.Tensor:
    return torch.arange(inp.positions.numel(), device=inp.positions.device)


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores, ascending; ties go to the earlier token (deterministic)."""
    n = scores.numel()
    # A stable descending sort keeps equal scores in position order, unlike topk.
    order = torch.sort(scores, descending=True, stable=True).indices
    return order[:k].sort().values if k < n else torch.arange(n, device=scores.device)


def kv_deviation(fresh: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
    """‖fresh − cached‖² per token, summed over heads and head dims: (kv_heads, n, D) → (n,) float32."""
    diff = fresh.float() - cached.float()
    return diff.pow(2).sum(dim=(0, 2))


class DeviationSelector:
    name = "deviation"
    upfront = False

    def select(self, inp: SelectionInput) -> torch.Tensor:
        if inp.num_keep >= inp.positions.numel():
            return _all(inp)
        assert inp.fresh is not None and inp.cached is not None, "deviation runs at a check layer"
        return _top(kv_deviation(inp.fresh, inp.cached), inp.num_keep)


class QuerySelector:
    """Keep the tokens the question attends to most (scores from `engine.blend.scoring.score_context`).

    `pool_window` > 1 max-pools the scores over that many neighbours first (SnapKV-style), so a token next
    to a strongly attended one can be kept too; `min_per_chunk` guarantees every chunk that many tokens
    (its own best ones) before the rest of the budget goes to the best tokens overall.
    """

    name = "query"
    upfront = True

    def __init__(self, pool_window: int = 1, min_per_chunk: int = 0) -> None:
        self.pool_window = pool_window
        self.min_per_chunk = min_per_chunk

    def select(self, inp: SelectionInput) -> torch.Tensor:
        n = inp.positions.numel()
        if inp.num_keep >= n:
            return _all(inp)
        assert inp.scores is not None, "the query selector needs the question's attention scores"
        scores = inp.scores.float()
        if self.pool_window > 1:
            w = self.pool_window
            pooled = F.max_pool1d(scores[None, None], kernel_size=w, stride=1, padding=w // 2)[0, 0]
            scores = pooled[:n]
        if self.min_per_chunk <= 0:
            return _top(scores, inp.num_keep)
        # Every chunk's own best `min_per_chunk` first (segments are runs of consecutive candidates).
        minimums, start = [], 0
        for size in inp.sizes_per_segment():
            minimums.append(start + _top(scores[start : start + size], min(self.min_per_chunk, size)))
            start += size
        kept = torch.cat(minimums)  # ascending
        if kept.numel() >= inp.num_keep:  # the minimums alone exceed the budget: best of them
            return kept[_top(scores[kept], inp.num_keep)]
        others = scores.index_fill(0, kept, float("-inf"))  # the rest of the budget among the others
        return torch.cat([kept, _top(others, inp.num_keep - kept.numel())]).sort().values


class FirstKSelector:
    """The same budget spread evenly over chunks, taken from each chunk's start."""

    name = "first_k"
    upfront = True

    def select(self, inp: SelectionInput) -> torch.Tensor:
        n = inp.positions.numel()
        if inp.num_keep >= n:
            return _all(inp)
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
    upfront = True

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def select(self, inp: SelectionInput) -> torch.Tensor:
        n = inp.positions.numel()
        gen = torch.Generator(device="cpu").manual_seed(self.seed + max(inp.layer, 0))
        return to_device(torch.randperm(n, generator=gen)[: inp.num_keep].sort().values, inp.positions.device)


def make_selector(config: BlendConfig) -> TokenSelector:
    match config.selector:
        case "query":
            return QuerySelector(pool_window=config.pool_window, min_per_chunk=config.min_per_chunk)
        case "deviation":
            return DeviationSelector()
        case "first_k":
            return FirstKSelector()
        case "random":
            return RandomSelector(config.seed)
    raise ValueError(f"unknown selector {config.selector!r}")
