"""Reciprocal rank fusion (Cormack et al., 2009): score(d) = Σ_i w_i / (k + rank_i(d)), ranks from 1.

RRF needs no score calibration between rankers (cosine vs BM25), which is why hybrid search uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FusedHit:
    chunk_id: int
    score: float
    ranks: tuple[int | None, ...]  # 1-based rank in each input ranking, None where absent


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[int]], k: int = 60, weights: Sequence[float] | None = None, limit: int | None = None
) -> list[FusedHit]:
    """Fuse rankings of ids (best first). Only an id's first occurrence in a ranking counts.

    Order: fused score, then best single rank, then smaller id — fully deterministic.
    """
    if k <= 0:
        raise ValueError("k must be positive")
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError("one weight per ranking")
    ranks: dict[int, list[int | None]] = {}
    for position, ranking in enumerate(rankings):
        for rank, chunk_id in enumerate(ranking, start=1):
            slots = ranks.setdefault(chunk_id, [None] * len(rankings))
            if slots[position] is None:
                slots[position] = rank
    hits = [
        FusedHit(
            chunk_id,
            sum(weight / (k + rank) for weight, rank in zip(weights, slots, strict=True) if rank is not None),
            tuple(slots),
        )
        for chunk_id, slots in ranks.items()
    ]
    hits.sort(key=lambda hit: (-hit.score, min(r for r in hit.ranks if r is not None), hit.chunk_id))
    return hits[:limit] if limit is not None else hits
