"""`python -m bench quality`: how close each mode stays to full prefill, and how well it answers.

For every example the passages' chunk KV is precomputed once (as ingest would), then each mode runs one
prompt pass (see bench.passes): full, prefix, reuse, blend@r for each --ratios, plus the prompt without
any chunks (no context). Per mode:

    f1                gold F1 of the greedy answer (SQuAD normalisation, max over answers)
    fidelity_f1       F1 of the mode's greedy answer against full prefill's answer
    kl                first-token KL(full ‖ mode), nats, mean over examples
    nll               teacher-forced NLL of the first gold answer, mean per token, mean over examples
    benefit_retained  (NLL_no_context − NLL_mode) ÷ (NLL_no_context − NLL_full), of the mean NLLs
    kl_x_reuse        a mode's kl ÷ reuse's (means first), when reuse ran
    f1_loss_ci95      95% paired bootstrap interval of full prefill's gold F1 minus the mode's (mean
                      over the examples: positive when the mode answers worse)
    *_ci95            95% paired bootstrap intervals of benefit_retained and kl_x_reuse (1,000
                      resamples of the examples, the same draws for every mode)

Cached modes read the chunk KV through the store in --kv-dtype (int4 by default, what /ask serves).

`--ship` makes the run the record's held-out check part (app/calibration/heldout_check.py): the server's default blend
(the record's ratio and settings) against full prefill and reuse, written into the shipped record of the model and dtype
(measured.heldout_check) only when first-token KL ÷ reuse's ≤ 0.3, benefit retained ≥ 0.95 and the greedy answers' gold
F1 at most 0.03 below full prefill's; exit 1 when it misses or cannot be written. `python -m bench ship` runs it on 60
nq6 examples; the record also gets the two figures over each run of 20 of them (`by_window`, not gated).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from bench import harness
from bench.metrics import (
    benefit_retained,
    bootstrap_interval,
    f1_score,
    kl_divergence,
    max_f1,
    mean,
    mean_token_nll,
)
from bench.passes import ModeSpec, blend_name, mode_specs, parse_ratios, run_pass
from bench.prepared import PreparedPrompt, bench_prompts

if TYPE_CHECKING:
    from bench.data import BenchPrompt
    from bench.stored_context import ContextVariants
    from engine.engine import Engine

logger = logging.getLogger(__name__)

NAME = "quality"
HELP = "gold F1, fidelity, first-token KL, NLL, benefit retained per mode"
DEFAULT_RATIOS = "0.15,1.0"


def add_args(parser: argparse.ArgumentParser) -> None:
    harness.add_order_arg(parser)
    parser.add_argument(
        "--ratios", default=None, help=f"blend recompute ratios, comma-separated (default {DEFAULT_RATIOS})"
    )
    parser.add_argument("--max-tokens", type=int, default=32, help="greedy answer length cap (for F1)")
    harness.add_kv_dtype_arg(parser)
    parser.add_argument(
        "--baselines",
        default="prefix,reuse",
        help="cached baselines besides full, comma-separated (full always runs first)",
    )
    parser.add_argument(
        "--no-repetition-control",
        action="store_true",
        help="greedy answers without the engine's repetition penalty / repeated-line stop",
    )
    parser.add_argument(
        "--compare-repetition-control",
        action="store_true",
        help="also score each answer without the repeated-line stop (same run, same prompts)",
    )
    parser.add_argument(
        "--ship",
        action="store_true",
        help="the default blend against full prefill and reuse, written into the model's shipped record for its "
        "dtype (measured.heldout_check) when it meets the target; exit 1 when it misses",
    )


def evaluate(
    engine: Engine,
    prompts: list[BenchPrompt],
    specs: list[ModeSpec],
    kv_dtype: str,
    max_tokens: int,
    compare_uncontrolled: bool = False,
    variants: ContextVariants | None = None,
) -> dict[str, Any]:
    """Run every mode on every prompt; returns the aggregate `modes`, `no_context` and `per_example`.

    A spec with a `stored_context` reads its chunks' KV of that variant (`variants` computes it)."""
    if not specs or specs[0].name != "full":
        raise ValueError("the first mode must be full (the reference)")
    kinds = sorted({s.stored_context for s in specs if s.uses_cache and s.stored_context is not None})
    if kinds and variants is None:
        raise ValueError(f"modes read stored KV variants ({', '.join(kinds)}) but no ContextVariants was given")
    per_example: list[dict[str, Any]] = []
    for n, bp in enumerate(prompts, 1):
        t0 = time.perf_counter()
        answers = bp.example.answers
        kvs = PreparedPrompt.compute(engine, bp)
        prepared = {None: kvs} | {kind: variants.prepare(bp, kind) for kind in kinds}  # type: ignore[union-attr,arg-type]
        bare = engine.prompt.layout([], bp.example.question)
        nc = run_pass(engine, bare, None, ModeSpec("full", "full"), bp.answer_ids, max_tokens)
        record: dict[str, Any] = {
            "index": bp.example.index,
            "question": bp.example.question,
            "answers": answers,
            "num_prompt_tokens": bp.layout.num_tokens,
            "num_context_tokens": bp.layout.num_context_tokens,
            "no_context": {
                "answer": nc.answer_text,
                "f1": max_f1(nc.answer_text, answers),
                "nll": mean_token_nll(nc.answer_nlls),
            },
            "modes": {},
        }
        full = None
        for spec in specs:
            variant = prepared[spec.stored_context] if spec.uses_cache else kvs
            source = variant.source(kv_dtype) if spec.uses_cache else None
            out = run_pass(engine, variant.layout, source, spec, bp.answer_ids, max_tokens, compare_uncontrolled)
            row: dict[str, Any] = {
                "answer": out.answer_text,
                "f1": max_f1(out.answer_text, answers),
                "finish_reason": out.finish_reason,
                "num_answer_tokens": len(out.answer_ids),
                "nll": mean_token_nll(out.answer_nlls),
                "prompt_s": round(out.prompt_s, 4),
                "num_recomputed_tokens": out.num_recomputed_tokens,
            }
            if out.uncontrolled is not None:
                text, reason = out.uncontrolled
                row["uncontrolled"] = {"answer": text, "f1": max_f1(text, answers), "finish_reason": reason}
            if full is None:
                full = out
            else:
                row["kl"] = kl_divergence(full.first_logits, out.first_logits)
                row["fidelity_f1"] = f1_score(out.answer_text, full.answer_text)
                row["same_first_token"] = out.first_token == full.first_token
            record["modes"][spec.name] = row
        per_example.append(record)
        logger.info(
            "quality %d/%d (example %d, %d tokens) in %.1fs: %s",
            n,
            len(prompts),
            bp.example.index,
            bp.layout.num_tokens,
            time.perf_counter() - t0,
            ", ".join(f"{k} kl={v.get('kl', 0.0):.2e}" for k, v in record["modes"].items()),
        )
    return summarize(per_example, [s.name for s in specs]) | {"per_example": per_example}


def summarize(per_example: list[dict[str, Any]], mode_names: list[str]) -> dict[str, Any]:
    """Means over examples; benefit retained from the mean NLLs (means first, then the ratio)."""
    nll_nc = mean(r["no_context"]["nll"] for r in per_example)
    nll_full = mean(r["modes"]["full"]["nll"] for r in per_example)
    modes: dict[str, dict[str, Any]] = {}
    for name in mode_names:
        rows = [r["modes"][name] for r in per_example]
        summary: dict[str, Any] = {
            "f1": mean(x["f1"] for x in rows),
            "nll": mean(x["nll"] for x in rows),
            "length_share": mean(float(x["finish_reason"] == "length") for x in rows),
            "answer_tokens": mean(x["num_answer_tokens"] for x in rows),
        }
        if all("uncontrolled" in x for x in rows):  # --compare-repetition-control: the same without the stop
            summary["uncontrolled_f1"] = mean(x["uncontrolled"]["f1"] for x in rows)
            summary["uncontrolled_length_share"] = mean(
                float(x["uncontrolled"]["finish_reason"] == "length") for x in rows
            )
        if name != "full":
            summary["fidelity_f1"] = mean(x["fidelity_f1"] for x in rows)
            summary["kl"] = mean(x["kl"] for x in rows)
            summary["kl_max"] = max(x["kl"] for x in rows)
            summary["benefit_retained"] = benefit_retained(nll_nc, nll_full, summary["nll"])
            summary["benefit_retained_ci95"] = _benefit_interval(per_example, name)
            summary["f1_loss_ci95"] = _f1_loss_interval(per_example, name)
            if "reuse" in mode_names and name != "reuse":
                summary["kl_x_reuse"], summary["kl_x_reuse_ci95"] = _kl_x_reuse(per_example, name)
            summary["first_token_agreement"] = mean(float(x["same_first_token"]) for x in rows)
        summary["prompt_s"] = mean(x["prompt_s"] for x in rows)
        summary["recomputed_tokens"] = mean(x["num_recomputed_tokens"] for x in rows)
        modes[name] = summary
    no_context = {"f1": mean(r["no_context"]["f1"] for r in per_example), "nll": nll_nc}
    return {"modes": modes, "no_context": no_context}


def run_fields(args: argparse.Namespace, prompts: Sequence[PreparedPrompt], ratios: list[float]) -> dict[str, Any]:
    """What an `evaluate` run was, as quality and frontier both report it: how many prompts and how long on
    average, the blend ratios, the KV storage dtype and the answer cap."""
    return {
        "examples": len(prompts),
        "ratios": ratios,
        "kv_dtype": args.kv_dtype,
        "max_tokens": args.max_tokens,
        "mean_prompt_tokens": mean(p.layout.num_tokens for p in prompts),
    }


def _benefit_stat(per_example: list[dict[str, Any]], name: str) -> Callable[[Sequence[int]], float]:
    """A mode's benefit retained over the examples at the ids given, means first."""
    no_context = [r["no_context"]["nll"] for r in per_example]
    full = [r["modes"]["full"]["nll"] for r in per_example]
    method = [r["modes"][name]["nll"] for r in per_example]

    def stat(ids: Sequence[int]) -> float:
        return benefit_retained(
            mean(no_context[i] for i in ids), mean(full[i] for i in ids), mean(method[i] for i in ids)
        )

    return stat


def _kl_x_reuse_stat(per_example: list[dict[str, Any]], name: str) -> Callable[[Sequence[int]], float]:
    """A mode's first-token KL ÷ reuse's over the examples at the ids given, means first (NaN when reuse's is 0)."""
    kl = [r["modes"][name]["kl"] for r in per_example]
    kl_reuse = [r["modes"]["reuse"]["kl"] for r in per_example]

    def stat(ids: Sequence[int]) -> float:
        denominator = mean(kl_reuse[i] for i in ids)
        return mean(kl[i] for i in ids) / denominator if denominator > 0 else math.nan

    return stat


def _benefit_interval(per_example: list[dict[str, Any]], name: str) -> list[float]:
    """95% paired bootstrap interval of a mode's benefit retained (each resample means-first)."""
    return [round(x, 4) for x in bootstrap_interval(_benefit_stat(per_example, name), len(per_example))]


def _f1_loss_interval(per_example: list[dict[str, Any]], name: str) -> list[float]:
    """95% paired bootstrap interval of full prefill's mean gold F1 minus a mode's: how far one draw's F1 loss
    (what the held-out check part gates) could move on another draw of as many examples."""
    loss = [r["modes"]["full"]["f1"] - r["modes"][name]["f1"] for r in per_example]
    return [round(x, 4) for x in bootstrap_interval(lambda ids: mean(loss[i] for i in ids), len(per_example))]


def window_figures(per_example: list[dict[str, Any]], name: str, size: int) -> list[dict[str, Any]]:
    """A mode's KL ÷ reuse's and benefit retained over examples 1–size, size+1–2·size, … (each means first, as over
    all of them); a last run shorter than `size` is left out, its means would not be a draw of that size."""
    kl_x_reuse, benefit = _kl_x_reuse_stat(per_example, name), _benefit_stat(per_example, name)
    windows = []
    for start in range(0, len(per_example) - size + 1, size):
        ids = range(start, start + size)
        windows.append(
            {
                "examples": [start + 1, start + size],
                "kl_x_reuse": round(kl_x_reuse(ids), 4),
                "benefit_retained": round(benefit(ids), 4),
            }
        )
    return windows


def _kl_x_reuse(per_example: list[dict[str, Any]], name: str) -> tuple[float, list[float]]:
    """A mode's first-token KL ÷ reuse's (means first) and its 95% paired bootstrap interval."""
    stat = _kl_x_reuse_stat(per_example, name)
    interval = bootstrap_interval(stat, len(per_example))
    return stat(range(len(per_example))), [round(x, 4) for x in interval]


def plot(result: dict[str, Any], path) -> None:
    modes = result["modes"]
    names = list(modes)
    cached = [n for n in names if n != "full"]
    fig, (ax_kl, ax_benefit, ax_fid, ax_f1) = harness.new_figure(4)
    kls = [max(modes[n]["kl"], 1e-12) for n in cached]
    ax_kl.bar(cached, kls, color="tab:red")
    ax_kl.set_yscale("log")
    ax_kl.set_title("first-token KL(full ‖ mode)")
    ax_benefit.bar(cached, [modes[n]["benefit_retained"] for n in cached], color="tab:green")
    ax_benefit.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax_benefit.set_title("context benefit retained")
    ax_fid.bar(cached, [modes[n]["fidelity_f1"] for n in cached], color="tab:blue")
    ax_fid.set_ylim(0, 1.05)
    ax_fid.set_title("answer fidelity (F1 vs full)")
    labels = [*names, "no context"]
    ax_f1.bar(labels, [*(modes[n]["f1"] for n in names), result["no_context"]["f1"]], color="tab:gray")
    ax_f1.set_title("gold F1")
    for ax in (ax_kl, ax_benefit, ax_fid, ax_f1):
        ax.tick_params(axis="x", rotation=35)
    harness.finish_figure(fig, path, result, f"KV {result['kv_dtype']}")


def _refuse_ship_options(args: argparse.Namespace) -> None:
    """`--ship` checks what a server answers with on its defaults: no ratio, baseline or repetition control of
    the run's own, and the server's KV storage dtype."""
    harness.refuse_ship_with_lead_in(args)
    if not args.ship:
        return
    if args.ratios is not None:
        raise SystemExit("--ship checks the default blend at the ratio in force: drop --ratios")
    if args.no_repetition_control or args.compare_repetition_control:
        raise SystemExit(
            "--ship checks the server's decoding: drop --no-repetition-control and --compare-repetition-control"
        )
    if args.kv_dtype != harness.server_kv_dtype():
        raise SystemExit(
            f"--ship reads the chunk KV as the server stores it ({harness.server_kv_dtype()}): drop --kv-dtype"
        )
    if given := harness.blend_options_given(args):
        raise SystemExit(f"--ship checks the blend settings in force: drop {', '.join(given)}")


def main(args: argparse.Namespace) -> int:
    _refuse_ship_options(args)
    run = harness.RunRecord.start(args)
    overrides: dict[str, Any] = {}
    if args.no_repetition_control:
        overrides.update(repetition_penalty=1.0, no_repeat_ngram_size=0, stop_on_repeated_line=False)
    engine = harness.build_engine(args, **overrides)
    # --ship: the one blend a server answers with, at the ratio in force (the record's).
    ratios = [engine.settings.blend.recompute_ratio] if args.ship else parse_ratios(args.ratios or DEFAULT_RATIOS)
    prompts = bench_prompts(
        engine, args.dataset, args.examples, args.passages, args.seed, with_answers=True, order=args.order
    )
    baselines = tuple(b for b in args.baselines.split(",") if b and b != "full")
    if unknown := [b for b in baselines if b not in ("prefix", "reuse")]:
        raise SystemExit(f"unknown baseline(s) {unknown}; choose from prefix, reuse")
    if args.ship and "reuse" not in baselines:
        raise SystemExit("--ship measures KL against reuse's: keep reuse among --baselines")
    specs = mode_specs(engine, ratios, baselines=("full", *baselines))  # type: ignore[arg-type]
    logger.info("quality: %d examples × %d passages, modes %s", len(prompts), args.passages, [s.name for s in specs])
    evaluated = evaluate(engine, prompts, specs, args.kv_dtype, args.max_tokens, args.compare_repetition_control)
    result = harness.result_header(
        NAME,
        args,
        engine,
        **run_fields(args, prompts, ratios),
        fingerprint=engine.fingerprint,
        repetition_control={
            k: getattr(engine.settings, k)
            for k in ("repetition_penalty", "no_repeat_ngram_size", "stop_on_repeated_line")
        },
        **evaluated,
    )
    for spec in specs:
        if spec.blend is not None and spec.mode == "blend":
            result["modes"][spec.name]["selector"] = spec.blend.selector
    harness.write_result(args, result, run, plot)
    harness.log_rows(logger, result["modes"], _mode_line)
    return _ship(result, engine.settings.model, blend_name(ratios[0])) if args.ship else 0


def _ship(result: dict[str, Any], model: str, mode: str) -> int:
    """`--ship`: the default blend's KL and benefit into the shipped record of the model and dtype (exit 1 when
    refused: the target missed, too few examples, no record, or another fingerprint's record)."""
    from datetime import UTC, datetime
    from pathlib import Path

    from app.calibration.heldout_check import (
        WINDOW_EXAMPLES,
        HeldoutCheck,
        HeldoutCheckError,
        record_heldout_check,
    )
    from app.calibration.shipped import model_name

    blend, full = result["modes"][mode], result["modes"]["full"]
    check = HeldoutCheck(
        dataset=Path(result["dataset"]).name,
        num_examples=result["examples"],
        num_passages=result["passages"],
        seed=result["seed"],
        order=result["order"],
        kv_storage_dtype=result["kv_dtype"],
        kl_blend=blend["kl"],
        kl_reuse=result["modes"]["reuse"]["kl"],
        kl_x_reuse=blend["kl_x_reuse"],
        kl_x_reuse_ci95=blend["kl_x_reuse_ci95"],
        benefit_retained=blend["benefit_retained"],
        benefit_ci95=blend["benefit_retained_ci95"],
        f1_full=full["f1"],
        f1_blend=blend["f1"],
        f1_loss_ci95=blend["f1_loss_ci95"],
        blend=result["blend"],
        checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
        chunk_lead_in=result.get("chunk_lead_in"),
        by_window=window_figures(result["per_example"], mode, WINDOW_EXAMPLES),
    )
    for window in check.by_window or []:
        logger.info(
            "held-out examples %d-%d: KL %.2fx reuse's, benefit %.3f",
            *window["examples"],
            window["kl_x_reuse"],
            window["benefit_retained"],
        )
    return harness.ship_check(
        lambda: record_heldout_check(check, model_name(model), result["compute_dtype"], result["fingerprint"]),
        HeldoutCheckError,
        "held-out",
    )


def _mode_line(name: str, m: dict[str, Any]) -> str:
    """A mode's F1, NLL and length (and without the stop, when compared); next to full prefill's, its fidelity."""
    line = f"{name:<11} f1={m['f1']:.3f} nll={m['nll']:.3f} length_share={m['length_share']:.3f}"
    if "uncontrolled_f1" in m:
        line += f" (without the stop: f1={m['uncontrolled_f1']:.3f} length_share={m['uncontrolled_length_share']:.3f})"
    if name == "full":
        return line + " "
    line += f" fidelity={m['fidelity_f1']:.3f} kl={m['kl']:.3e}"
    if "kl_x_reuse" in m:
        line += f" ({m['kl_x_reuse']:.2f}x reuse's)"
    line += f" benefit={m['benefit_retained']:.3f}"
    if "benefit_retained_ci95" in m:  # summaries written before the intervals have none
        lo, hi = m["benefit_retained_ci95"]
        line += f" [{lo:.2f}, {hi:.2f}]"
    return line
