"""`python -m bench frontier`: speed against closeness to full prefill, for every selector × ratio.

For every example the passages' chunk KV is precomputed once (as ingest would); then full, reuse and
every selector at every ratio run one prompt pass each on the same prompt (bench.passes.run_pass, the
engine's own prompt pass with the blend config /ask builds), interleaved per example so load drift
hits all of them alike. Per mode:

    ttft_s            median prompt-pass time (what TTFT is made of: prompt pass + one sampling step)
    speedup           median full ÷ median mode, and the median of per-example ratios (paired)
    kl                first-token KL(full ‖ mode), mean over examples
    benefit_retained  (NLL_no_context − NLL_mode) ÷ (NLL_no_context − NLL_full), of the mean NLLs
    kl_x_reuse        a mode's kl ÷ reuse's (means first), when reuse ran
    *_ci95            95% paired bootstrap intervals of benefit_retained and kl_x_reuse (1,000
                      resamples of the examples, the same draws for every mode)
    fidelity_f1       F1 of the greedy answer (--max-tokens) against full prefill's answer
    f1                gold F1 (SQuAD normalisation, max over answers)

The plot has speed-up on x and KL (log) / fidelity on y, one line per selector through its ratios, with
full and reuse as reference points.

With `--candidates FILE` (a study: a JSON list of blend settings, bench/candidates.py) the modes are full,
reuse and one blend per candidate, each the settings in force for the model with the candidate's values set
on top, instead of the selector × ratio grid: variants such as sink tokens or a minimum per chunk compared on
the same held-out prompts at the same budget.

A candidate may also set `stored_context` (plain, neighbour, unrelated or previous): its chunks' stored KV
computed behind the prefix and that text instead of behind the prefix alone, the variants of ingest that
bench/stored_context.py describes; its prompt pass costs what any candidate's does.

With `--question-first` every mode's prompt (full prefill's too) also states the question right after the
prefix, before the chunks: `[prefix][question][chunks][question]`. The chunks' stored KV is still the KV
computed behind the server's prefix alone (as ingest stores it), so the blend re-rotates it past the
question, and the tokens it recomputes read the question; the question's own rows are computed like a
client's system prompt. A run with and one without it, on the same examples, tell whether the question's
position changes how much of full prefill the blend keeps (not a layout /ask uses).
"""

from __future__ import annotations

import argparse
import logging
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import harness
from bench.candidates import candidate_specs, describe, read_candidates
from bench.metrics import mean
from bench.passes import mode_specs, parse_ratios, run_pass
from bench.prepared import PreparedPrompt, bench_prompts
from bench.quality import evaluate, run_fields
from bench.stored_context import ContextVariants

if TYPE_CHECKING:
    from bench.data import BenchPrompt
    from bench.passes import ModeSpec
    from engine.engine import Engine

logger = logging.getLogger(__name__)

NAME = "frontier"
HELP = "speed-up vs KL / fidelity for every selector × ratio (Pareto)"
SELECTOR_COLORS = {"query": "tab:blue", "deviation": "tab:red", "first_k": "tab:green", "random": "tab:gray"}


def add_args(parser: argparse.ArgumentParser) -> None:
    harness.add_order_arg(parser)
    parser.add_argument("--ratios", default="0.02,0.05,0.1,0.15,0.3", help="recompute ratios, comma-separated")
    harness.add_selectors_arg(parser, "query,deviation,first_k,random", "selectors to compare at every ratio")
    parser.add_argument("--max-tokens", type=int, default=32, help="greedy answer length (fidelity, F1)")
    harness.add_kv_dtype_arg(parser)
    parser.add_argument("--warmup", type=int, default=1, help="untimed passes of each selector before timing")
    parser.add_argument(
        "--adaptive",
        default=None,
        help="also run the query selector's adaptive budget at these attention shares τ, comma-separated "
        "(engine.attention_share: the fewest tokens holding τ of the question's attention, within "
        "--ratio-min..--ratio-max); each is a point adaptive@τ at its realised mean ratio",
    )
    parser.add_argument("--ratio-min", type=float, default=None, help="adaptive budget: least share (settings')")
    parser.add_argument("--ratio-max", type=float, default=None, help="adaptive budget: largest share (settings')")
    parser.add_argument(
        "--question-first",
        action="store_true",
        help="state the question before the chunks too (every mode, full prefill included): a study of the "
        "question's position, not /ask's layout",
    )
    harness.add_candidates_arg(
        parser,
        "a JSON list of blend settings (a study, as `bench calibrate --candidates`): full, reuse and one "
        "blend per candidate instead of the --selectors × --ratios grid",
    )


def adaptive_specs(
    engine: Engine, shares: str | None, ratio_min: float | None, ratio_max: float | None
) -> list[ModeSpec]:
    """adaptive@τ: the server's blend config with the query selector's adaptive budget at share τ."""

    from bench.passes import ModeSpec

    if not shares:
        return []
    base = engine.settings.blend_config(selector="query")
    bounds = {
        "ratio_min": base.ratio_min if ratio_min is None else ratio_min,
        "ratio_max": base.ratio_max if ratio_max is None else ratio_max,
    }
    return [
        ModeSpec(f"adaptive@{float(tau)}", "blend", base.replace(attention_share=float(tau), **bounds))
        for tau in parse_ratios(shares)
    ]


def _warm_up(engine: Engine, bp: BenchPrompt, specs: list[ModeSpec], kv_dtype: str, rounds: int) -> None:
    """One pass of full, reuse and each selector's largest ratio: first-call costs stay out of the timings."""
    kvs = PreparedPrompt.compute(engine, bp)
    seen: dict[str, ModeSpec] = {}
    for spec in specs:  # the last spec of each selector has the largest ratio
        seen[spec.blend.selector if spec.mode == "blend" and spec.blend else spec.mode] = spec
    for _ in range(rounds):
        for spec in seen.values():
            source = kvs.source(kv_dtype) if spec.uses_cache else None
            run_pass(engine, bp.layout, source, spec, [], 1)


def question_first(engine: Engine, bp: BenchPrompt) -> BenchPrompt:
    """`bp` with the question also stated after the prefix: `[prefix][question][chunks][question]`.

    The question's first statement joins the prefix (the engine computes a prefix it has not seen, as for a
    client's system prompt); the chunks keep the ids and stored KV of /ask's layout, computed behind the
    server's prefix alone, so the layout says they were not computed behind this one."""
    from dataclasses import replace

    before = engine.prompt.question_template.split("{question}", 1)[0]
    stated = engine.tokenizer.encode(f"{before}{bp.example.question.strip()}\n\n", add_special_tokens=False)
    layout = replace(bp.layout, prefix_ids=[*bp.layout.prefix_ids, *stated], segments_behind_prefix=False)
    return replace(bp, layout=layout)


def speed(per_example: list[dict[str, Any]], names: list[str]) -> dict[str, dict[str, float]]:
    """Median prompt-pass seconds per mode and its speed-up over full (ratio of medians and paired)."""
    out: dict[str, dict[str, float]] = {}
    full = [r["modes"]["full"]["prompt_s"] for r in per_example]
    for name in names:
        times = [r["modes"][name]["prompt_s"] for r in per_example]
        out[name] = {
            "ttft_s_median": round(statistics.median(times), 4),
            "speedup": round(statistics.median(full) / statistics.median(times), 2),
            "speedup_paired_median": round(statistics.median(f / t for f, t in zip(full, times, strict=True)), 2),
        }
    return out


def pareto(modes: dict[str, dict[str, Any]]) -> list[str]:
    """Modes no other mode beats on both speed-up and KL (higher speed-up, lower KL)."""
    names = [n for n in modes if n != "full"]
    return [
        a
        for a in names
        if not any(
            modes[b]["speedup"] >= modes[a]["speedup"]
            and modes[b]["kl"] <= modes[a]["kl"]
            and (modes[b]["speedup"], modes[b]["kl"]) != (modes[a]["speedup"], modes[a]["kl"])
            for b in names
        )
    ]


def plot(result: dict[str, Any], path: Path) -> None:
    modes = result["modes"]
    fig, (ax_kl, ax_fid) = harness.new_figure(2, width_per_panel=5.6, height=4.2)
    for selector in result["selectors"]:
        names = [f"{selector}@{float(r)}" for r in result["ratios"]]
        xs = [modes[n]["speedup"] for n in names]
        color = SELECTOR_COLORS.get(selector)
        ax_kl.plot(xs, [max(modes[n]["kl"], 1e-12) for n in names], "o-", color=color, label=selector)
        ax_fid.plot(xs, [modes[n]["fidelity_f1"] for n in names], "o-", color=color, label=selector)
        for n, x in zip(names, xs, strict=True):
            ax_kl.annotate(
                n.split("@")[1],
                (x, max(modes[n]["kl"], 1e-12)),
                fontsize=6,
                color=color,
                xytext=(2, 2),
                textcoords="offset points",
            )
    adaptive = [n for n in modes if n.startswith("adaptive@")]
    if adaptive:
        xs = [modes[n]["speedup"] for n in adaptive]
        ax_kl.plot(xs, [max(modes[n]["kl"], 1e-12) for n in adaptive], "D", color="tab:purple", label="query, adaptive")
        ax_fid.plot(xs, [modes[n]["fidelity_f1"] for n in adaptive], "D", color="tab:purple", label="query, adaptive")
        for n, x in zip(adaptive, xs, strict=True):
            label = f"τ={n.split('@')[1]} (r̄={modes[n]['ratio']:.2f})"
            ax_kl.annotate(
                label,
                (x, max(modes[n]["kl"], 1e-12)),
                fontsize=6,
                color="tab:purple",
                xytext=(2, -8),
                textcoords="offset points",
            )
    for i, name in enumerate(result.get("candidates") or []):
        m = modes[name]
        marker = "o^vsPX*hd<>p"[i % 12]
        ax_kl.plot([m["speedup"]], [max(m["kl"], 1e-12)], marker, color=f"C{i % 10}", label=name)
        ax_fid.plot([m["speedup"]], [m["fidelity_f1"]], marker, color=f"C{i % 10}", label=name)
    reuse = modes["reuse"]
    ax_kl.plot([reuse["speedup"]], [reuse["kl"]], "s", color="black", label="reuse (r=0)")
    ax_fid.plot([reuse["speedup"]], [reuse["fidelity_f1"]], "s", color="black", label="reuse (r=0)")
    ax_fid.plot([1.0], [1.0], "*", color="black", markersize=9, label="full")
    ax_kl.set_yscale("log")
    ax_kl.set_xscale("log")
    ax_fid.set_xscale("log")
    ax_kl.set_xlabel("TTFT speed-up vs full prefill")
    ax_fid.set_xlabel("TTFT speed-up vs full prefill")
    ax_kl.set_ylabel("first-token KL(full ‖ mode), lower is better")
    ax_fid.set_ylabel("answer fidelity (F1 vs full's answer)")
    ax_fid.set_ylim(0, 1.05)
    ax_kl.legend(fontsize=7)
    ax_fid.legend(fontsize=7, loc="lower left")
    harness.finish_figure(fig, path, result, f"{result['mean_prompt_tokens']:.0f} tokens", f"KV {result['kv_dtype']}")


def main(args: argparse.Namespace) -> int:
    run = harness.RunRecord.start(args)
    candidates = read_candidates(args.candidates, study_fields=True) if args.candidates is not None else None
    ratios = parse_ratios(args.ratios) if candidates is None else []
    selectors = args.selectors if candidates is None else []
    engine = harness.build_engine(args)
    prompts = bench_prompts(
        engine, args.dataset, args.examples, args.passages, args.seed, with_answers=True, order=args.order
    )
    if args.question_first:
        prompts = [question_first(engine, bp) for bp in prompts]
    study = candidate_specs(engine, candidates) if candidates is not None else []
    specs = mode_specs(engine, ratios, baselines=("full", "reuse"), selectors=selectors) + study
    specs += adaptive_specs(engine, args.adaptive, args.ratio_min, args.ratio_max)
    logger.info("frontier: %d examples × %d passages, %d modes", len(prompts), args.passages, len(specs))
    if args.warmup:
        _warm_up(engine, prompts[0], specs, args.kv_dtype, args.warmup)
    variants = ContextVariants(engine, prompts=prompts) if any(s.stored_context for s in specs) else None
    evaluated = evaluate(engine, prompts, specs, args.kv_dtype, args.max_tokens, variants=variants)
    names = [s.name for s in specs]
    study_values = {spec.name: values for spec, values in zip(study, candidates or [], strict=True)}
    timing = speed(evaluated["per_example"], names)
    modes = {name: evaluated["modes"][name] | timing[name] for name in names}
    for spec in specs:
        if spec.mode == "blend" and spec.blend is not None:
            modes[spec.name] |= {"selector": spec.blend.selector, "ratio": spec.blend.recompute_ratio}
            if spec.name in study_values:
                modes[spec.name] |= {"candidate": study_values[spec.name], "blend": describe(spec.blend)}
            if spec.blend.attention_share is not None:  # the ratio it chose, per prompt, on average
                modes[spec.name] |= {
                    "attention_share": spec.blend.attention_share,
                    "ratio_min": spec.blend.ratio_min,
                    "ratio_max": spec.blend.ratio_max,
                    "ratio": round(
                        mean(
                            r["modes"][spec.name]["num_recomputed_tokens"] / max(r["num_context_tokens"], 1)
                            for r in evaluated["per_example"]
                        ),
                        4,
                    ),
                }
    result = harness.result_header(
        NAME,
        args,
        engine,
        **run_fields(args, prompts, ratios),
        selectors=selectors,
        candidates=list(study_values) if candidates is not None else None,
        question_first=args.question_first,
        modes=modes,
        no_context=evaluated["no_context"],
        pareto=pareto(modes),
        per_example=evaluated["per_example"],
    )
    harness.write_result(args, result, run, plot)
    harness.log_rows(logger, modes, _mode_line)
    logger.info("Pareto-optimal (speed-up, KL): %s", ", ".join(result["pareto"]))
    return 0


def _mode_line(name: str, m: dict[str, Any]) -> str:
    """A point's speed-up and TTFT, and its KL, benefit and fidelity where it has them."""
    kl = f"{m['kl']:.3e}" if "kl" in m else "-"
    benefit = f"{m['benefit_retained']:.3f}" if "benefit_retained" in m else "-"
    if "benefit_retained_ci95" in m:
        lo, hi = m["benefit_retained_ci95"]
        benefit += f" [{lo:.2f}, {hi:.2f}]"
    fidelity = f"{m['fidelity_f1']:.3f}" if "fidelity_f1" in m else "-"
    return (
        f"{name:<15} {m['speedup']:6.2f}x  ttft {m['ttft_s_median']:.3f}s  kl {kl}  benefit {benefit}  "
        f"fidelity {fidelity}  f1 {m['f1']:.3f}"
    )
