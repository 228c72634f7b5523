"""Which dtype the engine computes in: `engine.dtype: auto` picks the fastest exact-enough one for the device.

On CUDA that is bfloat16. On a CPU it is bfloat16 only where the CPU multiplies bfloat16 natively (AMX tiles
or AVX512-BF16): there a GEMM of SmolLM2's shape runs ~6.5x faster than in float32 and SDPA ~2.8x. Elsewhere
(AVX2, AVX-512 without BF16, ARM without the extension) torch converts bfloat16 to float32 around every
kernel and bfloat16 is *slower* than float32, so float32 stays.

The decision is made from what torch reports about the CPU (the same flags its kernels dispatch on) plus
oneDNN's own bf16 check, never from a timing: a timing probe on a loaded machine measured 1.4x to 5.5x across
starts of one server, so the dtype (which is part of every KV entry's key) flipped and the whole KV store went
stale. The capabilities are the same at every start. `probe_bf16_speedup` stays for diagnostics and benches.
The app also keeps, per data dir, the dtype the store was built with (app/compute_dtype.py).

Numerics that stay float32 whatever the compute dtype (engine/layers.py, engine/rope.py, engine/selectors.py):
RMSNorm statistics, softmax, RoPE tables, logits and the query selector's scores.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# (rows, hidden) x (hidden, intermediate): one MLP up-projection of a 512-token block of SmolLM2.
_PROBE_SHAPE = (512, 576, 1536)


@dataclass(frozen=True)
class CpuBf16Support:
    """What torch reports about this CPU's bfloat16 matrix units."""

    amx_tile: bool
    avx512_bf16: bool
    onednn_bf16: bool
    capability: str  # torch's dispatch level: "AVX512", "AVX2", "DEFAULT" …

    @property
    def native(self) -> bool:
        return (self.amx_tile or self.avx512_bf16) and self.onednn_bf16

    def describe(self) -> str:
        units = [name for name, present in (("AMX tiles", self.amx_tile), ("AVX512-BF16", self.avx512_bf16)) if present]
        if not units:
            return f"no bf16 matrix units (torch dispatches {self.capability})"
        if not self.onednn_bf16:
            return f"{' and '.join(units)} reported but oneDNN's bf16 path is unavailable"
        return f"{' and '.join(units)} (torch dispatches {self.capability})"


@dataclass(frozen=True)
class DtypeChoice:
    """The compute dtype and why: logged at start-up, shown in /api/stats, the admin page and bench JSON."""

    dtype: str  # "float32" | "bfloat16" | "float16"
    reason: str
    requested: str = "auto"

    def to_dict(self) -> dict[str, str]:
        return {"dtype": self.dtype, "reason": self.reason, "requested": self.requested}


def detect_cpu_bf16() -> CpuBf16Support:
    """Ask torch (never /proc/cpuinfo: torch's kernels dispatch on what torch sees)."""
    import torch  # lazily: retrieval imports this module, and `blendrag --help` must stay instant

    def flag(name: str) -> bool:
        probe = getattr(torch.cpu, name, None)
        try:
            return bool(probe()) if probe is not None else False
        except (RuntimeError, AttributeError):
            return False

    try:
        onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (RuntimeError, AttributeError):
        onednn = False
    return CpuBf16Support(
        amx_tile=flag("_is_amx_tile_supported"),
        avx512_bf16=flag("_is_avx512_bf16_supported"),
        onednn_bf16=onednn,
        capability=str(torch.backends.cpu.get_cpu_capability()),
    )


def probe_bf16_speedup(repeats: int = 3) -> float:
    """float32 time ÷ bfloat16 time of one GEMM of the model's shape (best of `repeats`)."""
    import torch

    m, k, n = _PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(k, n, generator=generator)

    def best(x: torch.Tensor, y: torch.Tensor) -> float:
        torch.mm(x, y)  # warm-up: first call pays oneDNN's kernel selection
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(x, y)
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(a, b) / max(best(a.bfloat16(), b.bfloat16()), 1e-9)


def choose_compute_dtype(
    requested: str,
    device: str,
    *,
    setting: str = "engine.dtype",
    detect: Callable[[], CpuBf16Support] | None = None,
) -> DtypeChoice:
    """Resolve `engine.dtype` for `device` ("cpu" or "cuda[:n]"), from the device's capabilities only (the
    same answer at every start on one machine).

    `detect` defaults to this module's `detect_cpu_bf16`, looked up at call time (tests replace it to play a
    CPU with or without bf16 units)."""
    if requested != "auto":
        return DtypeChoice(requested, f"set by {setting}", requested)
    if device.startswith("cuda"):
        return DtypeChoice("bfloat16", "CUDA device", requested)
    support = (detect or detect_cpu_bf16)()
    if not support.native:
        return DtypeChoice("float32", f"CPU: {support.describe()}", requested)
    return DtypeChoice("bfloat16", f"CPU: {support.describe()}", requested)


def log_choice(choice: DtypeChoice, what: str = "engine") -> None:
    logger.info("%s computes in %s (%s: %s)", what, choice.dtype, choice.requested, choice.reason)
