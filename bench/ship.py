"""`python -m bench ship`: a model's record at the lowest recompute ratio that holds every check part.

For each ratio of `--ratios`, cheapest first: the calibration at that ratio alone (`bench calibrate --ship`), then the
record's check parts in turn, each written into the record when met: look-ups among similar pages through /ask (`bench
lookup --distractors similar --part check --ship`, one value a page and then several), follow-up look-ups on /ask and
/v1 (`bench conversation --lookup 12 --ship`), first-token KL, benefit and the answers' gold F1 on held-out questions
(`bench quality --ship`, 60 nq6 examples), and whole answers (`bench long-answers --ship`). The first ratio whose
calibration meets its targets and whose every check part is met ships, with `measured["ship_gate"]` saying what missed
at the ratios below it. A ratio stops at its first miss (the check parts run cheapest first). When no ratio holds, or
the run is stopped, the record shipped before is put back byte for byte (exit 1): a record never ships on a calibration
alone.

`--alternatives N`: when a check part misses at a ratio, the calibration's next candidates at that ratio that met
its targets (in its order of preference: best calibration-set KL first, a near-tie scoring at more layers ahead; up
to N in all) are put in the record in turn and the check parts run again on each. Candidates within noise of each
other on the calibration set can differ on the check parts (the 0.5B's bfloat16 scoring layers 6/12/18 and
4/8/12/16/20 at 0.15: calset KL 0.248× and 0.252× reuse's, nq6 KL 0.36× and 0.25× on a draw the check does not
use): the gate picks among them by what the checks measure, and the
record says which it took (`measured.gate_alternative`).

Every step is the same subcommand a person would run by hand, with the same options; each writes its own result
file beside `--out` (`<out stem>.<ratio>.<step>.json`), and `--out` gets the gate's summary. ^C and SIGTERM stop
the gate alike, the record from before put back. `--resume` takes a ratio's calibration from the result file an
earlier run left beside `--out` when it is the one this run would measure, and a check part from its result's
receipt when it ran on the record as it is now (bench/ship_resume.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.calibration.followups_check import PATHS as FOLLOWUP_PATHS
from bench import harness
from bench.calibrate import add_with_arg
from bench.lookup import default_mode
from bench.ship_resume import model_fingerprint, reuse_calibration, reuse_check, write_receipt
from fsio.atomic import write_bytes_atomic, write_text_atomic

logger = logging.getLogger(__name__)

NAME = "ship"
HELP = "calibrate and run every check part, shipping the lowest ratio that holds them all"

SHIPPED_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Step:
    """One subcommand of the gate at one ratio: `name` keys its result file and its entry in the summary."""

    name: str
    argv: list[str]


@dataclass
class StepOutcome:
    name: str
    met: bool
    result: str  # the step's result file, by name (it lies beside the summary)
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class RatioOutcome:
    """One try of the gate: a ratio and which of its calibration's passing candidates the record carried."""

    ratio: float
    steps: list[StepOutcome] = field(default_factory=list)
    alternative: int = 1  # 1: the calibration's choice; k: its k-th best candidate meeting its targets
    values: dict[str, Any] | None = None  # the blend settings an alternative put in the record (None: the choice)

    @property
    def held(self) -> bool:
        return bool(self.steps) and all(step.met for step in self.steps)

    @property
    def missed(self) -> str | None:
        return next((step.name for step in self.steps if not step.met), None)


def add_args(parser: argparse.ArgumentParser) -> None:
    from app.calibration.calset import CASES_PER_KIND

    parser.add_argument("--ratios", default="0.15,0.2,0.25,0.3", help="recompute ratios to try, cheapest first")
    parser.add_argument(
        "--cases", default=",".join(map(str, CASES_PER_KIND)), help="the calibration's look-ups,two-hop,follow-ups"
    )
    parser.add_argument("--check-cases", type=int, default=12, help="cases of each similar-pages check part")
    parser.add_argument("--long-max-tokens", type=int, default=300, help="the long-answers check part's answer length")
    parser.add_argument("--followups", type=int, default=12, help="made-up projects of the follow-ups check part")
    parser.add_argument(
        "--heldout-dataset",
        type=Path,
        default=harness.DEFAULT_NQ6,
        help=f"the held-out check part's QA file (default {harness.DEFAULT_NQ6})",
    )
    parser.add_argument(
        "--heldout-examples",
        type=int,
        default=60,
        help="examples of the held-out check part (60: one draw of 20 passed a record that 60 put at 0.33x reuse's "
        "KL; at least 20)",
    )
    parser.add_argument("--heldout-passages", type=int, default=6, help="passages per held-out prompt")
    parser.add_argument(
        "--alternatives",
        type=int,
        default=1,
        help="candidates per ratio: when a check part misses, the calibration's next passing candidates at that "
        "ratio (in the calibration's order of preference) are checked in turn, up to this many in all",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="take back the steps an earlier run of this gate left beside --out instead of running them again: a "
        "ratio's calibration measured on the same model weights, dtype, calibration set, ratio and --with, and a "
        "check part whose receipt names the same command line, fingerprint and record settings",
    )
    add_with_arg(parser)
    # What it writes is what servers read on their defaults: no lead-in, the server's KV storage dtype.
    parser.set_defaults(ship=True)


def common_argv(args: argparse.Namespace) -> list[str]:
    """The options every step shares: the model, where it is converted, threads, dtypes."""
    argv = ["--model", str(args.model), "--dtype", args.dtype]
    if args.models_dir is not None:
        argv += ["--models-dir", str(args.models_dir)]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    if args.decode_weights is not None:
        argv += ["--decode-weights", args.decode_weights]
    return argv


def steps_at(args: argparse.Namespace, ratio: float, out: Path, alternative: int = 1) -> list[Step]:
    """The gate's steps at `ratio`, in the order they run: the calibration, then the check parts cheapest first.
    For an alternative candidate (2, 3, …) the check parts alone: the calibration it comes from has run."""
    common = common_argv(args)

    def result(step: str) -> list[str]:
        return ["--out", str(result_path(out, ratio, step, alternative))]

    similar = ["lookup", "--distractors", "similar", "--part", "check", "--examples", str(args.check_cases)]
    similar += ["--max-tokens", "32", "--selectors", "query", "--ship"]
    calibrate = Step(
        "calibrate",
        ["calibrate", "--ratios", str(ratio), "--cases", args.cases, "--ship"]
        + [f"--with={item}" for item in args.fixed]
        + common
        + result("calibrate"),
    )
    checks = [
        Step("similar_check", similar + ["--shape", "one"] + common + result("similar_check")),
        Step("similar_several_check", similar + ["--shape", "several"] + common + result("similar_several_check")),
        Step(
            "followups_check",
            ["conversation", "--lookup", str(args.followups), "--examples", "0", "--no-timings", "--ship"]
            + common
            + result("followups_check"),
        ),
        Step(
            "heldout_check",
            ["quality", "--dataset", str(args.heldout_dataset), "--examples", str(args.heldout_examples)]
            + ["--passages", str(args.heldout_passages), "--baselines", "reuse", "--ship"]
            + common
            + result("heldout_check"),
        ),
        Step(
            "long_answers_check",
            ["long-answers", "--max-tokens", str(args.long_max_tokens), "--ship"]
            + common
            + result("long_answers_check"),
        ),
    ]
    return [calibrate, *checks] if alternative == 1 else checks


def result_path(out: Path, ratio: float, step: str, alternative: int = 1) -> Path:
    alt = "" if alternative == 1 else f".alt{alternative}"
    return out.with_name(f"{out.stem}.{ratio:g}{alt}.{step}.json")


def passing_candidates(calibrate_result: Path, ratio: float) -> list[dict[str, Any]]:
    """The candidates of a calibration run at `ratio` that met its targets, in the calibration's order of
    preference (`preference_order`; the first is the one it chooses): each as the record's `tried` entry, values
    and figures."""
    from app.calibration.search import order_tried

    result = json.loads(calibrate_result.read_text(encoding="utf-8"))
    tried = result["record"]["measured"]["tried"]
    return order_tried([t for t in tried if not t["misses"] and t["values"].get("recompute_ratio") == ratio])


def put_alternative(path: Path, passing: list[dict[str, Any]], rank: int, missed: list[str]) -> None:
    """The shipped record at `path` carrying the `rank`-th of the calibration's `passing` candidates (`tried`
    entries, its choice first) in place of the settings before: its values and figures, and no check part (they ran
    on the settings before)."""
    from app.calibration.check_parts import CHECK_PART_KEYS
    from app.calibration.record import BlendSettingsRecord

    candidate = passing[rank - 1]
    record = BlendSettingsRecord.from_json(path.read_text(encoding="utf-8"))
    measured = {k: v for k, v in record.measured.items() if k not in CHECK_PART_KEYS}
    measured["chosen"] = candidate["figures"]
    measured["gate_alternative"] = {
        "rank": rank,
        "of": len(passing),
        "why": "the calibration's preferred candidates at this ratio missed a check part: " + "; ".join(missed),
        "calibration_choice": passing[0]["values"],  # the record holds the previous alternative's from rank 3 on
    }
    write_text_atomic(path, dataclasses.replace(record, values=candidate["values"], measured=measured).to_json())


def step_figures(name: str, path: Path) -> tuple[bool | None, dict[str, Any]]:
    """What a step's result file says: for the calibration whether its targets were met (None for a check part,
    whose exit code says it) and the figures the summary shows."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, {}
    if name == "calibrate":
        measured = result["record"]["measured"]
        return bool(measured["targets_met"]), {"values": result["record"]["values"], "chosen": measured["chosen"]}
    if name.startswith("similar"):
        right = result["right"]
        return None, {
            "right_full": right["full"],
            "right_reuse": right["reuse"],
            "right_blend": right[default_mode(result)],
        }
    if name == "followups_check":
        summary = result["lookup"]["summary"]
        return None, {
            path: {"right_full": summary[path]["full_right"], "right_blend": summary[path]["default_right"]}
            for path in FOLLOWUP_PATHS
        }
    modes = result["modes"]
    if name == "heldout_check":
        blend = next(mode for mode_name, mode in modes.items() if mode_name not in ("full", "reuse"))
        return None, {
            "kl_x_reuse": blend["kl_x_reuse"],
            "benefit_retained": blend["benefit_retained"],
            "f1_blend": blend["f1"],
            "f1_full": modes["full"]["f1"],
        }
    return None, {
        "finish_full": modes["full"]["finish_reasons"],
        "finish_blend": modes["blend"]["finish_reasons"],
        "agrees": modes["blend"]["agrees"],
    }


RunStep = Callable[[Step], int]
# Put the ratio's k-th candidate (k ≥ 2) into the record; its values, or None when the calibration has no k-th.
Switch = Callable[[float, int], "dict[str, Any] | None"]


def run_gate(
    ratios: Sequence[float],
    steps_for: Callable[[float, int], list[Step]],
    run_step: RunStep,
    outcomes: list[RatioOutcome] | None = None,
    switch: Switch | None = None,
    alternatives: int = 1,
) -> list[RatioOutcome]:
    """Each ratio in turn until one holds: its steps in order, stopping at the first miss. A calibration "meets"
    when its exit code is 0 and its record met the calibration targets; a check part when its exit code is 0 (a
    check part refuses, exit 1, to record a check that misses). When a check part misses and `alternatives` > 1,
    `switch` puts the calibration's next passing candidate into the record and the check parts run again, until
    one holds, `alternatives` were tried or the calibration has no more. `outcomes` (appended to as the steps
    finish) keeps what ran when a step raises."""
    outcomes = [] if outcomes is None else outcomes
    for ratio in ratios:
        for alternative in range(1, alternatives + 1):
            values = None
            if alternative > 1:
                values = switch(ratio, alternative) if switch is not None else None
                if values is None:
                    break
            outcome = RatioOutcome(ratio, alternative=alternative, values=values)
            outcomes.append(outcome)
            for step in steps_for(ratio, alternative):
                rc = run_step(step)
                out = Path(step.argv[step.argv.index("--out") + 1])
                targets_met, figures = step_figures(step.name, out)
                met = rc == 0 and targets_met is not False
                outcome.steps.append(StepOutcome(step.name, met, out.name, figures))
                logger.info(
                    "ship gate @%g (candidate %d): %s %s %s",
                    ratio,
                    alternative,
                    step.name,
                    "met" if met else "MISSED",
                    figures,
                )
                if not met:
                    break
            if outcome.held:
                return outcomes
            if outcome.missed == "calibrate":
                break  # no candidate at this ratio meets the calibration's targets
    return outcomes


def gate_entry(outcomes: list[RatioOutcome]) -> dict[str, Any]:
    """`measured["ship_gate"]` of a record that shipped: the ratios tried and, below the shipped one, what missed."""
    return {
        "ratios_tried": list(dict.fromkeys(o.ratio for o in outcomes)),
        "shipped_ratio": outcomes[-1].ratio,
        "shipped_candidate": outcomes[-1].alternative,
        "below": [
            {
                "ratio": o.ratio,
                "candidate": o.alternative,
                "values": o.values,
                "missed": o.missed,
                "figures": next(s.figures for s in o.steps if not s.met),
            }
            for o in outcomes[:-1]
        ],
        "checked_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_summary(
    args: argparse.Namespace,
    path: Path,
    ratios: list[float],
    outcomes: list[RatioOutcome],
    held: bool,
    run: harness.RunRecord,
    reused: list[str],
    stopped: bool = False,
) -> None:
    """`--out`: the gate's summary (what each ratio's steps found, and what shipped)."""
    result = harness.result_header(
        NAME,
        args,
        model=str(args.model),
        compute_dtype=args.dtype,
        ratios=ratios,
        shipped_ratio=outcomes[-1].ratio if held else None,
        shipped_candidate=outcomes[-1].alternative if held else None,
        record=path.name if held else None,
        stopped=stopped,  # interrupted or failed half-way: the record from before was put back
        reused=reused,  # step results --resume took from an earlier run instead of measuring again
        outcomes=[asdict(o) | {"held": o.held, "missed": o.missed} for o in outcomes],
    )
    harness.write_result(args, result, run)


def main(args: argparse.Namespace, run_step: RunStep | None = None) -> int:
    from app.calibration.check_record import write_check
    from app.calibration.search import fixed_values, parse_ratios
    from app.calibration.shipped import model_name, shipped_path

    harness.refuse_ship_with_lead_in(args)
    if args.alternatives < 1:
        raise SystemExit("--alternatives counts the candidates checked per ratio: 1 or more")
    if args.dtype not in SHIPPED_DTYPES:
        raise SystemExit(f"a record is shipped per compute dtype: --dtype one of {', '.join(SHIPPED_DTYPES)}")
    try:
        fixed_values(args.fixed)  # refused here, before any step (--resume reads them before a calibration would)
    except ValueError as exc:
        raise SystemExit(f"--with: {exc}") from None
    ratios = sorted(parse_ratios(args.ratios))
    run = harness.RunRecord.start(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    path = shipped_path(model_name(str(args.model)), args.dtype)
    before = path.read_bytes() if path.exists() else None
    outcomes: list[RatioOutcome] = []
    run_bench: RunStep = run_step or (lambda step: args.run_bench(step.argv))  # bench/__main__.py's main, here
    reused: list[str] = []  # step results --resume took back instead of running the step
    fingerprint = functools.cache(lambda: model_fingerprint(args))  # loaded once, when --resume first needs it

    def run_or_reuse(step: Step) -> int:
        out = Path(step.argv[step.argv.index("--out") + 1])
        if step.name == "calibrate":
            ratio = float(step.argv[step.argv.index("--ratios") + 1])
            if args.resume and reuse_calibration(args, out, path, ratio, fingerprint):
                reused.append(out.name)
                return 0
            return run_bench(step)
        if args.resume and (rc := reuse_check(step.name, step.argv, out, path)) is not None:
            reused.append(out.name)
            return rc
        rc = run_bench(step)
        write_receipt(step.name, step.argv, rc, out, path)  # what --resume reads back
        return rc

    def switch(ratio: float, alternative: int) -> dict[str, Any] | None:
        passing = passing_candidates(result_path(args.out, ratio, "calibrate"), ratio)
        if len(passing) < alternative:
            return None
        missed = [f"candidate {o.alternative}: {o.missed}" for o in outcomes if o.ratio == ratio]
        put_alternative(path, passing, alternative, missed)
        return passing[alternative - 1]["values"]

    finished = False
    stopped_by: str | None = None  # the signal that stopped the gate
    try:
        with harness.stop_on_signals():  # SIGTERM (kill, a service manager) stops the gate as ^C does
            run_gate(
                ratios,
                lambda ratio, alternative: steps_at(args, ratio, args.out, alternative),
                run_or_reuse,
                outcomes,
                switch,
                args.alternatives,
            )
        finished = True
    except harness.Stopped as exc:
        stopped_by = exc.signal_name
    finally:
        held = finished and bool(outcomes) and outcomes[-1].held
        if not held:
            # Nothing ships on a calibration alone: the record (and its check parts) from before the run is back.
            if before is None:
                path.unlink(missing_ok=True)
            else:
                write_bytes_atomic(path, before)
        if not finished:  # stopped half-way: what ran is still worth its summary
            write_summary(args, path, ratios, outcomes, held, run, reused, stopped=True)
    if stopped_by:
        logger.error("stopped by %s: the record shipped before is back, unchanged", stopped_by)
        return 1
    if held:
        from app.calibration.record import BlendSettingsRecord

        record = BlendSettingsRecord.from_json(path.read_text(encoding="utf-8"))
        write_check(
            "ship_gate", gate_entry(outcomes), record.model, record.compute_dtype, record.fingerprint, ValueError
        )
    write_summary(args, path, ratios, outcomes, held, run, reused)
    if held:
        logger.info("shipped %s at ratio %g: every check part met", path.name, outcomes[-1].ratio)
        return 0
    logger.error("no ratio of %s held every check part: the record shipped before is unchanged", ratios)
    return 1
