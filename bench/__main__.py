"""`python -m bench <subcommand> …`: one argparse subparser per benchmark module.

Each module listed in SUBCOMMANDS defines `NAME`, `HELP`, `add_args(parser)` (its own options) and
`main(args) -> exit code`; its row here gives the defaults of the common options (bench/harness.py's
`Command`). Adding a benchmark is one line here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from bench import (
    answers,
    calibrate,
    capacity,
    conversation,
    decode,
    followup,
    frontier,
    harness,
    ingest_rate,
    kv_dtypes,
    llamacpp,
    long_answers,
    lookup,
    numerics,
    peers,
    profile,
    quality,
    random_model,
    relevance,
    scaleout,
    ship,
    throughput,
    ttft,
)

NO_DATASET = Path("-")  # lookup, answers and calibrate make their own questions: --dataset goes unused

# The subcommands, with the defaults of their common options; followup, relevance and scaleout have their own
# options only.
SUBCOMMANDS: tuple[harness.Command, ...] = (
    harness.Command(ttft, harness.DEFAULT_MUSIQUE, examples=5, passages=6, blend=True),
    harness.Command(quality, harness.DEFAULT_MUSIQUE, examples=20, passages=6, blend=True),
    harness.Command(frontier, harness.DEFAULT_MUSIQUE, examples=20, passages=6, blend=True),
    harness.Command(lookup, NO_DATASET, examples=20, passages=6),
    harness.Command(answers, NO_DATASET, examples=12, passages=6),
    harness.Command(long_answers, NO_DATASET, examples=0, passages=6),
    harness.Command(conversation, harness.DEFAULT_NQ6, examples=8, passages=4),
    harness.Command(followup),
    harness.Command(relevance),
    harness.Command(throughput, harness.DEFAULT_MUSIQUE, examples=8, passages=6),
    harness.Command(capacity),
    harness.Command(decode, harness.DEFAULT_MUSIQUE, examples=8, passages=6),
    harness.Command(ingest_rate, harness.DEFAULT_NQ6, examples=0, passages=0),
    harness.Command(kv_dtypes, harness.DEFAULT_MUSIQUE, examples=10, passages=6),
    harness.Command(numerics, harness.DEFAULT_MUSIQUE, examples=3, passages=6),
    harness.Command(llamacpp, harness.DEFAULT_MUSIQUE, examples=5, passages=6, out="llamacpp.json"),
    harness.Command(scaleout),
    harness.Command(profile, harness.DEFAULT_MUSIQUE, examples=1, passages=6, blend=True),
    harness.Command(peers, harness.DEFAULT_MUSIQUE, examples=5, passages=6, blend=True),
    harness.Command(calibrate, NO_DATASET, examples=0, passages=6),
    harness.Command(ship, NO_DATASET, examples=0, passages=6),
    harness.Command(random_model),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="blendrag benchmarks")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        # `run_bench`: this entry point, for a command that runs others in this process (ship: its steps).
        command.register(subparsers).set_defaults(run_bench=main)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    if hasattr(args, "models_dir") and args.models_dir is None:
        args.models_dir = harness.default_models_dir()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
