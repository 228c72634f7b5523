"""A shipped record takes a held-out check only when it meets the target on enough examples, on its own weights."""

from __future__ import annotations

import dataclasses
import math

import pytest

from app.calibration.heldout_check import HeldoutCheck, HeldoutCheckError, record_heldout_check
from app.calibration.record import BlendSettingsRecord


def _check(kl_x_reuse: float, benefit: float, num_examples: int = 20) -> HeldoutCheck:
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
        f1_full=0.5,
        f1_blend=0.45,
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
