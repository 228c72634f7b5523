"""The compact forms of a GEMM's weight that decode reads (engine/decode_weights.py builds them), and their matmul.

A module of their own because both the model's weight types (engine/model.py: a GEMM's `Weight` is the model's
tensor or one of these) and the code that quantizes the model (engine/decode_weights.py, which imports the model)
name them: here, neither imports the other to know them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT4_GROUP_SIZE = 32  # inputs per scale/offset pair (what Q4_0 and Q4_K's sub-blocks use)
KERNEL_DTYPE = torch.bfloat16  # the activations' dtype the CPU kernels are fast in


@dataclass(frozen=True)
class Int8Weight:
    """Weight-only int8 with one scale per output channel: w ≈ qweight · scales[:, None]."""

    qweight: torch.Tensor  # (out, in) int8
    scales: torch.Tensor  # (out,) bfloat16

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x (…, in) → x @ wᵀ (…, out), in x's dtype."""
        rows = x.reshape(-1, x.shape[-1]).to(KERNEL_DTYPE)
        out = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self.scales)  # (rows, out) bf16
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)


@dataclass(frozen=True)
class Int4Weight:
    """Weight-only int4, asymmetric per group of INT4_GROUP_SIZE inputs: w ≈ (q - 8) · scale + zero."""

    packed: torch.Tensor  # the CPU kernel's packed layout (from `_convert_weight_to_int4pack_for_cpu`)
    scales_zeros: torch.Tensor  # (in / group, out, 2) bfloat16: scale and zero of each group
    out_features: int

    @property
    def in_features(self) -> int:
        return self.scales_zeros.shape[0] * INT4_GROUP_SIZE

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(KERNEL_DTYPE)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, INT4_GROUP_SIZE, self.scales_zeros)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)


QuantizedWeight = Int8Weight | Int4Weight
