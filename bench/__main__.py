"""`python -m bench <subcommand> …`: one argparse subparser per benchmark module.

Each module listed in SUBCOMMANDS defines `add_parser(subparsers) -> ArgumentParser` that registers its
subparser and sets `func=main` (main(args) -> exit code). Adding a benchmark is one line here.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

SUBCOMMANDS = (
    "bench.ttft",
    "bench.quality",
    "bench.frontier",
    "bench.lookup",
    "bench.answers",
    "bench.conversation",
    "bench.followup",
    "bench.throughput",
    "bench.ingest_rate",
    "bench.kv_dtypes",
    "bench.llamacpp",
    "bench.scaleout",
    "bench.profile",
    "bench.peers",
    "bench.calibrate",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="blendrag benchmarks")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
