"""Completing a plan's choice on the device: the rows an up-front selector picks among its candidates, and the
rows a check-layer selector keeps. Every count comes from the plan (host); only the choice reads the scores."""

from __future__ import annotations

import torch

from engine.blend.plan import BlendPlan, CheckLayer, UpfrontGroup
from engine.blend.selectors import SelectionInput, TokenSelector, adaptive_num_keep
from engine.host_sync import ids_on, to_device


def segment_index(plan: BlendPlan, device: torch.device) -> torch.Tensor:
    """(N,) the segment number of every context token (built on the host, copied without a sync)."""
    sizes = torch.tensor(plan.segment_sizes, dtype=torch.int64)
    index = torch.repeat_interleave(torch.arange(len(sizes)), sizes, output_size=plan.num_context_tokens)
    return to_device(index, device)


def group_budget(group: UpfrontGroup, scores: torch.Tensor | None) -> int:
    """The group's budget: the planned one, or the adaptive one read from the scores (one read back)."""
    if group.num_budget is not None:
        return group.num_budget
    assert group.adaptive is not None and scores is not None, "an adaptive budget needs the query scores"
    adaptive = group.adaptive
    return adaptive_num_keep(scores[: adaptive.num_scored], adaptive.share, adaptive.num_min, adaptive.num_max)


def choose_upfront(
    plan: BlendPlan, selector: TokenSelector, scores: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """Context positions an up-front blend recomputes, ascending: each group's forced rows, then the selector's
    pick among its candidates."""
    p = plan.num_prefix_tokens
    index = segment_index(plan, device)
    forced: list[int] = []
    picked: list[torch.Tensor] = []
    for group in plan.groups:
        budget = group_budget(group, scores)
        forced.extend(group.forced(budget))
        num_pick = group.num_pick(budget)
        if num_pick <= 0:
            continue
        candidates = ids_on(list(group.candidates), device)
        if num_pick == len(group.candidates):  # the whole rest fits: nothing to choose
            picked.append(candidates)
            continue
        chosen = selector.select(
            SelectionInput(
                positions=candidates + p,
                chunk_index=index[candidates],
                num_keep=num_pick,
                scores=None if scores is None else scores[candidates],
                segment_sizes=tuple(size for size in group.candidate_sizes if size),
            )
        )
        picked.append(candidates[chosen])
    offsets = torch.cat([ids_on(forced, device), *picked])  # (rows over all groups,)
    return offsets.sort().values + p


def keep_at_check(
    check: CheckLayer,
    selector: TokenSelector,
    positions: torch.Tensor,
    num_ctx_rows: int,
    index: torch.Tensor,
    fresh: torch.Tensor,
    stored: torch.Tensor,
    num_prefix_tokens: int,
) -> torch.Tensor | None:
    """Row indices (into the current rows) that stay fresh after a check layer; None keeps all.

    The current rows are the `num_ctx_rows` context rows still recomputed (ascending), then the suffix rows
    (always kept): every count is on the host, only the choice among the context rows is on the device.
    `fresh` (1, kv_heads, rows, D) and `stored` (kv_heads, N, D): the layer's V (or pre-RoPE K)."""
    num_keep = min(num_ctx_rows, check.num_keep)
    if num_keep == num_ctx_rows:
        return None
    ctx_pos = positions[:num_ctx_rows]
    offsets = ctx_pos - num_prefix_tokens
    inp = SelectionInput(
        layer=check.layer,
        positions=ctx_pos,
        chunk_index=index[offsets],
        fresh=fresh[0][:, :num_ctx_rows],
        cached=stored[:, offsets],
        num_keep=num_keep,
    )
    kept = selector.select(inp)  # ascending indices into the context rows
    suffix_rows = torch.arange(num_ctx_rows, positions.shape[0], device=positions.device)
    return torch.cat([kept, suffix_rows])
