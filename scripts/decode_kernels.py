"""The decode GEMM kernels side by side on a model's layer shapes, 1 to 16 rows (issue 65).

`python scripts/decode_kernels.py [--model DIR] [--rows 1,2,4,8,16] [--repeats 8] [--out F.json]`

Each pass feeds M rows through the GEMMs of every layer (q/k/v, output, gate/up, down; each layer's weights
distinct, so they stream from memory as in a decode step) and, separately, the LM head. The kernels run
interleaved (every repeat times each kernel at each row count once), so a disturbance of the machine touches
them alike; the figure per kernel is the fastest pass (the least disturbed) and the median beside it. Weights
are random with the model's shapes (a kernel's speed does not depend on the values). Kernels:

- `bf16`: the model's own bfloat16 weights (`F.linear`);
- `int8`: weight-only int8, torch's `_weight_int8pack_mm` (what decode reads for few rows);
- `int8x4`: the same kernel called on blocks of 4 rows;
- `int4`: weight-only int4, `_weight_int4pack_mm_for_cpu` (groups of 32);
- `w8a8`: the rows quantized to int8 per row, then oneDNN's int8 GEMM on the same (out, in) int8 codes as
  `int8` (`torch._int_mm`; oneDNN rearranges the codes on every call) and both scales applied after;
- `w8a8-packed`: the same on a oneDNN-packed copy of the codes (`onednn.qlinear_pointwise`): what decode runs
  for steps of many rows (engine/quantized_weights.py, `Int8Weight.matmul_w8a8`).

`--dtype float32` feeds float32 rows (a float32 engine's decode). ATEN_CPU_CAPABILITY=avx2 and
ONEDNN_MAX_CPU_ISA=AVX2 in the environment time what an AVX2-only CPU runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.quantized_weights import Int8Weight, int8_gemm_exact, pack_int8  # noqa: E402

# Qwen2.5-0.5B (and its Coder variant): hidden 896, MLP 4864, 14 query heads and 2 KV heads of 64, 24 layers.
DEFAULT_SHAPES = {"hidden": 896, "intermediate": 4864, "q_size": 896, "kv_size": 128, "layers": 24, "vocab": 151936}


@dataclass
class Gemm:
    """One GEMM's weight in every form the kernels read."""

    bf16: torch.Tensor
    int8: Int8Weight
    int4: torch.Tensor
    int4_scales: torch.Tensor
    scales_f32: torch.Tensor

    @property
    def in_features(self) -> int:
        return self.bf16.shape[1]


def make_gemm(out_features: int, in_features: int, packed: bool, gen: torch.Generator) -> Gemm:
    codes = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8, generator=gen)
    scales = (torch.rand(out_features, generator=gen) * 1e-3 + 1e-4).to(torch.bfloat16)
    nibbles = torch.randint(0, 16, (out_features, in_features), dtype=torch.int32, generator=gen)
    return Gemm(
        bf16=(codes.float() * scales.float()[:, None]).to(torch.bfloat16),
        int8=Int8Weight(qweight=codes, scales=scales, batched=pack_int8(codes, scales, 1) if packed else None),
        int4=torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles, 1),
        int4_scales=(torch.rand(in_features // 32, out_features, 2, generator=gen) * 1e-2).to(torch.bfloat16),
        scales_f32=scales.float(),
    )


def bf16(x: torch.Tensor, g: Gemm) -> torch.Tensor:
    return F.linear(x.to(torch.bfloat16), g.bf16).to(x.dtype)


def int8(x: torch.Tensor, g: Gemm) -> torch.Tensor:
    return g.int8.matmul_rows(x)


def int8x4(x: torch.Tensor, g: Gemm) -> torch.Tensor:
    return torch.cat([g.int8.matmul_rows(x[i : i + 4]) for i in range(0, x.shape[0], 4)])


def int4(x: torch.Tensor, g: Gemm) -> torch.Tensor:
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), g.int4, 32, g.int4_scales)
    return out.to(x.dtype)


def w8a8(x: torch.Tensor, g: Gemm) -> torch.Tensor:
    xf = x.float()
    row_scales = xf.abs().amax(-1, keepdim=True).clamp_(min=1e-30).div_(127.0)
    acc = torch._int_mm(xf.div(row_scales).round_().to(torch.int8), g.int8.qweight.t())
    return acc.float().mul_(g.scales_f32).mul_(row_scales).to(x.dtype)


def w8a8_packed(x: torch.Tensor, g: Gemm) -> torch.Tensor:
    return g.int8.matmul_w8a8(x)


KERNELS: dict[str, Callable[[torch.Tensor, Gemm], torch.Tensor]] = {
    "bf16": bf16,
    "int8": int8,
    "int8x4": int8x4,
    "int4": int4,
    "w8a8": w8a8,
    "w8a8-packed": w8a8_packed,
}


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def shapes_of(model: Path | None) -> dict[str, int]:
    if model is None:
        return DEFAULT_SHAPES
    cfg = json.loads((model / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return {
        "hidden": cfg["hidden_size"],
        "intermediate": cfg["intermediate_size"],
        "q_size": cfg["num_attention_heads"] * head_dim,
        "kv_size": cfg["num_key_value_heads"] * head_dim,
        "layers": cfg["num_hidden_layers"],
        "vocab": cfg["vocab_size"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="a converted model dir (its config.json's shapes)")
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--kernels", default=",".join(KERNELS))
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--no-head", action="store_true", help="time the layers only (not the LM head)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    s = shapes_of(args.model)
    kernels = {name: KERNELS[name] for name in args.kernels.split(",")}
    rows = [int(r) for r in args.rows.split(",")]
    dtype = getattr(torch, args.dtype)
    packed = "w8a8-packed" in kernels
    gen = torch.Generator().manual_seed(65)
    h, inter = s["hidden"], s["intermediate"]
    layer_shapes = [(s["q_size"] + 2 * s["kv_size"], h), (h, s["q_size"]), (2 * inter, h), (h, inter)]
    layers = [[make_gemm(n, k, packed, gen) for n, k in layer_shapes] for _ in range(s["layers"])]
    parts = {"layers": [g for layer in layers for g in layer]}
    if not args.no_head:
        parts["lm_head"] = [make_gemm(s["vocab"], h, packed, gen)]
    inputs = {m: {k: torch.randn(m, k, generator=gen).to(dtype) for k in (h, inter, s["q_size"])} for m in rows}

    times: dict[tuple[str, str, int], list[float]] = {}
    for _ in range(args.repeats):
        for m in rows:
            for part, gemms in parts.items():
                for name, kernel in kernels.items():
                    for g in gemms[:2]:  # warm: the kernels' first call per shape builds their code
                        kernel(inputs[m][g.in_features], g)
                    t0 = time.perf_counter()
                    for g in gemms:
                        kernel(inputs[m][g.in_features], g)
                    times.setdefault((part, name, m), []).append((time.perf_counter() - t0) * 1e3)
    load = os.getloadavg()
    emit(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype} rows, "
        f"ATen {torch.backends.cpu.get_cpu_capability()}, oneDNN int8 exact: {int8_gemm_exact()}, "
        f"load {load[0]:.2f} {load[1]:.2f}"
    )
    report: dict[str, object] = {"shapes": s, "dtype": args.dtype, "load": load, "results": {}}
    for part in parts:
        emit(f"\n{part}: ms per pass, fastest of {args.repeats} (median)")
        emit("rows " + "".join(f"{name:>18}" for name in kernels))
        for m in rows:
            cells = [
                f"{min(times[(part, n, m)]):6.1f} ({statistics.median(times[(part, n, m)]):6.1f})" for n in kernels
            ]
            emit(f"{m:<5}" + "".join(f"{c:>18}" for c in cells))
            report["results"][f"{part}/{m}"] = {
                n: {"min_ms": min(times[(part, n, m)]), "median_ms": statistics.median(times[(part, n, m)])}
                for n in kernels
            }
        for ref in ("int8", "bf16"):
            if ref not in kernels:
                continue
            emit(f"{part}: fastest pass ÷ {ref}'s at the same rows")
            for m in rows:
                base = min(times[(part, ref, m)])
                emit(f"{m:<5}" + "".join(f"{min(times[(part, n, m)]) / base:18.2f}" for n in kernels))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
