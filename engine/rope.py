"""Rotary position embedding with a cos/sin table computed once and grown on demand.

Inverse frequencies (and the attention scaling of YaRN-like types) come from transformers' own RoPE
init functions, so Llama-3.1's "llama3" scaling, "linear", "yarn" … match the reference exactly. The
rotation itself is the "rotate half" convention of HF Llama checkpoints.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_UNSUPPORTED = ("dynamic", "longrope")  # their frequencies depend on the sequence length


def rope_inv_freq(hf_config: Any, head_dim: int, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim/2,) float32, attention_scaling) for a transformers config. `layer_type`: for a config
    whose RoPE differs per layer type (Gemma 3: `rope_parameters` keyed by "full_attention" / "sliding_attention"),
    that type's."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    if layer_type is not None:
        params = params[layer_type]
    if "rope_theta" not in params and hasattr(hf_config, "rope_theta"):  # transformers 4.x configs
        params = {
            "rope_type": "default",
            "rope_theta": hf_config.rope_theta,
            **(getattr(hf_config, "rope_scaling", None) or {}),
        }
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in _UNSUPPORTED:
        raise ValueError(f"rope type {rope_type!r} is not supported (sequence-length dependent)")
    if rope_type == "default":
        base = float(params.get("rope_theta", 10000.0))
        dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        if dim != head_dim:
            raise ValueError("partial rotary embeddings are not supported")
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        return inv_freq, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"), **kwargs)
    if inv_freq.numel() * 2 != head_dim:
        raise ValueError("partial rotary embeddings are not supported")
    return inv_freq.float(), float(scaling)


class RopeTable:
    """cos/sin per absolute position, half width: (max_pos, head_dim/2) in the model dtype."""

    def __init__(
        self,
        inv_freq: torch.Tensor,
        attention_scaling: float,
        dtype: torch.dtype,
        device: torch.device,
        initial_positions: int = 4096,
    ) -> None:
        self.inv_freq = inv_freq.to(device=device, dtype=torch.float32)
        self.attention_scaling = attention_scaling
        self.dtype = dtype
        self.device = device
        self._lock = threading.Lock()
        self.cos = torch.empty(0, inv_freq.numel(), dtype=dtype, device=device)
        self.sin = torch.empty_like(self.cos)
        self.ensure(initial_positions)

    def ensure(self, num_positions: int) -> None:
        if num_positions <= self.cos.shape[0]:
            return
        with self._lock:
            if num_positions <= self.cos.shape[0]:
                return
            size = max(num_positions, 2 * self.cos.shape[0])
            # Same arithmetic as HF: fp32 outer product, then cos/sin, scaled, cast to the model dtype.
            t = torch.arange(size, device=self.device, dtype=torch.int64).float()
            freqs = torch.outer(t, self.inv_freq)  # (size, head_dim/2)
            cos = (freqs.cos() * self.attention_scaling).to(self.dtype)
            sin = (freqs.sin() * self.attention_scaling).to(self.dtype)
            self.cos, self.sin = cos, sin  # replaced atomically: readers keep their old (valid) tables

    def at(self, positions: torch.Tensor | slice, bound: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin rows for the given positions: (n, head_dim/2) each. `bound`: a number every position is
        below, known on the host (without it the table's size is checked against the largest position, a value
        read back from the positions' device)."""
        if isinstance(positions, slice):
            self.ensure(positions.stop)
            return self.cos[positions], self.sin[positions]
        if bound is not None:
            self.ensure(bound)
        else:
            self.ensure(int(positions.max()) + 1 if positions.numel() else 0)
        cos, sin = self.cos, self.sin  # one snapshot: another thread may grow the table meanwhile
        return cos.index_select(0, positions), sin.index_select(0, positions)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """HF's x·cos + rotate_half(x)·sin, with cos/sin of half width broadcastable to x's halves:
    x (kv_heads, n, D) with cos (n, D/2), or x (B, n, heads, D) with cos (n, 1, D/2).

    Written half by half (same roundings as the reference, so results are bit-identical to it), into
    `out` when given: the stored chunk K is rotated straight into the working cache, with no copy.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out1, out2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=out1)
    out1.sub_(x2 * sin)
    torch.mul(x2, cos, out=out2)
    out2.add_(x1 * sin)
    return out
