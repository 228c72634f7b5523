"""bfloat16 GEMM weights packed once for oneDNN, on CPUs with native bf16 matrix units (AMX, AVX512-BF16).

Why: torch's CPU `F.linear` in bfloat16 hands the weight to oneDNN in its plain (out, in) layout, and oneDNN
reorders it into its blocked layout on every call. For a prompt pass of thousands of rows that reorder is a
few percent; for the few rows the blend, the question-scoring pass, reuse and decode compute, it is much of
the call: one Qwen2.5-0.5B gate/up GEMM (896 → 9728) over 45 rows took 6.0 ms plain and 3.1 ms packed on one
thread. End to end on two threads it bought nothing measurable (a prompt pass of 3.5k tokens, full, reuse and
blend within ±10% either way, SmolLM2's full prefill slower packed: docs/benchmarks.md, "Packed weights"), so
`engine.pack_weights` is off by default. The result is the same kernel's, bit for bit
(tests/engine/test_packed_linear.py).

The packing op and the linear that reads it are torch's own (`torch.ops.mkldnn`, what torch.compile's
CPU freezing pass uses); where they are missing (a torch without oneDNN, a CPU without bf16 units, CUDA,
float32) nothing is packed and `linear` is `F.linear`.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from engine.model import ModelWeights

logger = logging.getLogger(__name__)

# The batch size oneDNN is told to expect. A large one keeps the kernel that plain F.linear uses for any
# row count (bit-identical results); a hint of 1 picks another kernel with another summation order.
_PACK_FOR_ROWS = 4096
_PACKED_FIELDS = ("wqkv", "wo", "w_gate_up", "w_down")  # the per-layer GEMMs; lm_head stays plain (below)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether bf16 weights on this device can be packed for oneDNN's bf16 kernels."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def pack_weights(weights: ModelWeights) -> int:
    """Replace every layer's GEMM weights by oneDNN-packed copies, in place; returns how many were packed.

    The LM head is left plain: it is usually tied to the embedding table (packing would keep a second copy
    of the model's largest matrix) and it runs for one row per step, where the call is bound by reading
    the matrix, not by its reorder.
    """
    num_packed = 0
    for layer in weights.layers:
        for name in _PACKED_FIELDS:
            weight = getattr(layer, name)
            setattr(layer, name, torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_FOR_ROWS))
            num_packed += 1
    return num_packed


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (…, in) @ weightᵀ + bias, whichever layout the weight is in."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
