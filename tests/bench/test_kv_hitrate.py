"""The hit-rate comparison's options name its ZipfSetup: defaults once, in the dataclass."""

from __future__ import annotations

import argparse

from bench.kv_hitrate import ZipfSetup, add_zipf_args, zipf_setup


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_zipf_args(parser)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def test_no_options_is_the_default_setup() -> None:
    assert zipf_setup(_parser().parse_args([])) == ZipfSetup()


def test_each_option_sets_its_field() -> None:
    args = _parser().parse_args(
        ["--zipf-chunks", "10", "--zipf-questions", "20", "--zipf-s", "1.5", "--zipf-top-k", "3", "--seed", "7"]
    )
    assert zipf_setup(args) == ZipfSetup(num_chunks=10, num_questions=20, top_k=3, zipf_s=1.5, seed=7)
