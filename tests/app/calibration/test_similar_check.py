"""A shipped record takes a similar-chunks check only when it meets the target, on its own weights."""

from __future__ import annotations

import json

import pytest

from app.calibration.record import BlendSettingsRecord
from app.calibration.similar_check import SimilarCheck, SimilarCheckError, entry_misses, record_similar_check


def _check(full: int, blend: int, shape: str = "one") -> SimilarCheck:
    return SimilarCheck(
        seed=0,
        num_cases=12,
        num_right_full=full,
        num_right_reuse=3,
        num_right_blend=blend,
        blend={"recompute_ratio": 0.15, "match_window": 24, "match_span": "sentence", "match_extra": 0.1},
        checked_at="2026-12-05T01:00:00+00:00",
        shape=shape,
    )


@pytest.fixture
def shipped_dir(ship_record):
    return ship_record("float32", {"recompute_ratio": 0.15}, {"kl_ratio": 0.1})


def test_a_passing_check_is_written_into_the_record_beside_what_it_measured(shipped_dir) -> None:
    path = record_similar_check(_check(11, 10), "m", "float32", "f" * 64)
    assert path == shipped_dir / "m.float32.json"
    record = BlendSettingsRecord.from_json(path.read_text())
    assert record.values == {"recompute_ratio": 0.15} and record.measured["kl_ratio"] == 0.1
    entry = record.measured["similar_check"]
    assert entry["meets_target"] is True and (entry["num_right_full"], entry["num_right_blend"]) == (11, 10)
    assert entry["checked_on"] == "similar look-ups, check part (seed 0, 12 cases, through /ask)"
    assert entry["tuned_on"].startswith("similar look-ups, tune part")


def test_a_missed_target_another_fingerprint_or_no_record_is_refused_and_nothing_changes(shipped_dir) -> None:
    before = (shipped_dir / "m.float32.json").read_text()
    with pytest.raises(SimilarCheckError, match="answered 9 of 12 against full prefill's 11"):
        record_similar_check(_check(11, 9), "m", "float32", "f" * 64)
    with pytest.raises(SimilarCheckError, match="fingerprint ffffffffffff"):
        record_similar_check(_check(11, 11), "m", "float32", "e" * 64)
    with pytest.raises(SimilarCheckError, match="no shipped record for m in bfloat16"):
        record_similar_check(_check(11, 11), "m", "bfloat16", "f" * 64)
    assert (shipped_dir / "m.float32.json").read_text() == before
    assert "similar_check" not in json.loads(before)["measured"]


def test_the_several_values_check_is_a_part_of_its_own_beside_the_one_value_check(shipped_dir) -> None:
    record_similar_check(_check(11, 10), "m", "float32", "f" * 64)
    path = record_similar_check(_check(9, 8, "several"), "m", "float32", "f" * 64)
    measured = BlendSettingsRecord.from_json(path.read_text()).measured
    one, several = measured["similar_check"], measured["similar_several_check"]
    assert (one["shape"], one["num_right_blend"], several["shape"], several["num_right_blend"]) == (
        "one",
        10,
        "several",
        8,
    )
    assert several["checked_on"] == (
        "similar look-ups, several named values a page, check part (seed 0, 12 cases, through /ask)"
    )
    assert several["tuned_on"].startswith("nothing tuned on pages holding several values")
    assert several["target"] == one["target"] == "default blend within 1 right answer of full prefill"
    with pytest.raises(
        SimilarCheckError, match=r"answered 7 of 12 against full prefill's 9 \(.*; several named values"
    ):
        record_similar_check(_check(9, 7, "several"), "m", "float32", "f" * 64)
    assert BlendSettingsRecord.from_json(path.read_text()).measured["similar_several_check"] == several


def test_the_target_is_within_one_right_answer_and_a_recorded_entry_is_judged_by_it() -> None:
    assert _check(11, 10).misses() == [] and _check(11, 12).misses() == []
    assert _check(11, 9).misses() == ["9 of 12 right against full prefill's 11"]
    assert entry_misses(_check(11, 10).to_dict()) == []
    assert entry_misses(_check(11, 10, shape="several").to_dict() | {"num_right_blend": 9}) == [
        "9 of 12 right against full prefill's 11"
    ]
    assert entry_misses({"num_cases": 12, "num_right_blend": 9}) == [
        "num_right_full not recorded (checked before the target read it)"
    ]
