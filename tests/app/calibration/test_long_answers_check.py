"""A shipped record takes a long-answers check only when its blend's answers loop and run on no more than full
prefill's + 1, on its own weights; the agreement with full prefill is reported, not gated."""

from __future__ import annotations

import pytest

from app.calibration.long_answers_check import (
    LongAnswersCheck,
    LongAnswersCheckError,
    entry_misses,
    record_long_answers_check,
)
from app.calibration.record import BlendSettingsRecord


def _check(finish_full: dict[str, int], finish_blend: dict[str, int], agrees: int = 5) -> LongAnswersCheck:
    return LongAnswersCheck(
        num_questions=12,
        max_tokens=300,
        questions_as="question + 'Explain how to use it, with a short code example.'",
        finish_full=finish_full,
        finish_blend=finish_blend,
        identical=1,
        agrees=agrees,
        agree_f1=0.8,
        f1_vs_full_mean=0.72,
        divergence_token_median=32.0,
        right_full=10,
        right_blend=10,
        blend={"recompute_ratio": 0.25},
        checked_at="2026-12-05T01:00:00+00:00",
    )


@pytest.fixture
def shipped_dir(ship_record):
    return ship_record(
        "bfloat16", {"recompute_ratio": 0.25}, {"kl_ratio": 0.1, "similar_check": {"meets_target": True}}
    )


def test_the_target_is_on_repetition_stops_and_unfinished_answers_each_within_full_prefills_plus_one() -> None:
    assert _check({"stop": 12}, {"stop": 11, "repetition": 1}).meets_target
    assert _check({"stop": 12}, {"stop": 11, "length": 1}, agrees=0).meets_target  # agreement does not gate
    assert _check({"stop": 10, "length": 1, "repetition": 1}, {"stop": 8, "length": 2, "repetition": 2}).meets_target
    missed = _check({"stop": 12}, {"stop": 8, "repetition": 2, "length": 2})
    assert not missed.meets_target
    assert missed.misses() == [
        "2 repetition stops against full prefill's 0",
        "2 answers cut at 300 tokens against full's 0",
    ]
    assert _check({"stop": 11, "repetition": 1}, {"stop": 9, "repetition": 3}).misses() == [
        "3 repetition stops against full prefill's 1"
    ]


def test_a_recorded_entry_is_judged_by_todays_target_from_its_finish_counts() -> None:
    met = _check({"stop": 12}, {"stop": 11, "repetition": 1}).to_dict()
    assert entry_misses(met) == []
    assert entry_misses(met | {"repetition_blend": 2}) == ["2 repetition stops against full prefill's 0"]
    assert entry_misses(met | {"length_blend": 3}) == ["3 answers cut at 300 tokens against full's 0"]
    del met["length_full"]
    assert entry_misses(met) == ["length_full not recorded (checked before the target read it)"]


def test_a_passing_check_is_written_beside_what_the_record_measured(shipped_dir) -> None:
    path = record_long_answers_check(_check({"stop": 12}, {"stop": 11, "length": 1}), "m", "bfloat16", "f" * 64)
    assert path == shipped_dir / "m.bfloat16.json"
    record = BlendSettingsRecord.from_json(path.read_text())
    assert record.values == {"recompute_ratio": 0.25} and record.measured["similar_check"] == {"meets_target": True}
    entry = record.measured["long_answers_check"]
    assert entry["meets_target"] is True
    assert (entry["repetition_full"], entry["repetition_blend"], entry["length_full"], entry["length_blend"]) == (
        0,
        0,
        0,
        1,
    )
    assert (entry["agrees"], entry["identical"], entry["f1_vs_full_mean"]) == (5, 1, 0.72)
    assert entry["checked_on"] == (
        "the docs questions of bench/docs_corpus.py (12, question + 'Explain how to use it, with a short code "
        "example.'), greedy to 300 tokens, full prefill and the default blend, through /ask"
    )
    assert entry["agreement"].startswith("identical to full prefill's answer, or token F1 ≥ agree_f1")


def test_a_missed_target_another_fingerprint_or_no_record_is_refused_and_nothing_changes(shipped_dir) -> None:
    before = (shipped_dir / "m.bfloat16.json").read_text()
    with pytest.raises(
        LongAnswersCheckError, match=r"not recorded: .*\(3 repetition stops against full prefill's 1 over 12"
    ):
        record_long_answers_check(
            _check({"stop": 11, "repetition": 1}, {"stop": 9, "repetition": 3}), "m", "bfloat16", "f" * 64
        )
    passing = _check({"stop": 12}, {"stop": 12})
    with pytest.raises(LongAnswersCheckError, match="fingerprint ffffffffffff"):
        record_long_answers_check(passing, "m", "bfloat16", "e" * 64)
    with pytest.raises(LongAnswersCheckError, match="no shipped record for m in float32"):
        record_long_answers_check(passing, "m", "float32", "f" * 64)
    assert (shipped_dir / "m.bfloat16.json").read_text() == before
