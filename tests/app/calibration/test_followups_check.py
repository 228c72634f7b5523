"""A shipped record takes a follow-ups check only when the blend is within 1 of full prefill on both paths."""

from __future__ import annotations

import pytest

from app.calibration.followups_check import (
    FollowupsCheck,
    FollowupsCheckError,
    entry_misses,
    record_followups_check,
)
from app.calibration.record import BlendSettingsRecord


def _check(ask: tuple[int, int], v1: tuple[int, int]) -> FollowupsCheck:
    """ask, v1: (full prefill's right, the blend's right) of 12."""
    return FollowupsCheck(
        seed=0,
        num_projects=12,
        num_right_full={"ask": ask[0], "v1": v1[0]},
        num_right_blend={"ask": ask[1], "v1": v1[1]},
        num_in_top3={"ask": 12, "v1": 11},
        blend={"recompute_ratio": 0.2},
        checked_at="2026-12-06T01:00:00+00:00",
    )


@pytest.fixture
def shipped_dir(ship_record):
    return ship_record("float32", {"recompute_ratio": 0.2}, {})


def test_each_path_must_hold_on_its_own() -> None:
    assert _check((12, 11), (12, 11)).meets_target and _check((10, 12), (9, 8)).meets_target
    assert _check((12, 12), (12, 10)).misses() == ["/v1: 10 right against full prefill's 12"]
    assert _check((12, 10), (12, 12)).misses() == ["/ask: 10 right against full prefill's 12"]


def test_a_recorded_entry_is_judged_by_todays_target_on_both_paths() -> None:
    assert entry_misses(_check((12, 11), (12, 11)).to_dict()) == []
    assert entry_misses(_check((12, 11), (12, 10)).to_dict()) == ["/v1: 10 right against full prefill's 12"]
    one_path = {"num_right_full": {"ask": 12}, "num_right_blend": {"ask": 12}}  # the target asks for both
    assert entry_misses(one_path) == ["/v1: not recorded"]
    assert entry_misses({"num_right_full": {"ask": 12, "v1": 12}}) == [
        "num_right_blend not recorded (checked before the target read it)"
    ]


def test_a_passing_check_is_written_and_a_miss_is_refused(shipped_dir) -> None:
    path = record_followups_check(_check((12, 12), (12, 11)), "m", "float32", "f" * 64)
    entry = BlendSettingsRecord.from_json(path.read_text()).measured["followups_check"]
    assert entry["meets_target"] is True
    assert (entry["num_right_full"], entry["num_right_blend"]) == ({"ask": 12, "v1": 12}, {"ask": 12, "v1": 11})
    before = path.read_text()
    with pytest.raises(FollowupsCheckError, match="/ask: 9 right against full prefill's 12"):
        record_followups_check(_check((12, 9), (12, 12)), "m", "float32", "f" * 64)
    with pytest.raises(FollowupsCheckError, match="no shipped record for m in bfloat16"):
        record_followups_check(_check((12, 12), (12, 12)), "m", "bfloat16", "f" * 64)
    assert path.read_text() == before
