"""`python -m bench numerics`: where a bfloat16 blend's error comes from, part by part, against float32.

Two engines on the same weights, one computing in float32 and one in bfloat16, read the same prompts as /ask lays
them out. The truth is the float32 engine's full prefill. Two kinds of figure:

- per layer, the relative error (‖x − x_ref‖ / ‖x_ref‖ over the whole context) of what a blend reads: the stored
  K (before RoPE) and V as the bfloat16 engine computes them, the float32 engine's rounded to bfloat16, and the
  bfloat16 entries through the int4 store; and of the re-rotation of stored keys to their new positions in
  bfloat16 (its tables and arithmetic) against the same rotation in float32. Beside them the staleness a blend
  exists to repair: the stored K against the K full prefill computes for the same rows (float32).
- end to end, first-token KL(truth ‖ method) and KL(own dtype's full ‖ method): full prefill in bfloat16 (the
  dtype's floor), reuse, the blend in each dtype, and the bfloat16 blend with one part swapped for its float32
  counterpart at a time: the float32 engine's stored KV (cast on read), the float32 blend's rows (its plan's
  choice forced on the bfloat16 pass), the float32 scoring pass alone, the int4 store.

Every pass is the server's (`Engine.plan` and `engine.prompt_pass`): only the part named is swapped.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
from typing import TYPE_CHECKING

from bench import harness
from bench.metrics import kl_divergence
from bench.prepared import PreparedPrompt, bench_prompts

if TYPE_CHECKING:
    import torch

    from engine.blend.plan import BlendPlan
    from engine.engine import Engine
    from engine.types import BlendConfig, PromptLayout, PromptResult
    from kvcache.types import LayerKVReader

logger = logging.getLogger(__name__)

NAME = "numerics"
HELP = "where a bfloat16 blend's error comes from (stored KV, re-rotation, scoring, int4), against float32"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ratios", default="0.15,0.25", help="blend recompute ratios, comma-separated")


def forced_plan(plan: BlendPlan, positions: list[int]) -> BlendPlan:
    """`plan` with its context rows fixed to `positions` (absolute) and no scoring pass: another pass's choice
    carried out here. The key bias and everything else stay the plan's own."""
    from engine.blend.plan import UpfrontGroup

    offsets = tuple(p - plan.num_prefix_tokens for p in positions)
    group = UpfrontGroup(
        num_budget=len(offsets),
        adaptive=None,
        num_extra=0,
        priority=offsets,
        candidates=(),
        candidate_sizes=tuple(0 for _ in plan.segment_sizes),
    )
    return dataclasses.replace(plan, groups=(group,), score_layers=())


def run_plan(
    engine: Engine, layout: PromptLayout, plan: BlendPlan, config: BlendConfig, reader: LayerKVReader
) -> PromptResult:
    """The engine's prompt pass carrying out `plan` (as `Engine.prompt_pass` does after planning)."""
    from engine.prompt_pass import prompt_pass

    prefix = engine.prefix_kv(layout.prefix_ids) if plan.mode != "full" else None
    return prompt_pass(engine.transformer, layout, plan, config, reader, prefix, capacity=layout.num_tokens)


def _relative(x: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.float()
    return float((x.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def stored_kv_errors(
    p32: PreparedPrompt, p16: PreparedPrompt, engine32: Engine, engine16: Engine
) -> dict[str, list[float]]:
    """Per layer, the relative error of what a bfloat16 blend reads against the float32 engine's stored KV, and
    the staleness of the stored keys against full prefill's (float32)."""
    import torch

    from engine.rope import apply_rope

    layout = p32.layout
    p, n = layout.num_prefix_tokens, layout.num_context_tokens
    k32 = torch.cat([kv.k.float() for kv in p32.kvs], dim=2)  # (layers, kv_heads, N, D)
    v32 = torch.cat([kv.v.float() for kv in p32.kvs], dim=2)
    k16 = torch.cat([kv.k for kv in p16.kvs], dim=2)
    v16 = torch.cat([kv.v for kv in p16.kvs], dim=2)
    reader = p16.source("int4")
    try:
        int4 = [reader.layer(layer) for layer in range(engine16.num_layers)]
    finally:
        reader.close()
    # Full prefill's own pre-RoPE keys of the context rows: what the stored keys would be in this context.
    full = engine32.prompt_pass(layout, None, "full")
    cos32, sin32 = engine32.transformer.rope.at(slice(p, p + n))
    cos16, sin16 = engine16.transformer.rope.at(slice(p, p + n))
    out: dict[str, list[float]] = {name: [] for name in ("k_bf16", "k_round", "k_int4", "v_bf16", "v_int4")}
    out |= {"rotation_bf16": [], "k_stale": []}
    for layer in range(engine32.num_layers):
        out["k_bf16"].append(_relative(k16[layer], k32[layer]))
        out["k_round"].append(_relative(k32[layer].bfloat16(), k32[layer]))
        out["k_int4"].append(_relative(int4[layer][0], k32[layer]))
        out["v_bf16"].append(_relative(v16[layer], v32[layer]))
        out["v_int4"].append(_relative(int4[layer][1], v32[layer]))
        rotated16 = apply_rope(k16[layer], cos16, sin16)
        rotated32 = apply_rope(k16[layer].float(), cos32, sin32)
        out["rotation_bf16"].append(_relative(rotated16, rotated32))
        stored_rotated = apply_rope(k32[layer], cos32, sin32)
        out["k_stale"].append(_relative(stored_rotated, full.cache.k[layer, 0, :, p : p + n]))
    return out


def end_to_end(
    engine32: Engine, engine16: Engine, p32: PreparedPrompt, p16: PreparedPrompt, ratios: list[float]
) -> dict[str, dict[str, float]]:
    """First-token KL of each method against the truth (float32 full) and against its own dtype's full prefill,
    and the share of the float32 blend's rows each bfloat16 blend recomputes."""
    from kvcache.types import ChunkKV, InMemoryLayerReader

    layout = p32.layout
    truth = engine32.prompt_pass(layout, None, "full").logits
    full16 = engine16.prompt_pass(layout, None, "full").logits
    rows: dict[str, dict[str, float]] = {}

    def record(name: str, result: PromptResult, own: torch.Tensor, overlap_with: set[int] | None = None) -> None:
        row = {"kl": kl_divergence(truth, result.logits), "kl_own": kl_divergence(own, result.logits)}
        if overlap_with is not None:
            chosen = set(result.selected_positions.tolist())
            row["rows_shared"] = len(chosen & overlap_with) / max(1, len(overlap_with))
        rows[name] = row

    rows["full16"] = {"kl": kl_divergence(truth, full16), "kl_own": 0.0}
    record("reuse32", engine32.prompt_pass(layout, p32.source("fp32"), "reuse"), truth)
    record("reuse16", engine16.prompt_pass(layout, p16.source("fp32"), "reuse"), full16)
    kvs32_as16 = [ChunkKV(k=kv.k.bfloat16(), v=kv.v.bfloat16()) for kv in p32.kvs]
    for ratio in ratios:
        config32 = engine32.settings.blend_config(recompute_ratio=ratio)
        config16 = engine16.settings.blend_config(recompute_ratio=ratio)
        blend32 = engine32.prompt_pass(layout, p32.source("fp32"), "blend", config32)
        rows32 = set(blend32.selected_positions.tolist())
        record(f"blend32@{ratio}", blend32, truth, rows32)
        plan16 = engine16.plan(layout, "blend", config16)
        record(f"blend16@{ratio}", run_plan(engine16, layout, plan16, config16, p16.source("fp32")), full16, rows32)
        # One part swapped at a time.
        record(
            f"blend16+kv32@{ratio}",
            run_plan(engine16, layout, plan16, config16, InMemoryLayerReader(kvs32_as16)),
            full16,
            rows32,
        )
        forced = forced_plan(plan16, sorted(rows32))
        record(f"blend16+rows32@{ratio}", run_plan(engine16, layout, forced, config16, p16.source("fp32")), full16)
        record(
            f"blend16+int4@{ratio}", run_plan(engine16, layout, plan16, config16, p16.source("int4")), full16, rows32
        )
    return rows


def _mean_rows(per_example: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    names = per_example[0].keys()
    return {
        name: {key: statistics.fmean(e[name][key] for e in per_example) for key in per_example[0][name]}
        for name in names
    }


def _mean_layers(per_example: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    return {
        name: [statistics.fmean(e[name][i] for e in per_example) for i in range(len(per_example[0][name]))]
        for name in per_example[0]
    }


def main(args: argparse.Namespace) -> int:
    import torch

    from bench.passes import parse_ratios

    # --dtype does not apply: this benchmark always runs both engines.
    ratios = parse_ratios(args.ratios)
    engine32 = harness.build_engine(argparse.Namespace(**{**vars(args), "dtype": "float32"}))
    engine16 = harness.build_engine(argparse.Namespace(**{**vars(args), "dtype": "bfloat16"}))
    # One blend config for both, the bfloat16 one in force (its shipped record): only the dtype differs.
    engine32.use_blend(engine16.settings.blend, engine16.blend_origin)
    prompts = bench_prompts(engine32, args.dataset, args.examples, args.passages, args.seed)
    layers, rows = [], []
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            p32, p16 = PreparedPrompt.compute(engine32, prompt), PreparedPrompt.compute(engine16, prompt)
            layers.append(stored_kv_errors(p32, p16, engine32, engine16))
            rows.append(end_to_end(engine32, engine16, p32, p16, ratios))
            logger.info("example %d/%d: %s", i + 1, len(prompts), {k: round(v["kl"], 4) for k, v in rows[-1].items()})
    result = harness.result_header(
        NAME,
        args,
        engine16,
        prompt_tokens_mean=statistics.fmean(p.layout.num_tokens for p in prompts),
        ratios=ratios,
    )
    result |= {"layers": _mean_layers(layers), "methods": _mean_rows(rows), "per_example": rows}
    harness.write_json(args.out, result)
    harness.log_rows(logger, result["methods"], _line)
    for name, values in result["layers"].items():
        logger.info("%-14s %s", name, " ".join(f"{v:.4f}" for v in values))
    return 0


def _line(name: str, row: dict[str, float]) -> str:
    shared = f"  rows shared with the float32 blend {row['rows_shared']:.2f}" if "rows_shared" in row else ""
    return f"{name:22s} KL vs float32 full {row['kl']:.4f}  vs own dtype's full {row['kl_own']:.4f}{shared}"
