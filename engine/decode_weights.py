"""The weights decode reads, in the form the CPU reads fastest: int8 (or int4) weight-only copies of the GEMMs.

Why: a decode step feeds one token per request through every layer, so it reads every weight once and does
little arithmetic with it. On a CPU it is bound by memory bandwidth: Qwen2.5-0.5B holds 630M parameters, 2.5 GB
in float32 and 1.26 GB in bfloat16, which two cores stream at ~15 GB/s (60-150 ms a token). Weight-only int8
(one scale per output channel) reads a quarter of float32's bytes and int4 (an offset and a scale per group of
32 inputs) an eighth. torch ships both kernels for the CPU (`aten._weight_int8pack_mm`,
`aten._weight_int4pack_mm_for_cpu`: what gpt-fast and torchao use); they take bfloat16 activations (the only
fast path on both AVX2 and AVX512 CPUs: docs/benchmarks.md, "Decode"), so an input in another dtype is cast
to bfloat16 on the way in and the output back.

Only decode reads these copies. The prompt pass (full prefill, the blend, chunk precompute, the question's
scoring) keeps the weights its tests pin, so the first token and every stored chunk's KV are unchanged; the
decoded tokens come from the compact copy (their K/V too). What that costs in answer quality is measured in
`python -m bench decode` (per-token KL against the same-weights decode, greedy agreement, look-ups).

The quantized tensors are computed once per model and dtype and cached in the model cache
(`<models dir>/.decode-weights/<fingerprint>-<format>.safetensors`); a later start reads them back. Two
processes starting on one model cache quantize once: the one that finds no file quantizes under the cache's file
lock (engine/models/cache.py), the other waits on it and reads the file the first stored.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from engine.model import LayerWeights, LoadedModel, ModelWeights, Weight
from engine.models.cache import conversion_lock
from engine.quantized_weights import (
    INT4_GROUP_SIZE,
    KERNEL_DTYPE,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    int8_gemm_exact,
    pack_int8,
)
from fsio.atomic import atomic_path

logger = logging.getLogger(__name__)

DecodeWeightsName = Literal["auto", "same", "int8", "int4"]
WeightFormat = Literal["same", "int8", "int4"]
# The layers' GEMMs and the LM head are quantized; norms, biases and the embedding table (a row lookup) are not.
GEMM_FIELDS = ("wqkv", "wo", "w_gate_up", "w_down")
# Below this many GEMM parameters a decode step is bound by its fixed costs, not by reading weights: compact
# copies buy nothing and `auto` keeps the model's own (a tiny test model decodes exactly as it prefills).
AUTO_MIN_PARAMETERS = 50_000_000
# The most requests one decode step feeds through the compact weights; a larger batch reads the model's own.
# The weight-only CPU kernels compute in float32 from the codes, so their cost grows with the rows beyond four,
# while a bfloat16 GEMM reads its weights once for all rows. Over Qwen2.5-0.5B's 24 layers on two AVX512-BF16
# cores (scripts/decode_kernels.py; docs/benchmarks.md, "Decode"), ms for 1 / 4 / 8 / 16 rows: int8 20.4 / 19.8
# / 40.4 / 69.1, int4 10.5 / 15.7 / 39.0 / 67.0, bfloat16 50.5 / 52.6 / 53.4 / 64.4. float32 GEMMs are slower
# than either form at every batch measured. Where the int8 GEMM is exact (`int8_gemm_exact`: VNNI), int8 steps
# of W8A8_MIN_ROWS rows or more quantize the rows too and run one int8 GEMM on a packed copy of the codes
# (`Int8Weight.matmul_w8a8`, +1 byte a parameter): 19.9 / 23.2 / 34.5 / 37.1 ms, and the LM head at 8 and 16
# rows 5.6 and 6.8 ms against int8's 13.5 and 26.6 and bfloat16's 18.4 and 22.9. It wins from 5 rows on (the
# weight-only kernel's second block of four) and so int8 then reads no bfloat16 weights at any batch.
_MAX_ROWS = {("int8", torch.bfloat16): 4, ("int4", torch.bfloat16): 8}
_MAX_ROWS_OTHERWISE = 64
# The fewest rows of an int8 step that quantizes its rows (W8A8), per engine dtype, where the int8 GEMM is exact.
W8A8_MIN_ROWS = {torch.bfloat16: 5, torch.float32: 5}
_CACHE_VERSION = "2"  # bump when the stored layout changes
DECODE_WEIGHTS_DIR = ".decode-weights"  # under the models dir (the machine's model cache)


@dataclass(frozen=True)
class DecodeWeights:
    """The weights a decode step reads, and what they are."""

    weights: ModelWeights  # the layers' GEMMs and the LM head as QuantizedWeight, or the model's own tensors
    format: WeightFormat
    max_rows: int  # decode steps of more requests than this read the model's own weights (faster there)
    w8a8_min_rows: int | None  # int8 steps of this many requests or more quantize their rows too (None: never)
    num_bytes: int  # what the compact copies add to the model's memory (0 for "same")
    seconds: float  # quantizing or reading the cache
    from_cache: bool
    cache_path: Path | None = None  # where they are kept between starts (None: not kept)


# ------------------------------------------------------------------------------------------ choice
def kernels_available(fmt: WeightFormat) -> bool:
    """Whether this torch has the CPU kernel a format needs."""
    if fmt == "int8":
        return hasattr(torch.ops.aten, "_weight_int8pack_mm")
    if fmt == "int4":
        return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
            torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
        )
    return True


def choose_format(setting: DecodeWeightsName, model: LoadedModel) -> WeightFormat:
    """The format decode reads. `auto`: int8 on a CPU for a model whose GEMMs are large enough to bind decode
    to memory (int8 won on every CPU measured, AVX2 and AVX512-BF16 alike: 2-7× the float32 and 1.9× the bf16
    GEMM rate; docs/benchmarks.md), the model's own weights on an accelerator. int4 is faster still but loses
    more (measured there): it is a choice, not the default. A named format on a device without its kernel is
    an error rather than a silent fallback."""
    if setting == "same":
        return "same"
    if setting == "auto":
        on_cpu = model.device.type == "cpu"
        large = _num_gemm_parameters(model.weights) >= AUTO_MIN_PARAMETERS
        return "int8" if on_cpu and large and kernels_available("int8") else "same"
    if model.device.type != "cpu":
        raise ValueError(f"engine.decode_weights {setting!r} runs on a CPU only (the device is {model.device})")
    if not kernels_available(setting):
        raise ValueError(f"engine.decode_weights {setting!r}: this torch ({torch.__version__}) lacks its CPU kernel")
    return setting


def _num_gemm_parameters(weights: ModelWeights) -> int:
    total = weights.lm_head.numel()
    for layer in weights.layers:
        total += sum(getattr(layer, name).numel() for name in GEMM_FIELDS)
    return total


# ------------------------------------------------------------------------------------ quantization
def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float weight → int8 codes (out, in) and bfloat16 scales (out,), symmetric per output channel.

    The scale is rounded to bfloat16 first and the codes are computed against the rounded scale, so
    dequantizing with the stored scale is the best int8 fit it can give."""
    w = weight.float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12).to(KERNEL_DTYPE)
    codes = torch.round(w / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return codes, scales


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float weight → int4 codes 0…15 (out, in) uint8 and (in / group, out, 2) bfloat16 scale/zero.

    Asymmetric per group: the group's minimum and maximum map to codes 0 and 15; the kernel dequantizes
    (q - 8) · scale + zero, so zero = minimum + 8 · scale."""
    out_features, in_features = weight.shape
    if in_features % INT4_GROUP_SIZE or out_features % 16:
        raise ValueError(
            f"int4 needs the input width ({in_features}) to be a multiple of {INT4_GROUP_SIZE} and the output "
            f"width ({out_features}) one of 16 (the CPU kernel's tiles); use engine.decode_weights: int8"
        )
    groups = weight.float().reshape(out_features, in_features // INT4_GROUP_SIZE, INT4_GROUP_SIZE)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # (out, in / group)
    scales = ((high - low) / 15.0).clamp(min=1e-12).to(KERNEL_DTYPE).float()
    codes = torch.round((groups - low[..., None]) / scales[..., None]).clamp_(0, 15).to(torch.uint8)
    zeros = low + 8.0 * scales
    scales_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(KERNEL_DTYPE)
    return codes.reshape(out_features, in_features), scales_zeros


def dequantize(weight: QuantizedWeight | torch.Tensor, codes: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 matrix a quantized weight stands for (tests and the bench compare it with the original)."""
    if isinstance(weight, torch.Tensor):
        return weight.float()
    if isinstance(weight, Int8Weight):
        return weight.qweight.float() * weight.scales.float()[:, None]
    if codes is None:
        raise ValueError("an int4 weight dequantizes from its codes (the packed layout is the kernel's own)")
    scale = weight.scales_zeros[..., 0].float().t()  # (out, in / group)
    zero = weight.scales_zeros[..., 1].float().t()
    grouped = codes.float().reshape(codes.shape[0], -1, INT4_GROUP_SIZE)
    return ((grouped - 8.0) * scale[..., None] + zero[..., None]).reshape(codes.shape)


def _int4_weight(codes: torch.Tensor, scales_zeros: torch.Tensor) -> Int4Weight:
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    return Int4Weight(packed=packed, scales_zeros=scales_zeros, out_features=codes.shape[0])


# ------------------------------------------------------------------------------------------ build
def build_decode_weights(model: LoadedModel, setting: DecodeWeightsName, cache_dir: Path | None) -> DecodeWeights:
    """The weights decode reads for `setting`, read from `cache_dir` when an earlier start stored them, else
    quantized now (and stored there when it is writable). `cache_dir` None: nothing is read or stored."""
    fmt = choose_format(setting, model)
    if fmt == "same":
        return DecodeWeights(
            weights=model.weights,
            format="same",
            max_rows=0,
            w8a8_min_rows=None,
            num_bytes=0,
            seconds=0.0,
            from_cache=False,
        )
    t0 = time.perf_counter()
    w8a8_min_rows = w8a8_rows(fmt, model.dtype)
    path = None if cache_dir is None else cache_dir / f"{model.fingerprint[:32]}-{fmt}-v{_CACHE_VERSION}.safetensors"
    seen = _stamp(path)
    weights = _from_cache(model.weights, fmt, path, w8a8_min_rows)
    from_cache = weights is not None
    if weights is None:
        with contextlib.ExitStack() as held:
            if path is not None:
                _lock(held, path)
                # Another process may have stored the file while this one waited for the lock: read that one.
                if _stamp(path) != seen:
                    weights = _from_cache(model.weights, fmt, path, w8a8_min_rows)
                    from_cache = weights is not None
            if weights is None:
                tensors = _quantize_all(model.weights, fmt)
                if path is not None:
                    _write_cache(path, tensors)
                weights = _assemble(model.weights, fmt, tensors, w8a8_min_rows)
    num_bytes = sum(_nbytes(layer_weight) for layer_weight in _matrices(weights).values())
    seconds = time.perf_counter() - t0
    logger.info(
        "decode reads %s weights (%.2f GB beside the model's own, %s in %.1fs)%s",
        fmt,
        num_bytes / 1e9,
        "read from the model cache" if from_cache else "quantized",
        seconds,
        "" if w8a8_min_rows is None else f"; steps of {w8a8_min_rows} requests or more quantize their rows (W8A8)",
    )
    return DecodeWeights(
        weights=weights,
        format=fmt,
        max_rows=_MAX_ROWS_OTHERWISE
        if w8a8_min_rows is not None
        else _MAX_ROWS.get((fmt, model.dtype), _MAX_ROWS_OTHERWISE),
        w8a8_min_rows=w8a8_min_rows,
        num_bytes=num_bytes,
        seconds=seconds,
        from_cache=from_cache,
        cache_path=path if path is not None and path.is_file() else None,
    )


def w8a8_rows(fmt: WeightFormat, dtype: torch.dtype) -> int | None:
    """The fewest rows of a decode step that runs int8's W8A8 GEMM; None where it never does (another format or
    dtype, or a CPU whose int8 GEMM is not exact)."""
    if fmt != "int8" or dtype not in W8A8_MIN_ROWS or not int8_gemm_exact():
        return None
    return W8A8_MIN_ROWS[dtype]


def _nbytes(weight: QuantizedWeight | torch.Tensor) -> int:
    if isinstance(weight, torch.Tensor):
        return weight.numel() * weight.element_size()
    if isinstance(weight, Int8Weight):
        tensors = [weight.qweight, weight.scales]
        packed = 0 if weight.batched is None else weight.batched.num_bytes
    else:
        tensors, packed = [weight.packed, weight.scales_zeros], 0
    return sum(t.numel() * t.element_size() for t in tensors) + packed


def _matrices(weights: ModelWeights) -> dict[str, Weight]:
    """The GEMM weights by name: layers.{i}.{field} and lm_head."""
    named = {
        f"layers.{i}.{name}": getattr(layer, name) for i, layer in enumerate(weights.layers) for name in GEMM_FIELDS
    }
    named["lm_head"] = weights.lm_head
    return named


def _quantize_all(weights: ModelWeights, fmt: WeightFormat) -> dict[str, torch.Tensor]:
    """The cache's tensors: int8 codes, or int4 codes two to a byte (first in the high nibble), and scales."""
    tensors: dict[str, torch.Tensor] = {}
    for name, weight in _matrices(weights).items():
        if fmt == "int8":
            codes, scales = quantize_int8(weight)
        else:
            nibbles, scales = quantize_int4(weight)
            codes = nibbles[:, 0::2] << 4 | nibbles[:, 1::2]  # (out, in / 2)
        tensors[f"{name}.codes"], tensors[f"{name}.scales"] = codes, scales
    return tensors


def _assemble(
    weights: ModelWeights, fmt: WeightFormat, tensors: dict[str, torch.Tensor], w8a8_min_rows: int | None
) -> ModelWeights:
    def weight(name: str) -> QuantizedWeight:
        codes, scales = tensors[f"{name}.codes"], tensors[f"{name}.scales"]
        if fmt == "int8":
            batched = None if w8a8_min_rows is None else pack_int8(codes, scales, w8a8_min_rows)
            return Int8Weight(qweight=codes, scales=scales, batched=batched)
        nibbles = torch.stack([codes >> 4, codes & 0xF], dim=-1).reshape(codes.shape[0], -1)  # (out, in)
        return _int4_weight(nibbles, scales)

    layers: list[LayerWeights] = [
        replace(layer, **{name: weight(f"layers.{i}.{name}") for name in GEMM_FIELDS})
        for i, layer in enumerate(weights.layers)
    ]
    return replace(weights, layers=layers, lm_head=weight("lm_head"))


def _stamp(path: Path | None) -> tuple[int, int] | None:
    """(modification time, size) of the cache file, None when there is none: tells a file another process
    stored from the one looked at before."""
    try:
        info = path.stat() if path is not None else None
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size) if info is not None else None


def _lock(held: contextlib.ExitStack, path: Path) -> None:
    """Hold the model cache's lock on `path` in `held`: waits while another process quantizes into it. A cache
    dir that cannot hold the lock (read-only) quantizes without it, as it then stores nothing either."""
    try:
        held.enter_context(
            conversion_lock(path.parent, path.stem, doing=f"decode weights {path.name} are being quantized")
        )
    except OSError as exc:
        logger.warning("could not lock the decode-weights cache %s (%s); quantizing without it", path, exc)


def _from_cache(
    weights: ModelWeights, fmt: WeightFormat, path: Path | None, w8a8_min_rows: int | None
) -> ModelWeights | None:
    """The compact weights read from the cache file, None when there is none that fits."""
    tensors = _read_cache(path)
    if tensors is None:
        return None
    try:
        return _assemble(weights, fmt, tensors, w8a8_min_rows)
    except (KeyError, RuntimeError, ValueError) as exc:  # a file of another layout: quantize again
        logger.warning("ignoring the decode-weights cache %s, which does not fit this model: %s", path, exc)
        return None


def _read_cache(path: Path | None) -> dict[str, torch.Tensor] | None:
    if path is None or not path.is_file():
        return None
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:  # a truncated or foreign file: quantize again (and replace it)
        logger.warning("ignoring the unreadable decode-weights cache %s: %s", path, exc)
        return None


def _write_cache(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Store atomically (a temp file renamed into place): two servers starting together both write whole files."""
    from safetensors.torch import save_file

    try:
        with atomic_path(path) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    except OSError as exc:  # a read-only models dir: serve without the cache, quantize again next start
        logger.warning("could not store the decode weights in %s (%s); they are quantized on every start", path, exc)
