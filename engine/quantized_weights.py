"""The compact forms of a GEMM's weight that decode reads (engine/decode_weights.py builds them), and their matmul.

A module of their own because both the model's weight types (engine/model.py: a GEMM's `Weight` is the model's
tensor or one of these) and the code that quantizes the model (engine/decode_weights.py, which imports the model)
name them: here, neither imports the other to know them.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

INT4_GROUP_SIZE = 32  # inputs per scale/offset pair (what Q4_0 and Q4_K's sub-blocks use)
KERNEL_DTYPE = torch.bfloat16  # the activations' dtype the CPU kernels are fast in


@dataclass(frozen=True)
class PackedInt8:
    """An Int8Weight's codes packed for oneDNN's int8 GEMM (`pack_int8`), for decode steps of many rows."""

    packed: torch.Tensor  # oneDNN's blocked layout of the (out, in) codes (`onednn.qlinear_prepack`)
    scales: torch.Tensor  # (out,) float32: the channel scales, as the GEMM applies them
    zero_points: torch.Tensor  # (out,) int64 zeros: the codes are symmetric
    min_rows: int  # calls of this many rows or more read this copy

    @property
    def num_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + 12 * self.scales.numel()


@dataclass(frozen=True)
class Int8Weight:
    """Int8 with one scale per output channel: w ≈ qweight · scales[:, None].

    Few rows read it weight-only (`_weight_int8pack_mm`, bfloat16 activations): exact but for the activations'
    bfloat16 rounding, and computed in float32 from the codes, so its cost grows with the rows beyond four.
    Where `batched` is set, calls of `batched.min_rows` rows or more quantize each row to int8 too and run one
    int8 GEMM on a packed copy of the codes (`matmul_w8a8`: oneDNN, VNNI), which reads the weights once for all
    rows and multiplies 64 int8 pairs an instruction."""

    qweight: torch.Tensor  # (out, in) int8
    scales: torch.Tensor  # (out,) bfloat16
    batched: PackedInt8 | None = None

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x (…, in) → x @ wᵀ (…, out), in x's dtype."""
        rows = x.reshape(-1, x.shape[-1])
        many = self.batched is not None and rows.shape[0] >= self.batched.min_rows
        out = self.matmul_w8a8(rows) if many else self.matmul_rows(rows)
        return out.view(*x.shape[:-1], self.out_features)

    def matmul_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (M, in) → (M, out) in rows' dtype, weight-only: the activations as bfloat16, exact otherwise."""
        out = torch.ops.aten._weight_int8pack_mm(rows.to(KERNEL_DTYPE), self.qweight, self.scales)  # bf16
        return out.to(rows.dtype)

    def matmul_w8a8(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (M, in) → (M, out) in rows' dtype, each row quantized to int8 first (symmetric, a scale of its
        own): x_m ≈ s_m · c_m with s_m = max|x_m| / 127, so x_m · w_n ≈ (c_m · qweight[n]) · scales[n] · s_m, the
        sum exact in int32. A row's result does not depend on the other rows of the call. Needs `batched`.

        oneDNN's fast int8 path takes unsigned activations: the codes go in as c + 128 with a zero point of 128
        (exact). Only where `int8_gemm_exact()` holds: without VNNI the 16-bit pair sums saturate."""
        if self.batched is None:
            raise ValueError("matmul_w8a8 needs the packed copy (pack_int8)")
        xf = rows.float()
        row_scales = xf.abs().amax(-1, keepdim=True).clamp_(min=_TINY).div_(127.0)  # (M, 1)
        codes = xf.div(row_scales).round_().add_(128.0).to(torch.uint8)  # |x / s| <= 127 by construction
        b = self.batched
        out = torch.ops.onednn.qlinear_pointwise(
            codes, 1.0, 128, b.packed, b.scales, b.zero_points, None, 1.0, 0, torch.float32, "none", [], ""
        )  # (M, out) float32: the exact int32 sums times the channel scales
        return out.mul_(row_scales).to(rows.dtype)


def pack_int8(qweight: torch.Tensor, scales: torch.Tensor, min_rows: int) -> PackedInt8:
    """The packed copy of (out, in) int8 codes that `Int8Weight.matmul_w8a8` reads."""
    return PackedInt8(
        packed=torch.ops.onednn.qlinear_prepack(qweight, None),
        scales=scales.float(),
        zero_points=torch.zeros(qweight.shape[0], dtype=torch.long),
        min_rows=min_rows,
    )


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

_TINY = torch.finfo(torch.float32).tiny  # an all-zero row's scale: its codes are 0, its output 0


@functools.cache
def int8_gemm_exact() -> bool:
    """Whether oneDNN's int8 GEMM (the kernel of `Int8Weight.matmul_w8a8`) gives exact int32 sums here.

    On a CPU without VNNI (AVX2, or AVX512 without VNNI, or oneDNN capped by ONEDNN_MAX_CPU_ISA) oneDNN multiplies
    uint8 by int8 with `vpmaddubsw`, whose pairwise 16-bit sums saturate: 255 · 127 · 2 is over 32767 and results
    were wrong by thousands (torch 2.13 under the AVX2 cap). The probe computes that case (every product at its
    largest) and compares it with exact integer arithmetic; where it fails, decode keeps the weight-only kernel
    for every batch (engine/decode_weights.py)."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        return False
    codes = torch.full((16, 64), 127, dtype=torch.int8)
    codes[1::2] = -127
    x = torch.full((4, 64), 127.0)
    x[1::2] = -127.0
    try:
        weight = Int8Weight(codes, torch.ones(16, dtype=KERNEL_DTYPE), pack_int8(codes, torch.ones(16), 1))
        got = weight.matmul_w8a8(x)
    except RuntimeError as exc:  # a build whose oneDNN int8 GEMM refuses these shapes
        logger.info("oneDNN's int8 GEMM is not usable here (%s): decode reads weight-only int8 only", exc)
        return False
    exact = torch.equal(got, (x.long() @ codes.long().t()).float())
    if not exact:
        logger.info("oneDNN's int8 GEMM is not exact on this CPU (no VNNI): decode reads weight-only int8 only")
    return exact
