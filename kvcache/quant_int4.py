"""4-bit grouped asymmetric quantization of one entry's K and V (`storage_dtype: int4`).

Each group of values x shares an fp16 scale s and an fp16 zero point z and is stored as 4-bit codes
q in 0..15 with x ≈ q * s + z. The groups follow each tensor's outlier structure (KIVI, KVQuant):

- K (pre-RoPE) has a few channels with large magnitudes across all tokens, so K is quantized *per
  channel*: a group is one (head, channel) over a run of `k_group` consecutive tokens. Scales and
  zeros: (kv_heads, num_k_groups, head_dim).
- V has no such channels, so V is quantized *per token*: a group is `v_group` consecutive channels of
  one token, counted over the token's values of all heads in order (head 0's channels, then head
  1's, ...), `v_group` being the largest divisor of kv_heads * head_dim not above the target.
  Scales and zeros: (num_tokens, kv_heads * head_dim / v_group).

The token groups of K are balanced: a chunk of T tokens gets n = max(1, round(T / k_group_target))
groups of ceil(T / n) tokens (the last may be shorter), so a chunk slightly longer than the target
does not pay for a nearly empty second group.

Codes are packed two a byte along head_dim: byte j of a row holds channel 2j in its low nibble and
channel 2j + 1 in its high nibble, so K and V are uint8 (kv_heads, num_tokens, head_dim / 2).

Error bound (exact, from the definition): z is min(group) rounded *down* to fp16 and s is
(max(group) - z) / 15 rounded *up* to fp16, so every x of the group lies in [z, z + 15 s] and
q = clamp(round((x - z) / s), 0, 15) reconstructs it within s / 2 (plus float32 rounding of q * s + z).
A constant group gets s = 0 and reconstructs to z, within fp16 rounding of its value.

Public API:
- `k_group_tokens(num_tokens, target)`, `v_group_channels(kv_heads, head_dim, target)`,
  `quantize_int4(x, *, kind, k_group_target, v_group) -> Int4Quantized`
- `pack_nibbles(q)`, `unpack_nibbles(packed)` (lossless inverses)
- `dequantize_int4(q4, kind, dtype)` (torch, any device) and `host_dequantize_int4(dst, ...)` (CPU, torch
  on the calling thread only, straight into the compute dtype, for the layer loader's worker; see
  `kvcache.hostcopy` for why one thread).
- `dequantize_int4_spans(dst, parts, kind)` (any device): one layer of several entries side by side along tokens
  (a prompt's chunks) in a few whole-layer ops on the caller's torch threads, for the request thread.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from kvcache.hostcopy import one_torch_thread

INT4_LEVELS = 15  # codes 0..15
SCALE_DTYPE = torch.float16
Kind = Literal["k", "v"]


@dataclass
class Int4Quantized:
    """One tensor in int4 storage form (shapes for one layer; a leading layer dim is allowed)."""

    packed: torch.Tensor  # uint8 (..., kv_heads, num_tokens, head_dim / 2)
    scale: torch.Tensor  # fp16: K (..., kv_heads, num_k_groups, head_dim); V (..., num_tokens, num_v_groups)
    zero: torch.Tensor  # fp16, same shape as scale
    group: int  # K: tokens per group; V: channels per group


def k_group_tokens(num_tokens: int, target: int) -> int:
    """Tokens per K group for a chunk of `num_tokens` (balanced groups near `target`)."""
    if num_tokens <= 0 or target <= 0:
        raise ValueError("num_tokens and target must be positive")
    num_groups = max(1, round(num_tokens / target))
    return math.ceil(num_tokens / num_groups)


def num_k_groups(num_tokens: int, group: int) -> int:
    return math.ceil(num_tokens / group)


def v_group_channels(kv_heads: int, head_dim: int, target: int) -> int:
    """Channels per V group: the largest divisor of kv_heads * head_dim not above `target`."""
    width = kv_heads * head_dim
    return max(d for d in range(1, min(target, width) + 1) if width % d == 0)


def check_v_group(kv_heads: int, head_dim: int, v_group: int) -> None:
    if v_group <= 0 or (kv_heads * head_dim) % v_group:
        raise ValueError(f"v_group {v_group} must divide kv_heads * head_dim = {kv_heads * head_dim}")


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 (..., D) with D even -> (..., D / 2): low nibble even channel, high odd."""
    if q.shape[-1] % 2:
        raise ValueError(f"int4 packing needs an even last dimension, got {q.shape[-1]}")
    q = q.to(torch.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).contiguous()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_nibbles`: (..., D / 2) uint8 -> (..., D) uint8 codes."""
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _fp16_down(x: torch.Tensor) -> torch.Tensor:
    """x (float32) rounded to fp16 towards -inf."""
    h = x.to(SCALE_DTYPE)
    return torch.where(h.to(torch.float32) > x, torch.nextafter(h, torch.full_like(h, -math.inf)), h)


def _fp16_up(x: torch.Tensor) -> torch.Tensor:
    """x (float32, >= 0) rounded to fp16 towards +inf."""
    h = x.to(SCALE_DTYPE)
    return torch.where(h.to(torch.float32) < x, torch.nextafter(h, torch.full_like(h, math.inf)), h)


def _quantize_groups(xg: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """xg (..., n, g) float32 -> codes (..., n, g) uint8, scale and zero (..., n) fp16.

    `valid` (n, g) bool marks real values (False: padding of a short last group, ignored)."""
    if valid is None:
        lo, hi = xg.amin(dim=-1), xg.amax(dim=-1)
    else:
        lo = torch.where(valid, xg, torch.full_like(xg, math.inf)).amin(dim=-1)
        hi = torch.where(valid, xg, torch.full_like(xg, -math.inf)).amax(dim=-1)
    zero = _fp16_down(lo)
    scale = _fp16_up((hi - zero.to(torch.float32)) / INT4_LEVELS)
    if not (torch.isfinite(zero).all() and torch.isfinite(scale).all()):
        raise ValueError("values exceed fp16's range: int4 scales cannot hold them (use bf16 storage)")
    s = scale.to(torch.float32)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round((xg - zero.to(torch.float32).unsqueeze(-1)) / safe.unsqueeze(-1)).clamp_(0, INT4_LEVELS)
    return q.to(torch.uint8), scale, zero


def quantize_int4(x: torch.Tensor, *, kind: Kind, k_group_target: int = 128, v_group: int = 64) -> Int4Quantized:
    """Quantize K (`kind="k"`, per channel) or V (`kind="v"`, per token) of shape (..., H, T, D)."""
    if x.dim() < 3:
        raise ValueError(f"expected (..., kv_heads, num_tokens, head_dim), got {tuple(x.shape)}")
    xf = x.detach().to("cpu", torch.float32)
    if not torch.isfinite(xf).all():
        raise ValueError(f"{kind} has non-finite values")
    *lead, heads, tokens, dim = xf.shape
    if kind == "k":
        group = k_group_tokens(tokens, k_group_target)
        n = num_k_groups(tokens, group)
        pad = n * group - tokens
        xt = xf.transpose(-1, -2)  # (..., H, D, T): a group runs along tokens
        if pad:
            xt = torch.nn.functional.pad(xt, (0, pad))
        xg = xt.reshape(*lead, heads, dim, n, group)
        valid = None
        if pad:
            valid = torch.ones(n, group, dtype=torch.bool)
            valid[-1, group - pad :] = False
        q, scale, zero = _quantize_groups(xg, valid)  # q (..., H, D, n, g); scale (..., H, D, n)
        codes = q.reshape(*lead, heads, dim, n * group)[..., :tokens].transpose(-1, -2)  # (..., H, T, D)
        scale, zero = scale.transpose(-1, -2), zero.transpose(-1, -2)  # (..., H, n, D)
    elif kind == "v":
        group = v_group_channels(heads, dim, v_group)
        n = heads * dim // group
        xt = xf.movedim(-3, -2).reshape(*lead, tokens, n, group)  # (..., T, H*D) in groups
        q, scale, zero = _quantize_groups(xt, None)  # q (..., T, n, g); scale (..., T, n)
        codes = q.reshape(*lead, tokens, heads, dim).movedim(-2, -3)  # (..., H, T, D)
    else:
        raise ValueError(f"kind must be 'k' or 'v', not {kind!r}")
    return Int4Quantized(packed=pack_nibbles(codes), scale=scale.contiguous(), zero=zero.contiguous(), group=group)


def _expand(scale: torch.Tensor, kind: Kind, heads: int, tokens: int, dim: int, group: int) -> torch.Tensor:
    """Per-group fp16 parameters (one layer) broadcast to (H, T, D) float32."""
    s = scale.to(torch.float32)
    if kind == "k":  # (H, n, D) -> (H, T, D)
        return s.repeat_interleave(group, dim=-2)[..., :tokens, :]
    # (T, n) -> (T, H*D) -> (H, T, D)
    return s.repeat_interleave(group, dim=-1).reshape(tokens, heads, dim).transpose(0, 1)


def dequantize_int4(q4: Int4Quantized, kind: Kind, dtype: torch.dtype) -> torch.Tensor:
    """One layer's (H, T, D) values in `dtype`, computed on the tensors' device."""
    codes = unpack_nibbles(q4.packed).to(torch.float32)  # (H, T, D)
    heads, tokens, dim = codes.shape
    scale = _expand(q4.scale, kind, heads, tokens, dim, q4.group)
    zero = _expand(q4.zero, kind, heads, tokens, dim, q4.group)
    return (codes * scale + zero).to(dtype)


def _apply(out: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, kind: Kind, group: int) -> None:
    """out (H, T, D) float32 codes -> out * scale + zero in place, broadcasting the float32 group parameters
    (views only, no (H, T, D)-sized temporaries; a multiply then an add, as `dequantize_int4` rounds)."""
    heads, tokens, dim = out.shape
    if kind == "k":  # (H, n, D): one slice of `group` tokens per K group
        for i in range(scale.shape[1]):
            part = out[:, i * group : (i + 1) * group]
            part.mul_(scale[:, i : i + 1]).add_(zero[:, i : i + 1])
        return
    if dim % group == 0:  # V groups within a head: (T, H * D / g) -> (H, T, D / g, 1)
        shape = (tokens, heads, dim // group)
        s = scale.reshape(shape).transpose(0, 1)[..., None]
        z = zero.reshape(shape).transpose(0, 1)[..., None]
        out.view(heads, tokens, dim // group, group).mul_(s).add_(z)  # a view: only the last axis is split
    elif group % dim == 0:  # V groups spanning whole heads: head h is in group h // (g / D)
        which = torch.arange(heads, device=out.device) // (group // dim)
        out.mul_(scale.T[which][:, :, None]).add_(zero.T[which][:, :, None])
    else:  # a group boundary inside a head: spell the parameters out per value
        out.mul_(_expand(scale, kind, heads, tokens, dim, group)).add_(_expand(zero, kind, heads, tokens, dim, group))


def host_dequantize_int4(
    dst: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, kind: Kind, group: int
) -> None:
    """dst (H, T, D) CPU tensor or view, float32 or the compute dtype (bf16, fp16) = dequantized values,
    bit for bit `dequantize_int4`'s.

    Torch's vectorised kernels on the calling thread alone (the layer loader's worker: no OpenMP team to
    compete with the engine's, see `kvcache.hostcopy`): in bf16 this is several times faster than the
    numpy passes it replaces, which dequantized into a float32 temporary and rounded it to bf16 bits in
    numpy, on the critical path of every cached prompt pass.
    """
    heads, tokens, half = packed.shape
    with one_torch_thread():
        codes = torch.empty(heads, tokens, half, 2, dtype=torch.uint8)  # (H, T, D / 2, 2): channels 2j, 2j + 1
        torch.bitwise_and(packed, 0x0F, out=codes[..., 0])
        torch.bitwise_right_shift(packed, 4, out=codes[..., 1])
        out = dst if dst.dtype == torch.float32 else torch.empty(dst.shape, dtype=torch.float32)
        out.copy_(codes.view(heads, tokens, 2 * half))
        _apply(out, scale.to(torch.float32), zero.to(torch.float32), kind, group)
        if out is not dst:
            dst.copy_(out)  # round to nearest even, as `.to(dtype)` does


def _unpack_to(out: torch.Tensor, packed: torch.Tensor) -> None:
    """out (H, T, D) float32 = the codes of packed (H, T, D / 2) uint8, in three whole-tensor passes.

    Each byte is widened to an int16 holding its low nibble in the low byte and its high nibble in the high
    byte: in memory (little-endian) that is channel 2j then channel 2j + 1, so the int16 tensor read as
    bytes is the codes in channel order, with no strided write of every other channel.
    """
    if sys.byteorder != "little":
        out.copy_(unpack_nibbles(packed))
        return
    wide = packed.to(torch.int16)
    pairs = (wide & 0x0F).bitwise_or_((wide >> 4) << 8)  # (H, T, D / 2): lo | hi << 8
    out.copy_(pairs.view(torch.uint8))


def dequantize_int4_spans(dst: torch.Tensor, parts: Sequence[Int4Quantized], kind: Kind) -> None:
    """dst (H, N, D) tensor or view of float32 or the compute dtype = the parts' values side by side along
    tokens (N = their tokens), bit for bit `dequantize_int4` of each part. Any device: the parts live where
    `dst` does (on an accelerator, `kvcache.staging` dequantizes a prompt's layer with it after one copy).

    A prompt's chunks are dequantized together: the codes are unpacked, widened and rounded to `dst`'s dtype
    in whole-layer ops, V's groups scaled in one pass, K's group by group on views of the layer, with no
    per-entry temporaries; the whole-layer ops are large enough for torch's own threads. That is for the
    request thread, which has the cores to itself between two layers; the loader's worker keeps
    `host_dequantize_int4` (one thread, beside the engine's compute).
    """
    heads, tokens, dim = dst.shape
    if sum(p.packed.shape[1] for p in parts) != tokens:
        raise ValueError("the parts' tokens do not add up to dst's")
    out = dst if dst.dtype == torch.float32 else torch.empty(dst.shape, dtype=torch.float32, device=dst.device)
    _unpack_to(out, torch.cat([p.packed for p in parts], dim=1) if len(parts) > 1 else parts[0].packed)
    if kind == "k":  # each part's K groups in place, on views of its tokens' rows
        start = 0
        for p in parts:
            end = start + p.packed.shape[1]
            _apply(out[:, start:end], p.scale.to(torch.float32), p.zero.to(torch.float32), "k", p.group)
            start = end
    else:
        groups = {p.group for p in parts}
        if len(groups) != 1:
            raise ValueError(f"V parts with different channel groups {sorted(groups)}")
        scale = torch.cat([p.scale for p in parts]).to(torch.float32)  # (N, H * D / g)
        zero = torch.cat([p.zero for p in parts]).to(torch.float32)
        _apply(out, scale, zero, "v", groups.pop())
    if out is not dst:
        dst.copy_(out)  # round to nearest even, as `.to(dtype)` does
