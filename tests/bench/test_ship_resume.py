"""`bench ship --resume`: an earlier run's calibration stands in for the step only when it is the calibration this run
would measure; the check parts always run."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.calibration.calset import describe, make_cases
from app.calibration.record import BlendSettingsRecord
from bench.__main__ import build_parser
from bench.harness import server_kv_dtype
from bench.ship import Step
from bench.ship_resume import RECEIPT_KEY, calibration_mismatch, check_mismatch, rechoose

CALSET = describe(make_cases(2, 1, 2))
FINGERPRINT = "f" * 64
# Figures each check part's entry holds when it passes today's target (a resumed pass is judged by them again).
PASSING: dict[str, dict[str, Any]] = {
    "similar_check": {"num_cases": 12, "num_right_full": 12, "num_right_blend": 11},
    "similar_several_check": {"num_cases": 12, "num_right_full": 11, "num_right_blend": 10},
    "followups_check": {"num_right_full": {"ask": 12, "v1": 12}, "num_right_blend": {"ask": 12, "v1": 11}},
    "heldout_check": {"kl_x_reuse": 0.1186, "benefit_retained": 0.9637, "f1_full": 0.5137, "f1_blend": 0.5084},
    "long_answers_check": {
        "repetition_full": 0,
        "repetition_blend": 1,
        "length_full": 1,
        "length_blend": 1,
        "max_tokens": 300,
    },
}


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the gate ships model m's bfloat16 record (a temporary shipped dir), holding a record from before; the
    weights' fingerprint is FINGERPRINT."""
    from app.calibration import shipped
    from bench import ship

    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)
    monkeypatch.setattr(ship, "model_fingerprint", lambda args: FINGERPRINT)
    path = tmp_path / "m.bfloat16.json"
    path.write_bytes(b'{"model": "m", "values": {"recompute_ratio": 0.25}}\n')
    return path


def _record(ratio: float = 0.15, fingerprint: str = FINGERPRINT, **values: Any) -> BlendSettingsRecord:
    tried = [
        {"values": {"recompute_ratio": ratio, "score_layers": [4, 8]} | values, "figures": {"kl_x_reuse": 0.2}},
        {"values": {"recompute_ratio": ratio, "score_layers": [6]} | values, "figures": {"kl_x_reuse": 0.25}},
    ]
    return BlendSettingsRecord(
        model="m",
        fingerprint=fingerprint,
        compute_dtype="bfloat16",
        values=tried[0]["values"],
        calibrated_at="2026-12-06T00:00:00+00:00",
        calibration_set=CALSET,
        measured={
            "targets_met": True,
            "kv_storage_dtype": server_kv_dtype(),  # what a calibration in this run measures
            "chunk_lead_in": False,
            "chosen": tried[0]["figures"],
            "tried": [t | {"misses": []} for t in tried],
        },
    )


def _calibrate(step: Step, record_path: Path, calibration: BlendSettingsRecord) -> None:
    """What a calibration step does: ship its record and write its result (the record) to its --out."""
    record_path.write_text(calibration.to_json())
    Path(step.argv[step.argv.index("--out") + 1]).write_text(json.dumps(_result(calibration)))


def _result(record: BlendSettingsRecord) -> dict[str, Any]:
    return {"benchmark": "calibrate", "record": json.loads(record.to_json())}


def _mismatch(result: dict[str, Any], fingerprint: str = FINGERPRINT, **fixed: Any) -> str | None:
    return calibration_mismatch(
        result,
        model="m",
        compute_dtype="bfloat16",
        calibration_set=CALSET,
        ratio=0.15,
        fixed=fixed,
        kv_dtype=server_kv_dtype(),
        fingerprint=lambda: fingerprint,
    )


def test_a_calibration_stands_for_this_runs_only_with_the_same_model_weights_set_ratio_and_held_values() -> None:
    assert _mismatch(_result(_record())) is None
    assert _mismatch(_result(_record(match_labels=True)), match_labels=True) is None
    assert _mismatch({"benchmark": "lookup"}) == "not a calibration result"
    other_model = _result(dataclasses.replace(_record(), model="n"))
    assert _mismatch(other_model) == "model 'n', this run's is 'm'"
    other_dtype = _result(dataclasses.replace(_record(), compute_dtype="float32"))
    assert _mismatch(other_dtype) == "compute dtype 'float32', this run's is 'bfloat16'"
    other_set = _result(dataclasses.replace(_record(), calibration_set="calset-2: 8 lookup"))
    assert _mismatch(other_set) == f"calibration set 'calset-2: 8 lookup', this run's is {CALSET!r}"
    other_kv = _result(_record())
    other_kv["record"]["measured"]["kv_storage_dtype"] = "fp32"
    assert _mismatch(other_kv) == f"KV storage dtype 'fp32', this run's is {server_kv_dtype()!r}"
    assert _mismatch(_result(_record(ratio=0.2))) == "measured ratios [0.2], this step's is 0.15 alone"
    assert (
        _mismatch(_result(_record()), match_labels=True)
        == "candidates without match_labels=True (held fixed in this run)"
    )
    assert _mismatch(_result(_record()), fingerprint="e" * 64) == (
        "measured on fingerprint ffffffffffff, these weights are eeeeeeeeeeee"
    )


def test_resume_puts_the_earlier_calibration_in_the_record_and_runs_every_check_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_step_result: Callable[..., None], record: Path
) -> None:
    from bench import ship

    before = record.read_bytes()
    calibration = _record(match_labels=True)
    ran: list[str] = []

    def run_step(step: Step) -> int:
        ran.append(step.name)
        if step.name == "calibrate":
            _calibrate(step, record, calibration)
            return 0
        if not resumed:
            raise KeyboardInterrupt  # the first run is stopped after its calibration
        write_step_result(step, right_blend=11)
        return 0

    argv = ["ship", "--model", "m", "--dtype", "bfloat16", "--ratios", "0.15", "--cases", "2,1,2"]
    argv += ["--with", "match_labels=true", "--out", str(tmp_path / "gate.json")]
    args = build_parser().parse_args(argv)
    resumed = False
    with pytest.raises(KeyboardInterrupt):
        ship.main(args, run_step=run_step)
    assert record.read_bytes() == before and ran == ["calibrate", "similar_check"]

    resumed, ran[:] = True, []
    args = build_parser().parse_args([*argv, "--resume"])
    assert ship.main(args, run_step=run_step) == 0
    assert ran == ["similar_check", "similar_several_check", "followups_check", "heldout_check", "long_answers_check"]
    shipped_record = BlendSettingsRecord.from_json(record.read_text())
    assert shipped_record.values == calibration.values and shipped_record.measured["ship_gate"]["shipped_ratio"] == 0.15
    summary = json.loads(args.out.read_text())
    assert summary["reused"] == ["gate.0.15.calibrate.json"] and summary["shipped_ratio"] == 0.15

    # Another model's weights (or any other difference): the calibration is measured again.
    monkeypatch.setattr(ship, "model_fingerprint", lambda args: "e" * 64)
    ran[:] = []
    assert ship.main(args, run_step=run_step) == 0
    assert ran[0] == "calibrate" and json.loads(args.out.read_text())["reused"] == []


def test_a_resumed_calibration_is_chosen_from_again_by_todays_rule() -> None:
    # Calibrated before the near-tie rule: it chose two scoring layers at 0.2x; five layers at 0.205x is a near-tie
    # and goes first now, with its own figures as the chosen point's.
    earlier = _record()
    tried = earlier.measured["tried"]
    five = {"recompute_ratio": 0.15, "score_layers": [2, 4, 6, 8, 10]}
    tried.append({"values": five, "figures": {"kl_x_reuse": 0.205}, "misses": []})
    now = rechoose(earlier)
    assert now.values == five
    assert now.measured["chosen"] == {"kl_x_reuse": 0.205} and now.measured["tried"] == tried
    assert dataclasses.replace(now, values=earlier.values, measured=earlier.measured) == earlier
    # Already today's choice, or none met the targets (the fallback's rule is unchanged): the record as it is.
    tried[2]["misses"] = ["benefit 0.9 < 0.95"]
    assert rechoose(earlier) is earlier
    # A tie on the record's rounded figures (the same KL and as many layers, listed first) keeps its choice.
    tried.insert(0, {"values": {"recompute_ratio": 0.15, "score_layers": [5, 9]}, "figures": {"kl_x_reuse": 0.2},
                     "misses": []})  # fmt: skip
    assert rechoose(earlier) is earlier
    for t in tried:
        t["misses"] = ["benefit 0.9 < 0.95"]
    assert rechoose(earlier) is earlier


def test_resume_takes_back_the_check_parts_that_ran_on_the_record_as_it_is(
    tmp_path: Path, write_step_result: Callable[..., None], record: Path
) -> None:
    from app.calibration.check_record import write_check
    from bench import ship

    before = record.read_bytes()
    calibration = _record()
    ran: list[str] = []
    stop_at = "heldout_check"

    def run_step(step: Step) -> int:
        ran.append(step.name)
        if step.name == "calibrate":
            _calibrate(step, record, calibration)
            return 0
        if step.name == stop_at:
            raise KeyboardInterrupt
        write_step_result(step, right_blend=11)
        values = BlendSettingsRecord.from_json(record.read_text()).values
        entry = {"blend": values, "n": len(ran), **PASSING[step.name]}
        write_check(step.name, entry, "m", "bfloat16", FINGERPRINT, ValueError)
        return 0

    argv = ["ship", "--model", "m", "--dtype", "bfloat16", "--ratios", "0.15", "--cases", "2,1,2"]
    argv += ["--out", str(tmp_path / "gate.json")]
    args = build_parser().parse_args(argv)
    with pytest.raises(KeyboardInterrupt):
        ship.main(args, run_step=run_step)
    assert record.read_bytes() == before
    assert ran == ["calibrate", "similar_check", "similar_several_check", "followups_check", "heldout_check"]
    receipt = json.loads((tmp_path / "gate.0.15.similar_check.json").read_text())[RECEIPT_KEY]
    assert receipt == {
        "argv": receipt["argv"],
        "rc": 0,
        "fingerprint": FINGERPRINT,
        "values": calibration.values,
        "entry": {"blend": calibration.values, "n": 2, **PASSING["similar_check"]},
    }
    assert receipt["argv"][:3] == ["lookup", "--distractors", "similar"]
    assert not (tmp_path / "gate.0.15.heldout_check.json").exists()  # stopped before it wrote a result

    # Resumed: the three check parts that ran come back with their entries, the other two run.
    ran[:], stop_at = [], ""
    args = build_parser().parse_args([*argv, "--resume"])
    assert ship.main(args, run_step=run_step) == 0
    assert ran == ["heldout_check", "long_answers_check"]
    measured = BlendSettingsRecord.from_json(record.read_text()).measured
    assert [measured[k]["n"] for k in ("similar_check", "similar_several_check", "followups_check")] == [2, 3, 4]
    assert measured["heldout_check"]["n"] == 1 and measured["long_answers_check"]["n"] == 2
    assert json.loads(args.out.read_text())["reused"] == [
        "gate.0.15.calibrate.json", "gate.0.15.similar_check.json", "gate.0.15.similar_several_check.json",
        "gate.0.15.followups_check.json",
    ]  # fmt: skip

    # A receipt of a miss is a miss again: the gate stops the ratio without running the part.
    several = tmp_path / "gate.0.15.similar_several_check.json"
    result = json.loads(several.read_text())
    result[RECEIPT_KEY] |= {"rc": 1, "entry": None}
    several.write_text(json.dumps(result))
    record.write_bytes(before)
    ran[:] = []
    assert ship.main(args, run_step=run_step) == 1
    assert ran == [] and record.read_bytes() == before
    summary = json.loads(args.out.read_text())
    assert [(o["ratio"], o["missed"]) for o in summary["outcomes"]] == [(0.15, "similar_several_check")]


def test_a_resumed_heldout_pass_is_judged_again_by_todays_target(
    tmp_path: Path, write_step_result: Callable[..., None], record: Path
) -> None:
    """A held-out pass written before its target gained the answers' gold F1 (the 1.5B's 0.13 candidate: KL and
    benefit met, F1 0.060 below full prefill's) comes back from --resume as a miss, without running again."""
    from app.calibration.check_record import write_check
    from bench import ship

    before = record.read_bytes()
    calibration = _record()
    ran: list[str] = []
    f1_blend = 0.4533

    def run_step(step: Step) -> int:
        ran.append(step.name)
        if step.name == "calibrate":
            _calibrate(step, record, calibration)
            return 0
        write_step_result(step, right_blend=11)
        values = BlendSettingsRecord.from_json(record.read_text()).values
        entry: dict[str, Any] = {"blend": values, **PASSING[step.name]}
        if step.name == "heldout_check":  # the figures the held-out part writes, as a pass of its time did
            entry |= {"f1_blend": f1_blend}
        write_check(step.name, entry, "m", "bfloat16", FINGERPRINT, ValueError)
        return 0

    argv = ["ship", "--model", "m", "--dtype", "bfloat16", "--ratios", "0.15", "--cases", "2,1,2"]
    argv += ["--out", str(tmp_path / "gate.json")]
    assert ship.main(build_parser().parse_args(argv), run_step=run_step) == 0  # every part passed when it ran

    record.write_bytes(before)
    ran[:] = []
    args = build_parser().parse_args([*argv, "--resume"])
    assert ship.main(args, run_step=run_step) == 1
    assert ran == [] and record.read_bytes() == before  # nothing measured again; the record from before is back
    summary = json.loads(args.out.read_text())
    assert [(o["ratio"], o["missed"]) for o in summary["outcomes"]] == [(0.15, "heldout_check")]

    # A pass that meets today's target too comes back as a pass.
    f1_blend = 0.5084
    assert ship.main(build_parser().parse_args(argv), run_step=run_step) == 0
    record.write_bytes(before)
    ran[:] = []
    assert ship.main(args, run_step=run_step) == 0 and ran == []
    assert BlendSettingsRecord.from_json(record.read_text()).measured["heldout_check"]["f1_blend"] == 0.5084


def test_a_check_parts_receipt_stands_only_for_the_same_command_weights_and_settings() -> None:
    record = _record()
    argv = ["lookup", "--shape", "one", "--out", "x.json"]
    receipt = {"argv": argv, "rc": 0, "fingerprint": FINGERPRINT, "values": record.values, "entry": {"right": 11}}
    assert check_mismatch(receipt, argv, record) is None
    assert check_mismatch(receipt | {"rc": 1, "entry": None}, argv, record) is None  # a miss stands as a miss
    assert check_mismatch(None, argv, record) == "no receipt"
    assert check_mismatch(receipt, [*argv[:-1], "y.json"], record) == "another command line"
    assert check_mismatch(receipt | {"fingerprint": "e" * 64}, argv, record) == (
        "measured on fingerprint eeeeeeeeeeee, the record's is ffffffffffff"
    )
    other = dataclasses.replace(record, values=record.values | {"score_layers": [6]})
    assert check_mismatch(receipt, argv, other) == (
        "ran on {'recompute_ratio': 0.15, 'score_layers': [4, 8]}, the record holds "
        "{'recompute_ratio': 0.15, 'score_layers': [6]}"
    )
    assert check_mismatch(receipt | {"rc": 1}, argv, record) == "a miss with an entry"


def test_a_resumed_pass_of_any_part_is_judged_by_its_parts_target_as_it_is_today(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each check part judges its own entry (app/calibration/check_parts.py): a target tightened after a receipt
    was written turns that receipt's pass into a miss, whichever part it is."""
    from app.calibration import followups_check, long_answers_check, similar_check
    from bench.ship_resume import todays_misses

    assert {name: todays_misses(name, entry) for name, entry in PASSING.items()} == dict.fromkeys(PASSING, [])
    monkeypatch.setattr(similar_check, "RIGHT_WITHIN", 0)
    monkeypatch.setattr(followups_check, "RIGHT_WITHIN", 0)
    monkeypatch.setattr(long_answers_check, "EXTRA_ALLOWED", 0)
    assert {name: todays_misses(name, entry) for name, entry in PASSING.items()} == {
        "similar_check": ["11 of 12 right against full prefill's 12"],
        "similar_several_check": ["10 of 12 right against full prefill's 11"],
        "followups_check": ["/v1: 11 right against full prefill's 12"],
        "heldout_check": [],
        "long_answers_check": ["1 repetition stops against full prefill's 0"],
    }
    # An entry without a figure today's target reads, or a step that is no check part, cannot be judged a pass.
    assert todays_misses("similar_check", {"num_cases": 12, "num_right_blend": 11}) == [
        "num_right_full not recorded (checked before the target read it)"
    ]
    assert todays_misses("similar_check", None) == ["its entry is no mapping"]
    # A figure of the wrong kind (a record edited by hand) misses by that; --resume does not crash on it.
    [miss] = todays_misses("similar_check", PASSING["similar_check"] | {"num_right_blend": "eleven"})
    assert miss.startswith("figures not readable (")
    assert todays_misses("calibrate", PASSING["similar_check"]) == ["calibrate is no check part"]
