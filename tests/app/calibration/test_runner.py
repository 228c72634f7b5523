"""The calibration end to end on the tiny model: the search, the background runner on the engine worker's
idle time, the record in the data dir, and the settings it puts in force."""

from __future__ import annotations

import threading

import pytest

from app.calibration.in_force import resolve
from app.calibration.runner import CalibrationRunner, needs_calibration
from app.calibration.search import Targets, calibrate
from app.calibration.store import CalibrationStore
from engine.scheduler import Scheduler


def test_run_when_idle_runs_on_the_worker(fast_engine) -> None:
    scheduler = Scheduler(fast_engine)
    assert scheduler.run_when_idle(lambda: threading.current_thread().name) == threading.current_thread().name
    scheduler.start()
    try:
        assert scheduler.run_when_idle(lambda: threading.current_thread().name) == "blendrag-engine"
        with pytest.raises(ZeroDivisionError):
            scheduler.run_when_idle(lambda: 1 / 0)
        assert scheduler.run_when_idle(lambda: 7) == 7  # the worker goes on after a failure
    finally:
        scheduler.stop()


@pytest.mark.slow
def test_search_takes_the_cheapest_ratio_meeting_the_targets(fast_engine, fast_settings) -> None:
    # At r = 1 the blend is full prefill (KL ~0, benefit 1, every answer full's); at r = 0.5 a random model's
    # first token is off by far more than a 1e-3 share of reuse's KL, so 0.5 misses and 1.0 is chosen.
    record = calibrate(
        fast_engine,
        fast_engine.settings,
        fast_settings.kvcache,
        "tiny",
        ratios=(0.5, 1.0),
        targets=Targets(kl_x_reuse_max=1e-3),
        cases_per_kind=(1, 0, 1),
    )
    tried = record.measured["tried"]
    # Two scoring-layer choices per ratio, each without and with the stale-key bias.
    assert [(t["values"]["recompute_ratio"], bool(t["misses"])) for t in tried] == [(0.5, True)] * 4 + [
        (1.0, False)
    ] * 4
    assert [t["values"]["stale_key_bias"] for t in tried] == [0.0, 0.5] * 4
    assert all(t["misses"][0].startswith("KL ") for t in tried[:4])
    for t in tried[4:]:  # r = 1 leaves no stored key to bias: full prefill with or without it
        assert t["figures"]["kl"] == pytest.approx(0.0, abs=1e-6)
        assert t["figures"]["benefit"] == pytest.approx(1.0, abs=1e-3)
        assert t["figures"]["right"] == t["figures"]["full_right"]
    assert record.measured["targets_met"] and record.values["recompute_ratio"] == 1.0
    assert record.values["score_layers"] in ([t["values"]["score_layers"] for t in tried[4:]])
    assert record.fingerprint == fast_engine.fingerprint and record.values["history_ratio"] == 1.0
    assert record.calibration_set == "calset-3: 1 lookup, 0 two_hop, 1 followup, 6 passages each"


def test_runner_calibrates_once_and_puts_the_record_in_force(
    fast_engine, make_fast_settings, make_fast_services
) -> None:
    settings = make_fast_settings(calibration={"auto": True})
    services = make_fast_services(settings)
    original = fast_engine.settings
    services.adopt_blend(resolve(settings.engine, fast_engine.config.num_layers))
    assert services.blend is not None and services.blend.origin == "safe"
    assert needs_calibration(fast_engine, settings) is not None
    scheduler = Scheduler(fast_engine)
    scheduler.start()
    try:
        runner = CalibrationRunner(
            settings, fast_engine, scheduler, adopt=services.adopt_blend, ratios=(1.0,), cases_per_kind=(1, 0, 0)
        )
        runner.start()
        runner.join(600)
        status = runner.status()
        assert status["state"] == "done", status
        assert status["candidates_done"] == 4  # two scoring-layer choices at the one ratio, each ± the bias
        record = CalibrationStore(settings.data_dir).load(fast_engine.fingerprint)
        assert record is not None and status["record_path"].endswith(f"{fast_engine.fingerprint}.json")
        assert services.blend.origin == "calibrated" and fast_engine.settings.blend.recompute_ratio == 1.0
        assert fast_engine.blend_origin == services.blend.label and "calibrated on" in fast_engine.blend_origin
        # Once per fingerprint: the next start finds the record and does not calibrate again.
        assert needs_calibration(fast_engine, settings) is None
        again = CalibrationRunner(settings, fast_engine, scheduler, adopt=services.adopt_blend)
        again.start()
        assert again.status()["state"] == "done" and again._thread is None
    finally:
        scheduler.stop()
        fast_engine.use_blend(original.blend, "engine settings")


@pytest.mark.slow
def test_a_study_measures_every_candidate_given_and_keeps_the_best(fast_engine, fast_settings) -> None:
    # A study (`bench calibrate --candidates`) does not stop at the first ratio that passes: both candidates
    # are measured in the order given, and the one meeting the targets (r = 1: full prefill) is chosen.
    study = [
        {"selector": "query", "recompute_ratio": 1.0, "score_layers": [1]},
        {"selector": "random", "recompute_ratio": 0.5},
    ]
    record = calibrate(
        fast_engine,
        fast_engine.settings,
        fast_settings.kvcache,
        "tiny",
        targets=Targets(kl_x_reuse_max=1e-3),
        cases_per_kind=(1, 0, 1),
        tried_values=study,
    )
    tried = record.measured["tried"]
    assert [t["values"] for t in tried] == study
    assert [bool(t["misses"]) for t in tried] == [False, True]
    assert record.values == study[0] and record.measured["targets_met"]


def test_fixed_settings_ride_in_every_candidate_and_ship_in_the_record(fast_engine, fast_settings) -> None:
    from app.calibration.search import fixed_values

    fixed = fixed_values(["match_labels=true", "match_span=window"])
    assert fixed == {"match_labels": True, "match_span": "window"}
    record = calibrate(
        fast_engine,
        fast_engine.settings,
        fast_settings.kvcache,
        "tiny",
        ratios=(1.0,),
        cases_per_kind=(1, 0, 0),
        fixed=fixed,
    )
    assert all(t["values"]["match_labels"] is True for t in record.measured["tried"])
    assert record.values["match_labels"] is True and record.values["match_span"] == "window"
    assert record.values["recompute_ratio"] == 1.0


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("recompute_ratio=0.1", "what the calibration searches"),
        ("no_such_setting=1", "expected BLEND_SETTING=VALUE"),
        ("match_labels", "expected BLEND_SETTING=VALUE"),
        ("match_labels=maybe", "match_labels"),
    ],
)
def test_a_fixed_setting_that_is_none_the_search_chooses_or_is_bad_is_refused(item: str, message: str) -> None:
    from app.calibration.search import fixed_values

    with pytest.raises(ValueError, match=message):
        fixed_values([item])
