"""Symmetric int8 quantization with one scale per (head, token) row.

`quantize_int8(x)` maps x (..., head_dim) to int8 q and float32 scale (...,) with
scale = absmax(row) / 127 and q = round(x / scale); `dequantize_int8` gives q * scale, whose error is at
most scale / 2 per element (plus float32 rounding). A row of zeros gets scale 0 and dequantizes to 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT8_MAX = 127


@dataclass
class Int8Quantized:
    q: torch.Tensor  # int8, same shape as the input, e.g. (kv_heads, T, head_dim)
    scale: torch.Tensor  # float32, the input's shape without the last dim, e.g. (kv_heads, T)


def quantize_int8(x: torch.Tensor) -> Int8Quantized:
    xf = x.to(torch.float32)
    scale = xf.abs().amax(dim=-1) / INT8_MAX
    # all-zero rows: divide by 1 instead of 0; their q is 0 either way
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(xf / safe.unsqueeze(-1)).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return Int8Quantized(q=q.contiguous(), scale=scale.contiguous())


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.to(torch.float32) * scale.to(torch.float32).unsqueeze(-1)).to(dtype)
