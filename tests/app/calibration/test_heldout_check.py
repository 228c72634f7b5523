"""A shipped record takes a held-out check only when it meets the target on enough examples, on its own weights."""

from __future__ import annotations

import dataclasses
import math

import pytest

from app.calibration.heldout_check import HeldoutCheck, HeldoutCheckError, entry_misses, record_heldout_check
from app.calibration.record import BlendSettingsRecord


def _check(
    kl_x_reuse: float, benefit: float, num_examples: int = 20, f1_full: float = 0.5, f1_blend: float = 0.49
) -> HeldoutCheck:
    return HeldoutCheck(
        dataset="nq6_dev.json",
        num_examples=num_examples,
        num_passages=6,
        seed=0,
        order="file",
        kv_storage_dtype="int4",
        kl_blend=0.05,
        kl_reuse=0.05 / kl_x_reuse if kl_x_reuse else 0.2,
        kl_x_reuse=kl_x_reuse,
        kl_x_reuse_ci95=[0.1, 0.4],
        benefit_retained=benefit,
        benefit_ci95=[0.9, 1.1],
        f1_full=f1_full,
        f1_blend=f1_blend,
        blend={"recompute_ratio": 0.2, "match_labels": True},
        checked_at="2026-12-06T01:00:00+00:00",
        chunk_lead_in=False,
    )


@pytest.fixture
def shipped_dir(ship_record):
    return ship_record("bfloat16", {"recompute_ratio": 0.2}, {"kl_ratio": 0.1})


def test_the_target_is_kl_at_most_0_3_of_reuses_and_benefit_at_least_0_95() -> None:
    assert _check(0.3, 0.95).meets_target and _check(0.0, 1.2).meets_target
    assert _check(0.31, 1.0).misses() == ["KL 0.310× reuse's > 0.3"]
    assert _check(0.2, 0.949).misses() == ["benefit retained 0.949 < 0.95"]
    assert len(_check(math.nan, math.nan).misses()) == 2  # reuse's KL 0, no context gain: nothing to judge by


def test_the_answers_may_fall_at_most_0_03_below_full_prefills_gold_f1() -> None:
    assert _check(0.2, 1.0, f1_full=0.5, f1_blend=0.47).meets_target  # 0.03 below: met
    assert _check(0.2, 1.0, f1_full=0.4, f1_blend=0.55).meets_target  # above full prefill's
    # The 1.5B's bfloat16 candidate at 0.13: KL and benefit met on the gate's 60, the answers 0.060 worse.
    check = _check(0.1186, 0.9637, num_examples=60, f1_full=0.5137, f1_blend=0.4533)
    assert check.misses() == ["gold-answer F1 0.453, 0.060 below full prefill's 0.514 > 0.03"]
    assert not check.meets_target
    both = _check(0.31, 1.0, f1_full=0.5, f1_blend=0.46).misses()
    assert both == ["KL 0.310× reuse's > 0.3", "gold-answer F1 0.460, 0.040 below full prefill's 0.500 > 0.03"]


def test_every_shipped_records_heldout_entry_meets_todays_target() -> None:
    """A record's held-out entry is the check it shipped on: each must meet the target as it stands now."""
    from app.calibration.shipped import SHIPPED_DIR

    entries = {
        path.name: BlendSettingsRecord.from_json(path.read_text()).measured["heldout_check"]
        for path in sorted(SHIPPED_DIR.glob("*.json"))
    }
    assert len(entries) >= 6
    for name, entry in entries.items():
        assert entry["num_examples"] == 60 and entry_misses(entry) == [], name


def test_a_recorded_entry_is_judged_again_by_todays_target() -> None:
    met = _check(0.1186, 0.9637, num_examples=60, f1_full=0.5137, f1_blend=0.5084).to_dict()
    assert entry_misses(met) == [] and entry_misses(met | {"meets_target": False, "target": "older"}) == []
    assert entry_misses(met | {"f1_blend": 0.4533}) == ["gold-answer F1 0.453, 0.060 below full prefill's 0.514 > 0.03"]


def test_a_passing_check_is_written_beside_what_the_record_measured(shipped_dir) -> None:
    path = record_heldout_check(_check(0.23, 1.0), "m", "bfloat16", "f" * 64)
    record = BlendSettingsRecord.from_json(path.read_text())
    assert record.values == {"recompute_ratio": 0.2} and record.measured["kl_ratio"] == 0.1
    entry = record.measured["heldout_check"]
    assert entry["meets_target"] is True and (entry["kl_x_reuse"], entry["benefit_retained"]) == (0.23, 1.0)
    assert entry["checked_on"] == (
        "nq6_dev.json (20 examples × 6 passages, seed 0, file order), KV read as int4: the default blend, reuse and "
        "full prefill on the same prompts"
    )
    assert entry["blend"] == {"recompute_ratio": 0.2, "match_labels": True}
    assert entry["by_window"] is None  # a check measured before the windows were recorded


def test_the_windows_are_recorded_and_one_under_a_target_does_not_refuse_a_check_that_meets_it(shipped_dir) -> None:
    windows = [
        {"examples": [1, 20], "kl_x_reuse": 0.14, "benefit_retained": 1.004},
        {"examples": [21, 40], "kl_x_reuse": 0.2, "benefit_retained": 1.0},
        {"examples": [41, 60], "kl_x_reuse": 0.08, "benefit_retained": 0.934},
    ]
    check = dataclasses.replace(_check(0.126, 0.975, num_examples=60), by_window=windows)
    assert check.meets_target and check.misses() == []
    entry = BlendSettingsRecord.from_json(record_heldout_check(check, "m", "bfloat16", "f" * 64).read_text()).measured[
        "heldout_check"
    ]
    assert entry["by_window"] == windows and entry["num_examples"] == 60


def test_a_miss_too_few_examples_another_fingerprint_or_no_record_is_refused_and_nothing_changes(
    shipped_dir,
) -> None:
    before = (shipped_dir / "m.bfloat16.json").read_text()
    with pytest.raises(HeldoutCheckError, match="misses the target on nq6_dev.json \\(KL 0.340× reuse's > 0.3"):
        record_heldout_check(_check(0.34, 1.0), "m", "bfloat16", "f" * 64)
    with pytest.raises(HeldoutCheckError, match="12 examples; the check needs 20"):
        record_heldout_check(_check(0.1, 1.0, num_examples=12), "m", "bfloat16", "f" * 64)
    with pytest.raises(HeldoutCheckError, match="fingerprint ffffffffffff"):
        record_heldout_check(_check(0.1, 1.0), "m", "bfloat16", "e" * 64)
    with pytest.raises(HeldoutCheckError, match="no shipped record for m in float32"):
        record_heldout_check(_check(0.1, 1.0), "m", "float32", "f" * 64)
    assert (shipped_dir / "m.bfloat16.json").read_text() == before
    assert [p.name for p in shipped_dir.iterdir()] == ["m.bfloat16.json"]
