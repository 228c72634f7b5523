"""The working cache's key bias, built from a plan's `KeyBiasPlan` once the recomputed rows are known."""

from __future__ import annotations

import torch

from engine.blend.plan import KeyBiasPlan


def key_bias_tensor(
    plan: KeyBiasPlan, selected: torch.Tensor, capacity: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """(capacity,) −plan.value at the planned stored keys, 0 elsewhere and at the `selected` positions (rows the
    pass recomputes are exact). Every row computed over the cache adds it to its logits, decode included."""
    key_bias = torch.zeros(capacity, dtype=dtype, device=device)
    for start, stop in plan.ranges:
        key_bias[start:stop] = -plan.value
    key_bias[selected] = 0.0
    return key_bias
