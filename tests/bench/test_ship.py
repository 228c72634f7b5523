"""`python -m bench ship`: the record at the lowest ratio whose calibration and every check part hold; otherwise the
record shipped before, untouched."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.__main__ import build_parser, main
from bench.ship import Step, result_path, run_gate, steps_at

WriteStepResult = Callable[..., None]  # tests/bench/conftest.py's write_step_result


def _args(tmp_path: Path, *extra: str):
    argv = ["ship", "--model", "m", "--dtype", "float32", "--threads", "2", "--out", str(tmp_path / "gate.json")]
    args = build_parser().parse_args([*argv, *extra])
    args.models_dir = tmp_path / "models"
    return args


def test_each_ratio_runs_the_calibration_then_the_check_parts_as_their_own_subcommands(tmp_path: Path) -> None:
    args = _args(tmp_path, "--cases", "2,1,2", "--check-cases", "6", "--long-max-tokens", "40")
    args.heldout_dataset = Path("qa.json")
    steps = steps_at(args, 0.2, args.out)
    assert [s.name for s in steps] == [
        "calibrate", "similar_check", "similar_several_check", "followups_check", "heldout_check", "long_answers_check",
    ]  # fmt: skip
    common = ["--model", "m", "--dtype", "float32", "--models-dir", str(tmp_path / "models"), "--threads", "2"]
    similar = ["lookup", "--distractors", "similar", "--part", "check", "--examples", "6", "--max-tokens", "32"]
    similar += ["--selectors", "query", "--ship"]
    assert steps[0].argv == [
        "calibrate", "--ratios", "0.2", "--cases", "2,1,2", "--ship", *common,
        "--out", str(tmp_path / "gate.0.2.calibrate.json"),
    ]  # fmt: skip
    assert steps[1].argv == [
        *similar,
        "--shape",
        "one",
        *common,
        "--out",
        str(tmp_path / "gate.0.2.similar_check.json"),
    ]
    assert steps[2].argv[-4:] == ["--threads", "2", "--out", str(tmp_path / "gate.0.2.similar_several_check.json")]
    assert steps[3].argv == [
        "conversation", "--lookup", "12", "--examples", "0", "--no-timings", "--ship", *common,
        "--out", str(tmp_path / "gate.0.2.followups_check.json"),
    ]  # fmt: skip
    assert steps[4].argv == [
        "quality", "--dataset", "qa.json", "--examples", "60", "--passages", "6", "--baselines", "reuse", "--ship",
        *common, "--out", str(tmp_path / "gate.0.2.heldout_check.json"),
    ]  # fmt: skip
    assert steps[5].argv[:4] == ["long-answers", "--max-tokens", "40", "--ship"]
    # Settings held fixed go to the calibration, which writes them into the record the check parts then run on.
    held = steps_at(_args(tmp_path, "--with", "match_labels=true"), 0.15, args.out)
    assert held[0].argv[:7] == [
        "calibrate",
        "--ratios",
        "0.15",
        "--cases",
        "8,4,8",
        "--ship",
        "--with=match_labels=true",
    ]
    assert all("--with=match_labels=true" not in step.argv for step in held[1:])
    # Every step parses as the subcommand a person would run by hand.
    for step in steps:
        assert build_parser().parse_args(step.argv).command == step.argv[0]


def test_the_gate_stops_a_ratio_at_its_first_miss_and_ships_the_first_that_holds(
    tmp_path: Path, write_step_result: WriteStepResult
) -> None:
    args = _args(tmp_path)
    ran: list[tuple[float, str]] = []

    def run_step(step: Step) -> int:
        out = Path(step.argv[step.argv.index("--out") + 1])  # gate.<ratio>.<step>.json
        ratio = float(out.name.split(".", 1)[1].rsplit(".", 2)[0])
        ran.append((ratio, step.name))
        if ratio == 0.15:  # its calibration meets the targets, its first check part misses (exit 1)
            write_step_result(step, right_blend=8)
            return 1 if step.name == "similar_check" else 0
        if ratio == 0.2:  # a calibration that misses its own targets exits 0 and says so in its record
            write_step_result(step, right_blend=11, targets_met=False)
            return 0
        write_step_result(step, right_blend=10)
        return 0

    outcomes = run_gate([0.15, 0.2, 0.25, 0.3], lambda r, a: steps_at(args, r, args.out, a), run_step)
    assert ran == [
        (0.15, "calibrate"), (0.15, "similar_check"),
        (0.2, "calibrate"),
        (0.25, "calibrate"), (0.25, "similar_check"), (0.25, "similar_several_check"), (0.25, "followups_check"),
        (0.25, "heldout_check"), (0.25, "long_answers_check"),
    ]  # fmt: skip
    assert [(o.ratio, o.held, o.missed) for o in outcomes] == [
        (0.15, False, "similar_check"),
        (0.2, False, "calibrate"),
        (0.25, True, None),
    ]
    assert outcomes[0].steps[1].figures == {"right_full": 11, "right_reuse": 4, "right_blend": 8}
    assert outcomes[2].steps[3].figures == {
        "ask": {"right_full": 12, "right_blend": 10},
        "v1": {"right_full": 12, "right_blend": 10},
    }
    assert outcomes[2].steps[4].figures == {
        "kl_x_reuse": 0.2,
        "benefit_retained": 0.99,
        "f1_blend": 0.42,
        "f1_full": 0.43,
    }
    assert outcomes[2].steps[5].figures == {"finish_full": {"stop": 12}, "finish_blend": {"stop": 12}, "agrees": 9}
    assert outcomes[2].steps[1].result == result_path(args.out, 0.25, "similar_check").name


def test_when_no_ratio_holds_the_record_shipped_before_is_put_back_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_step_result: WriteStepResult
) -> None:
    from app.calibration import shipped
    from bench import ship

    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)
    record = tmp_path / "m.float32.json"
    before = b'{"model": "m", "values": {"recompute_ratio": 0.15}}\n'
    record.write_bytes(before)

    def run_step(step: Step) -> int:
        record.write_text("a calibration's record, then its check parts")  # what a real step would overwrite
        write_step_result(step, right_blend=5)
        return 1 if step.name == "long_answers_check" else 0

    args = _args(tmp_path, "--ratios", "0.25,0.15")
    assert ship.main(args, run_step=run_step) == 1
    assert record.read_bytes() == before
    summary = json.loads(args.out.read_text())
    assert summary["ratios"] == [0.15, 0.25] and summary["shipped_ratio"] is None and summary["record"] is None
    assert [o["missed"] for o in summary["outcomes"]] == ["long_answers_check", "long_answers_check"]

    # Stopped half-way (an error, ^C): the same.
    def interrupted(step: Step) -> int:
        record.write_text("half a run")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ship.main(args, run_step=interrupted)
    assert record.read_bytes() == before
    summary = json.loads(args.out.read_text())  # what ran before the stop: the first ratio, no step finished
    assert summary["stopped"] is True and summary["shipped_ratio"] is None
    assert summary["outcomes"] == [
        {"ratio": 0.15, "steps": [], "alternative": 1, "values": None, "held": False, "missed": None}
    ]

    # Stopped by SIGTERM (kill, a service manager): the same, and exit code 1.
    def killed(step: Step) -> int:
        record.write_text("half a run")
        os.kill(os.getpid(), signal.SIGTERM)
        return 0

    assert ship.main(args, run_step=killed) == 1
    assert record.read_bytes() == before
    assert json.loads(args.out.read_text())["stopped"] is True
    # No record before the run: none after it.
    record.unlink()
    assert ship.main(args, run_step=run_step) == 1
    assert not record.exists()


def test_a_check_part_miss_puts_the_calibrations_next_passing_candidate_in_the_record_and_checks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_step_result: WriteStepResult
) -> None:
    from app.calibration import shipped
    from app.calibration.record import BlendSettingsRecord
    from bench import ship

    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)
    record = tmp_path / "m.float32.json"
    before = b'{"model": "m", "values": {"recompute_ratio": 0.25}}\n'
    record.write_bytes(before)

    def candidate(layers: list[int], kl: float, misses: list[str] | None = None, ratio: float = 0.15) -> dict:
        values = {"recompute_ratio": ratio, "score_layers": layers}
        return {"values": values, "figures": {"kl_x_reuse": kl}, "misses": misses or []}

    tried = [
        candidate([10], 0.31, ["KL 0.31x reuse > 0.3"]),  # missed the calibration's targets: never an alternative
        candidate([6, 12, 18], 0.248),
        candidate([4, 8, 12, 16, 20], 0.252),  # the calibration's choice: a near-tie, at more layers
        candidate([8, 16], 0.27),  # beyond the near-tie: third
        candidate([6, 12, 18], 0.1, ratio=0.2),  # another ratio's
    ]
    ran: list[str] = []

    def run_step(step: Step) -> int:
        out = Path(step.argv[step.argv.index("--out") + 1])
        ran.append(out.name)
        if step.name == "calibrate":
            chosen = BlendSettingsRecord(
                model="m",
                fingerprint="f" * 64,
                compute_dtype="float32",
                values=tried[2]["values"],
                calibrated_at="2026-12-06T00:00:00+00:00",
                calibration_set="calset-3",
                measured={"targets_met": True, "chosen": tried[2]["figures"], "tried": tried},
            )
            record.write_text(chosen.to_json())
            out.write_text(json.dumps({"record": json.loads(chosen.to_json())}))
            return 0
        values = BlendSettingsRecord.from_json(record.read_text()).values
        write_step_result(step, right_blend=10)
        if step.name == "similar_check":  # what a check part writes into the record when it holds
            from app.calibration.check_record import write_check

            write_check("similar_check", {"blend": values}, "m", "float32", "f" * 64, ValueError)
        # The choice misses the held-out part, the next candidate holds everything.
        return 1 if step.name == "heldout_check" and values["score_layers"] in missing else 0

    missing = [[4, 8, 12, 16, 20]]

    args = _args(tmp_path, "--ratios", "0.15", "--alternatives", "3")
    assert ship.main(args, run_step=run_step) == 0
    assert ran == [
        "gate.0.15.calibrate.json", "gate.0.15.similar_check.json", "gate.0.15.similar_several_check.json",
        "gate.0.15.followups_check.json", "gate.0.15.heldout_check.json",
        "gate.0.15.alt2.similar_check.json", "gate.0.15.alt2.similar_several_check.json",
        "gate.0.15.alt2.followups_check.json", "gate.0.15.alt2.heldout_check.json",
        "gate.0.15.alt2.long_answers_check.json",
    ]  # fmt: skip
    shipped_record = BlendSettingsRecord.from_json(record.read_text())
    assert shipped_record.values == {"recompute_ratio": 0.15, "score_layers": [6, 12, 18]}
    measured = shipped_record.measured
    assert measured["chosen"] == {"kl_x_reuse": 0.248}
    assert measured["gate_alternative"]["rank"] == 2 and measured["gate_alternative"]["of"] == 3
    assert measured["gate_alternative"]["calibration_choice"] == tried[2]["values"]
    assert "candidate 1: heldout_check" in measured["gate_alternative"]["why"]
    # The check parts in the record ran on the settings it ships: the choice's entry was dropped, the new one written.
    assert measured["similar_check"] == {"blend": shipped_record.values}
    gate = measured["ship_gate"]
    assert gate["ratios_tried"] == [0.15] and (gate["shipped_ratio"], gate["shipped_candidate"]) == (0.15, 2)
    assert [(b["candidate"], b["missed"], b["values"]) for b in gate["below"]] == [(1, "heldout_check", None)]

    # The second misses too: the third ships, and the record names the calibration's own choice, not the second.
    missing.append([6, 12, 18])
    record.write_bytes(before)
    assert ship.main(args, run_step=run_step) == 0
    measured = BlendSettingsRecord.from_json(record.read_text()).measured
    assert (measured["gate_alternative"]["rank"], measured["gate_alternative"]["of"]) == (3, 3)
    assert measured["gate_alternative"]["calibration_choice"] == tried[2]["values"]

    # With no more passing candidates than tried, the ratio ends and the record from before comes back.
    missing[:] = [[4, 8, 12, 16, 20]]
    tried[1]["misses"] = tried[3]["misses"] = ["benefit 0.9 < 0.95"]
    record.write_bytes(before)
    assert ship.main(args, run_step=run_step) == 1
    assert record.read_bytes() == before
    summary = json.loads(args.out.read_text())
    assert [(o["ratio"], o["alternative"], o["missed"]) for o in summary["outcomes"]] == [(0.15, 1, "heldout_check")]


def test_ship_refuses_a_dtype_that_is_not_a_records_the_lead_in_and_an_unknown_setting() -> None:
    with pytest.raises(SystemExit, match="per compute dtype"):
        main(["ship", "--model", "m", "--dtype", "auto"])
    with pytest.raises(SystemExit, match="no lead-in"):
        main(["ship", "--model", "m", "--dtype", "float32", "--lead-in"])
    with pytest.raises(SystemExit, match="--with: expected BLEND_SETTING=VALUE, got 'nonsense=1'"):
        main(["ship", "--model", "m", "--dtype", "float32", "--resume", "--with", "nonsense=1"])


@pytest.mark.slow
def test_ship_on_a_tiny_model_writes_one_record_with_every_check_part_and_the_gate(
    tmp_path: Path, tiny_llama_dir: Path, dataset20_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end through the real subcommands: at ratio 1 the blend is full prefill, so every part holds."""
    from app.calibration import shipped
    from app.calibration.record import BlendSettingsRecord

    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path / "shipped")
    (tmp_path / "shipped").mkdir()
    out = tmp_path / "gate.json"
    argv = ["ship", "--model", str(tiny_llama_dir), "--dtype", "float32", "--threads", "2", "--ratios", "1.0"]
    argv += ["--cases", "1,1,1", "--check-cases", "2", "--long-max-tokens", "4", "--out", str(out)]
    argv += ["--followups", "2", "--heldout-dataset", str(dataset20_path), "--heldout-passages", "2"]
    assert main(argv) == 0
    [path] = (tmp_path / "shipped").iterdir()
    record = BlendSettingsRecord.from_json(path.read_text())
    assert record.values["recompute_ratio"] == 1.0 and record.compute_dtype == "float32"
    measured = record.measured
    assert {
        "similar_check", "similar_several_check", "followups_check", "heldout_check", "long_answers_check", "ship_gate",
    } <= measured.keys()  # fmt: skip
    assert measured["similar_check"]["num_cases"] == measured["similar_several_check"]["num_cases"] == 2
    assert measured["followups_check"]["num_projects"] == 2 and measured["heldout_check"]["num_examples"] == 20
    assert measured["ship_gate"]["ratios_tried"] == [1.0] and measured["ship_gate"]["below"] == []
    summary = json.loads(out.read_text())
    assert summary["shipped_ratio"] == 1.0 and summary["record"] == path.name
    assert [s["name"] for s in summary["outcomes"][0]["steps"]] == [
        "calibrate", "similar_check", "similar_several_check", "followups_check", "heldout_check", "long_answers_check",
    ]  # fmt: skip
    # Again with --resume: the calibration's result is put back in the record, not measured again (on the real
    # fingerprint of these weights), and each check part from its receipt (it ran on the record as it is).
    steps = ["calibrate", "similar_check", "similar_several_check", "followups_check", "heldout_check"]
    results = [out.with_name(f"gate.1.{step}.json") for step in [*steps, "long_answers_check"]]
    written = [result.read_bytes() for result in results]
    first_record = BlendSettingsRecord.from_json(path.read_text())
    assert main([*argv, "--resume"]) == 0
    assert [result.read_bytes() for result in results] == written
    summary = json.loads(out.read_text())
    assert summary["reused"] == [result.name for result in results] and summary["shipped_ratio"] == 1.0
    assert [s["name"] for s in summary["outcomes"][0]["steps"]][1:] == [
        "similar_check", "similar_several_check", "followups_check", "heldout_check", "long_answers_check",
    ]  # fmt: skip
    again = BlendSettingsRecord.from_json(path.read_text())
    assert {k: v for k, v in again.measured.items() if k != "ship_gate"} == {
        k: v for k, v in first_record.measured.items() if k != "ship_gate"
    }
