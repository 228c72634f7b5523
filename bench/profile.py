"""`python -m bench profile`: where a prompt pass spends its time, op by op (torch.profiler).

For each mode (full prefill, reuse, and the default blend: the server's selector and ratio) the same
prompt runs once untimed, then `--repeats` times under `torch.profiler` (CPU activities). The table is
per pass: the top ops by self CPU time (time inside the op itself, not its children), their share of the
pass and their calls. The cached modes read the chunk KV through the store in --kv-dtype, as /ask does.

The engine computes in the dtype `engine.dtype: auto` picks for this machine unless --dtype says
otherwise; the result records which and why (`compute_dtype`, `machine.cpu_flags`). Profiling costs
time of its own: the TTFT medians measured without the profiler are recorded beside the table.

Output: the JSON (--out) and a Markdown table per mode (--markdown, default: --out with .md).
"""

from __future__ import annotations

import argparse
import logging
import statistics
from pathlib import Path
from typing import Any

from bench import harness
from bench.passes import ModeSpec
from bench.prepared import PreparedPrompt, prepare_prompts, time_to_first_token

logger = logging.getLogger(__name__)

NAME = "profile"
HELP = "torch.profiler table of the top ops of full prefill, reuse and the default blend"


def add_args(parser: argparse.ArgumentParser) -> None:
    harness.add_order_arg(parser)
    harness.add_kv_dtype_arg(parser)
    parser.add_argument("--ratio", type=float, default=None, help="blend recompute ratio (default: the server's)")
    parser.add_argument("--repeats", type=int, default=3, help="profiled passes per mode and example")
    parser.add_argument("--top", type=int, default=20, help="ops listed per mode")
    parser.add_argument("--markdown", type=Path, default=None, help="Markdown tables (default: --out with .md)")


def _specs(engine: Any, ratio: float | None) -> list[ModeSpec]:
    config = engine.settings.blend_config(recompute_ratio=ratio)
    name = f"{config.selector}@{config.recompute_ratio}"
    return [ModeSpec("full", "full"), ModeSpec("reuse", "reuse"), ModeSpec(name, "blend", config)]


def _run(engine: Any, prepared: PreparedPrompt, spec: ModeSpec, kv_dtype: str) -> float:
    source = prepared.source(kv_dtype) if spec.uses_cache else None
    ttft, _ = time_to_first_token(engine, prepared.layout, source, spec.mode, spec.blend)
    return ttft


def op_table(events: Any, num_passes: int, top: int) -> list[dict[str, Any]]:
    """The top ops of profiler `key_averages()` by self CPU time, per pass (ms, share, calls)."""
    total_us = sum(e.self_cpu_time_total for e in events)
    rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [
        {
            "op": e.key,
            "self_cpu_ms": round(e.self_cpu_time_total / 1000 / num_passes, 3),
            "share": round(e.self_cpu_time_total / total_us, 4) if total_us else 0.0,
            "calls": round(e.count / num_passes, 1),
        }
        for e in rows
    ]


# CUDA runtime calls a prompt pass should make few of: kernel launches, copies, and the host waiting for the device.
RUNTIME_CALLS = {
    "launches": ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"),
    "copies": ("cudaMemcpyAsync", "cudaMemcpy"),
    "syncs": ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"),
}


def runtime_calls(events: Any, num_passes: int) -> dict[str, float]:
    """Per pass: CUDA kernel launches, host↔device copies and host syncs (all 0 on a CPU)."""
    counts = {name: 0 for name in RUNTIME_CALLS}
    for e in events:
        for name, keys in RUNTIME_CALLS.items():
            if e.key in keys:
                counts[name] += e.count
    return {name: round(count / num_passes, 1) for name, count in counts.items()}


def profile_modes(
    engine: Any, prepared: list[PreparedPrompt], specs: list[ModeSpec], kv_dtype: str, repeats: int, top: int
) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if engine.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    out: dict[str, Any] = {}
    for spec in specs:
        _run(engine, prepared[0], spec, kv_dtype)  # first-call costs stay out of the table
        plain = [_run(engine, ex, spec, kv_dtype) for ex in prepared for _ in range(repeats)]
        with profile(activities=activities) as prof:
            profiled = [_run(engine, ex, spec, kv_dtype) for ex in prepared for _ in range(repeats)]
        events = prof.key_averages()
        num_passes = len(profiled)
        out[spec.name] = {
            "ttft_s_median": round(statistics.median(plain), 4),
            "ttft_s_median_profiled": round(statistics.median(profiled), 4),
            "self_cpu_ms_per_pass": round(sum(e.self_cpu_time_total for e in events) / 1000 / num_passes, 2),
            "runtime_calls_per_pass": runtime_calls(events, num_passes),
            "ops": op_table(events, num_passes, top),
        }
        logger.info(
            "%s: TTFT %.3fs (profiled %.3fs)", spec.name, out[spec.name]["ttft_s_median"], statistics.median(profiled)
        )
    return out


def markdown(result: dict[str, Any]) -> str:
    reason = f" ({result['dtype_choice']['reason']})"
    lines = [
        f"Profile · {result['model']} · {result['compute_dtype']}{reason}"
        f" · {result['examples']} example(s) × {result['passages']} passages · KV {result['kv_dtype']}"
        f" · CPU {result['machine']['cpu_model']} ({', '.join(result['machine']['cpu_flags'])})",
        "",
    ]
    for name, mode in result["modes"].items():
        calls = mode.get("runtime_calls_per_pass", {})
        lines += [
            f"### {name}: TTFT {mode['ttft_s_median']:.3f} s (profiled {mode['ttft_s_median_profiled']:.3f} s)",
            "",
            f"CUDA per pass: {calls.get('launches', 0):g} launches, {calls.get('copies', 0):g} copies, "
            f"{calls.get('syncs', 0):g} syncs",
            "",
            "| op | self CPU ms / pass | share | calls / pass |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| `{r['op']}` | {r['self_cpu_ms']:.2f} | {100 * r['share']:.1f}% | {r['calls']:g} |" for r in mode["ops"]
        ]
        lines.append("")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    run = harness.RunRecord.start(args)
    engine = harness.build_engine(args)
    prepared = prepare_prompts(engine, args.dataset, args.examples, args.passages, args.seed, order=args.order)
    specs = _specs(engine, args.ratio)
    modes = profile_modes(engine, prepared, specs, args.kv_dtype, args.repeats, args.top)
    result = harness.result_header(
        NAME,
        args,
        engine,
        **harness.prompt_facts(prepared),
        kv_dtype=args.kv_dtype,
        repeats=args.repeats,
        modes=modes,
    )
    harness.write_result(args, result, run)
    path = args.markdown or Path(args.out).with_suffix(".md")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(result) + "\n", encoding="utf-8")
    logger.info("wrote %s", path)
    return 0
