"""`python -m bench ttft`: time to first token of full, prefix, reuse and blend@r, interleaved per example.

Chunk KV is precomputed before any timing (it is ingest's work). For each example every mode answers
the same prompt once (one generated token), in the same order, so drifting machine load hits all modes
alike; medians and p90 over examples are reported with the speed-up of each mode over full prefill.
Peak RSS of a serving process doing one 6-chunk blend is measured in a fresh process (model + chunk KV
+ blend), since this process's high-water mark is set by the full prefills.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench import harness
from bench.metrics import percentile
from bench.passes import mode_specs, parse_ratios
from bench.prepared import PreparedPrompt, prepare_prompts, time_to_first_token
from engine.types import SelectorName

logger = logging.getLogger(__name__)

NAME = "ttft"
HELP = "time to first token per mode (full, prefix, reuse, blend@r)"
GIB = 1024**3


def add_args(parser: argparse.ArgumentParser) -> None:
    harness.add_order_arg(parser)
    parser.add_argument("--ratios", default="0.05,0.15,0.3", help="blend recompute ratios, comma-separated")
    harness.add_kv_dtype_arg(parser)
    harness.add_selectors_arg(
        parser, None, "time these selectors at every ratio, named selector@r (default: blend@r, the engine's)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed passes of every mode before timing")
    parser.add_argument("--rss-ratio", type=float, default=0.15, help="blend ratio of the peak-RSS probe")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS probe (a second process)")


def _rss_probe(settings_json: str, models_dir: str, kv_file: str, ratio: float, conn: Any) -> None:
    """Child process: load the engine and one example's chunk KV, run one blend, report peak RSS."""
    import torch

    from engine.config import EngineSettings
    from engine.engine import Engine
    from kvcache.types import ChunkKV, InMemoryLayerReader

    engine = Engine(EngineSettings.model_validate_json(settings_json), Path(models_dir))
    data = torch.load(kv_file, weights_only=False)
    kvs = [ChunkKV(k=k, v=v) for k, v in data["kvs"]]
    after_load = harness.peak_rss_bytes()
    source = InMemoryLayerReader(kvs, device=engine.device, dtype=engine.dtype)
    config = engine.settings.blend_config(recompute_ratio=ratio)
    ttft, _ = time_to_first_token(engine, data["layout"], source, "blend", config)
    conn.send({"peak_rss_bytes": harness.peak_rss_bytes(), "rss_after_load_bytes": after_load, "ttft_s": ttft})
    conn.close()


def measure_peak_rss(settings_json: str, models_dir: Path, prepared: PreparedPrompt, ratio: float) -> dict:
    import torch

    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        kv_file = str(Path(tmp) / "kv.pt")
        torch.save({"layout": prepared.layout, "kvs": [(kv.k, kv.v) for kv in prepared.kvs]}, kv_file)
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_rss_probe, args=(settings_json, str(models_dir), kv_file, ratio, child))
        proc.start()
        child.close()
        result = parent.recv()
        proc.join()
    return result


def run_ttft(
    engine,
    prepared: list[PreparedPrompt],
    kv_dtype: str,
    ratios: list[float],
    warmup: int,
    selectors: list[SelectorName] | None = None,
) -> dict[str, Any]:
    specs = mode_specs(engine, ratios, selectors=selectors)
    for _ in range(warmup):
        for spec in specs:
            source = prepared[0].source(kv_dtype) if spec.uses_cache else None
            time_to_first_token(engine, prepared[0].layout, source, spec.mode, spec.blend)
    per_example = []
    for n, ex in enumerate(prepared, 1):
        row: dict[str, Any] = {
            "index": ex.prompt.example.index,
            "num_prompt_tokens": ex.layout.num_tokens,
            "num_context_tokens": ex.layout.num_context_tokens,
            "ttft_s": {},
            "num_recomputed_tokens": {},
        }
        for spec in specs:
            source = ex.source(kv_dtype) if spec.uses_cache else None
            ttft, recomputed = time_to_first_token(engine, ex.layout, source, spec.mode, spec.blend)
            row["ttft_s"][spec.name] = round(ttft, 4)
            row["num_recomputed_tokens"][spec.name] = recomputed
        per_example.append(row)
        logger.info(
            "ttft %d/%d (%d tokens): %s",
            n,
            len(prepared),
            ex.layout.num_tokens,
            "  ".join(f"{k}={v:.2f}s" for k, v in row["ttft_s"].items()),
        )
    modes: dict[str, dict[str, float]] = {}
    for spec in specs:
        values = [r["ttft_s"][spec.name] for r in per_example]
        modes[spec.name] = {
            "ttft_s_median": round(statistics.median(values), 4),
            "ttft_s_p90": round(percentile(values, 90), 4),
            "ttft_s_mean": round(statistics.fmean(values), 4),
            "recomputed_tokens_mean": statistics.fmean(r["num_recomputed_tokens"][spec.name] for r in per_example),
        }
        if spec.mode == "blend" and spec.blend is not None:
            modes[spec.name]["selector"] = spec.blend.selector
    full = modes["full"]["ttft_s_median"]
    speedup = {name: round(full / m["ttft_s_median"], 2) for name, m in modes.items() if name != "full"}
    # Per-example ratios too: the median of ratios is robust to load drifting between examples.
    speedup_paired = {
        spec.name: round(statistics.median(r["ttft_s"]["full"] / r["ttft_s"][spec.name] for r in per_example), 2)
        for spec in specs
        if spec.name != "full"
    }
    return {
        "modes": modes,
        "speedup_vs_full": speedup,
        "speedup_vs_full_paired_median": speedup_paired,
        "per_example": per_example,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    modes = result["modes"]
    names = list(modes)
    medians = [modes[n]["ttft_s_median"] for n in names]
    p90 = [modes[n]["ttft_s_p90"] - modes[n]["ttft_s_median"] for n in names]
    fig, (ax,) = harness.new_figure(1, width_per_panel=6.0)
    colors = ["tab:gray", "tab:orange", "tab:red", *["tab:blue"] * (len(names) - 3)]
    ax.bar(names, medians, yerr=[[0] * len(names), p90], color=colors[: len(names)], capsize=3)
    for i, name in enumerate(names):
        label = "1.0×" if name == "full" else f"{result['speedup_vs_full'][name]:.1f}×"
        ax.annotate(label, (i, medians[i]), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("TTFT (s), median; bar to p90")
    ax.tick_params(axis="x", rotation=30)
    harness.finish_figure(fig, path, result, f"{result['prompt_tokens_mean']:.0f} tokens", f"KV {result['kv_dtype']}")


def main(args: argparse.Namespace) -> int:
    import torch

    run = harness.RunRecord.start(args)
    ratios = parse_ratios(args.ratios)
    engine = harness.build_engine(args)
    prepared = prepare_prompts(engine, args.dataset, args.examples, args.passages, args.seed, order=args.order)
    result = harness.result_header(
        NAME,
        args,
        engine,
        **harness.prompt_facts(prepared),
        ratios=ratios,
        kv_dtype=args.kv_dtype,
    )
    result.update(run_ttft(engine, prepared, args.kv_dtype, ratios, args.warmup, args.selectors))
    if not args.no_rss:
        settings = engine.settings.model_copy(update={"num_threads": args.threads or torch.get_num_threads()})
        rss = measure_peak_rss(settings.model_dump_json(), args.models_dir, prepared[0], args.rss_ratio)
        result["peak_rss_blend"] = {
            "chunks": len(prepared[0].layout.chunk_ids),
            "ratio": args.rss_ratio,
            "prompt_tokens": prepared[0].layout.num_tokens,
            "peak_rss_bytes": rss["peak_rss_bytes"],
            "peak_rss_gib": round(rss["peak_rss_bytes"] / GIB, 3),
            "rss_after_load_gib": round(rss["rss_after_load_bytes"] / GIB, 3),
        }
    harness.write_result(args, result, run, plot)
    speedup = result["speedup_vs_full"] | {"full": "1.0"}
    harness.log_rows(logger, result["modes"], lambda name, m: _mode_line(name, m, speedup[name]))
    if "peak_rss_blend" in result:
        logger.info(
            "peak RSS of a %d-chunk blend: %.2f GiB",
            result["peak_rss_blend"]["chunks"],
            result["peak_rss_blend"]["peak_rss_gib"],
        )
    return 0


def _mode_line(name: str, m: dict[str, Any], speedup: object) -> str:
    return f"{name:<10} median {m['ttft_s_median']:.3f}s  p90 {m['ttft_s_p90']:.3f}s  speed-up {speedup}"
