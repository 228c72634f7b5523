"""Single-threaded host-side copies and dtype conversions for the layer loader.

Why not `dst.copy_(src)`: torch parallelises a copy of more than 32k elements over its OpenMP team.
From the prefetch thread that team competes with the engine's own compute threads for the same cores,
and an OpenMP barrier waiting on a descheduled thread is catastrophic: on this 2-core machine under
load, 360 small fp16->fp32 slice copies (one 6-chunk prompt) took 2.6 s through torch vs 87 ms through
numpy, which never spawns threads. Combinations numpy cannot do (fp16 <-> bf16 targets) fall back to
torch.

    host_copy(dst, src)                       # dst[...] = src in dst's dtype; dst may be a strided view
    host_dequantize(dst, q, scale)            # dst[...] = q * scale[..., None] (int8 entries)
    all_finite(t) -> bool                     # no inf / nan (fp16/bf16 checked on their exponent bits)
    with one_torch_thread(): ...              # torch ops on the calling thread only (entry encoding)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Torch ops inside run on the calling thread alone (OpenMP thread counts are per calling thread).

    Encoding an entry (int4/int8 quantization: a few dozen element-wise passes over ~10^6 values) runs on
    the ingest or request thread while the engine computes on all cores: with its own OpenMP team it waits
    at a barrier on every op whenever a peer thread is descheduled (5x slower on a busy 2-core machine).
    """
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _np(t: torch.Tensor) -> np.ndarray:
    """A numpy view sharing memory with a CPU tensor (bf16 appears as its uint16 bit patterns)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def host_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    sd, dd = src.dtype, dst.dtype
    if dst.device.type != "cpu" or src.device.type != "cpu" or dst.shape != src.shape:
        dst.copy_(src)
    elif sd == dd or (sd, dd) in ((torch.float16, torch.float32), (torch.float32, torch.float16)):
        with np.errstate(over="ignore"):  # fp32 -> fp16 overflow gives inf, as in torch; callers check
            _np(dst)[...] = _np(src)  # same-dtype memcpy, or numpy's exact IEEE half <-> single
    elif sd == torch.bfloat16 and dd == torch.float32:
        # bf16 is the upper half of a float32: widening is exact as a 16-bit shift
        np.left_shift(_np(src), 16, out=_np(dst).view(np.uint32), dtype=np.uint32)
    elif sd == torch.float32 and dd == torch.bfloat16:
        _np(dst)[...] = _float32_to_bf16_bits(_np(src))
    else:
        dst.copy_(src)


def _float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, rounded to nearest even as torch rounds (NaN stays a quiet NaN)."""
    bits = x.view(np.uint32) if x.flags.c_contiguous else np.ascontiguousarray(x).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = (bits[nan] >> 16).astype(np.uint16) | np.uint16(0x0040)
    return out


def host_dequantize(dst: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    """dst (..., head_dim) = q (int8, same shape) * scale (...,) float32, like `quant.dequantize_int8`."""
    if dst.dtype == torch.float32 and dst.device.type == "cpu":
        np.multiply(_np(q), _np(scale)[..., None], out=_np(dst), dtype=np.float32)
        return
    tmp = torch.empty(q.shape, dtype=torch.float32)
    np.multiply(_np(q), _np(scale)[..., None], out=_np(tmp), dtype=np.float32)
    host_copy(dst, tmp)


def all_finite(t: torch.Tensor) -> bool:
    """torch.isfinite(t).all() without torch's threads; fp16 on CPU is also ~50x faster on its bits."""
    if t.device.type != "cpu":
        return bool(torch.isfinite(t).all())
    t = t.contiguous()
    if t.dtype == torch.float16:  # inf / nan <=> all five exponent bits set
        return not bool(np.any((_np(t).view(np.uint16) & 0x7C00) == 0x7C00))
    if t.dtype == torch.bfloat16:  # eight exponent bits
        return not bool(np.any((_np(t) & 0x7F80) == 0x7F80))
    if t.dtype in (torch.float32, torch.float64):
        return bool(np.isfinite(_np(t)).all())
    return bool(torch.isfinite(t).all())
