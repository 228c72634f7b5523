"""`python -m bench calibrate`: the blend settings calibration of one model, as `blendrag calibrate` runs it.

The same code (app/calibration/search.py `run_calibration`) on the generated calibration set (look-ups with
made-up codes, two-hop questions, follow-ups; never a dev set): every candidate from the cheapest up, its
first-token KL ÷ reuse's, context benefit retained, right answers per kind against full prefill's and prompt
time, and the chosen settings. `--ship` also writes the record where the repo ships it for the model
(app/calibration/shipped/<model name>.<compute dtype>.json), so a fresh server on that model starts on them.
"""

from __future__ import annotations

import argparse
import logging

from bench import harness
from bench.candidates import read_candidates
from bench.inprocess import temp_settings

logger = logging.getLogger(__name__)

NAME = "calibrate"
HELP = "calibrate a model's blend settings (as blendrag calibrate)"


def add_args(parser: argparse.ArgumentParser) -> None:
    from app.calibration.calset import CASES_PER_KIND

    parser.add_argument("--ratios", default="0.1,0.15,0.2,0.25,0.3", help="recompute ratios to try")
    parser.add_argument(
        "--cases", default=",".join(map(str, CASES_PER_KIND)), help="look-ups,two-hop,follow-ups in the set"
    )
    parser.add_argument("--ship", action="store_true", help="write the record to app/calibration/shipped/")
    add_with_arg(parser)
    harness.add_candidates_arg(
        parser, "a JSON list of blend settings to measure instead of the search's (a study: every one is measured)"
    )
    harness.add_kv_dtype_arg(parser, choices=("fp16", "bf16", "int8", "int4"))


def add_with_arg(parser: argparse.ArgumentParser) -> None:
    """`--with KEY=VALUE`: a blend setting every candidate carries, shipped in the record beside the search's
    choice (app/calibration/search.py `fixed_values`)."""
    parser.add_argument(
        "--with",
        dest="fixed",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a blend setting held fixed in every candidate and written into the record (repeatable), "
        "e.g. match_labels=true",
    )


def parse_cases(text: str) -> tuple[int, ...]:
    """`--cases`: the calibration set's look-ups, two-hop and follow-up cases (`calset.make_cases`'s arguments)."""
    return tuple(int(x) for x in text.split(","))


def main(args: argparse.Namespace) -> int:
    from app.calibration.search import fixed_values, parse_ratios, run_calibration
    from app.calibration.shipped import shipped_path

    harness.refuse_ship_with_lead_in(args)
    try:
        fixed = fixed_values(args.fixed)
    except ValueError as exc:
        raise SystemExit(f"--with: {exc}") from None

    run = harness.RunRecord.start(args)
    cases = parse_cases(args.cases)
    tried_values = read_candidates(args.candidates) if args.candidates is not None else None
    if args.ship and tried_values is not None:
        raise SystemExit("--ship takes the search's choice, not a study's (--candidates)")
    with temp_settings(NAME, args, engine={"dtype": args.dtype}, kvcache={"storage_dtype": args.kv_dtype}) as settings:
        record, engine = run_calibration(
            settings,  # type: ignore[arg-type]
            ratios=parse_ratios(args.ratios),
            cases_per_kind=cases,  # type: ignore[arg-type]
            save=False,
            tried_values=tried_values,
            fixed=fixed,
        )
    result = harness.result_header(NAME, args, engine, kv_dtype=args.kv_dtype, record=record.__dict__)
    harness.write_result(args, result, run)
    if args.ship:
        path = shipped_path(record.model, record.compute_dtype)
        path.write_text(record.to_json(), encoding="utf-8")
        logger.info("shipped record written to %s", path)
    logger.info(
        "chosen %s (targets met: %s): %s", record.values, record.measured["targets_met"], record.measured["chosen"]
    )
    return 0
