"""Calibration records: their file in the data dir (atomic, per fingerprint), the shipped ones, and the
settings in force: operator > calibrated > shipped > safe, each with where it came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.calibration.in_force import resolve, safe_values
from app.calibration.measure import CandidateFigures
from app.calibration.record import BlendSettingsRecord
from app.calibration.search import (
    KL_NEAR_TIE,
    Targets,
    candidates,
    choose,
    parse_ratios,
    preference_order,
    score_layers_at,
)
from app.calibration.shipped import SHIPPED_DIR, model_name, shipped_blend_settings, shipped_path
from app.calibration.store import CalibrationStore
from engine.config import BLEND_FIELDS, EngineSettings

FP = "ab12" * 16


def _record(fingerprint: str = FP, **values) -> BlendSettingsRecord:
    return BlendSettingsRecord(
        model="m",
        fingerprint=fingerprint,
        compute_dtype="bfloat16",
        values=values or {"recompute_ratio": 0.2, "score_layers": [8, 16], "history_ratio": 1.0},
        calibrated_at="2026-12-01T22:00:00+00:00",
        calibration_set="calset-1: test",
        measured={"chosen": {"kl_x_reuse": 0.2}},
    )


def test_store_round_trip_and_atomic_write(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    assert store.load(FP) is None
    path = store.save(_record())
    assert path == tmp_path / "calibration" / f"{FP}.json"
    assert store.load(FP) == _record()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind


def test_unreadable_or_foreign_record_is_not_calibrated(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    store.path(FP).parent.mkdir(parents=True)
    store.path(FP).write_text("{half a record")
    assert store.load(FP) is None
    other = "cd34" * 16
    store.path(FP).write_text(_record(fingerprint=other).to_json())
    assert store.load(FP) is None
    with pytest.raises(ValueError, match="hex"):
        store.path("../../etc/passwd")


def test_record_names_only_blend_settings() -> None:
    with pytest.raises(ValueError, match="unknown settings"):
        _record(max_new_tokens=3)
    assert json.loads(_record().to_json())["version"] == 1


def test_resolution_order_and_labels() -> None:
    defaults = EngineSettings()
    safe = resolve(defaults, 24)
    assert safe.origin == "safe" and safe.values["recompute_ratio"] == 0.3 and safe.values["history_ratio"] == 1.0
    assert safe.values["score_layers"] == [10] == safe_values(24)["score_layers"]
    shipped = resolve(defaults, 24, shipped=_record(recompute_ratio=0.25))
    assert shipped.origin == "shipped" and shipped.values["recompute_ratio"] == 0.25
    assert shipped.label.startswith("shipped for m (calibrated on m (bfloat16, fingerprint ab12ab12ab12) 2026-12-01")
    calibrated = resolve(defaults, 24, calibrated=_record(), shipped=_record(recompute_ratio=0.25))
    assert calibrated.origin == "calibrated" and calibrated.values["score_layers"] == [8, 16]
    assert set(calibrated.values) == set(BLEND_FIELDS)
    # An operator's explicit setting wins over every record, and is named.
    operator = resolve(EngineSettings(recompute_ratio=0.5), 24, calibrated=_record())
    assert operator.values["recompute_ratio"] == 0.5 and operator.values["score_layers"] == [8, 16]
    assert operator.operator_fields == ("recompute_ratio",)
    assert operator.described == operator.label + "; operator set recompute_ratio"
    # The values described are those of the settings given (the engine's, in a server), not a copy of its own.
    described = operator.describe(EngineSettings(recompute_ratio=0.75))
    assert described["label"] == operator.described and described["values"]["recompute_ratio"] == 0.75
    assert set(described["values"]) == set(BLEND_FIELDS) and described["measured"] == {"kl_x_reuse": 0.2}


def test_shipped_records_are_valid_and_named_by_model() -> None:
    assert model_name("builtin") == "smollm2-135m"
    assert model_name("/models/qwen2.5-coder-0.5b") == "qwen2.5-coder-0.5b"
    # a catalogue model's converted directory (what the benches load) finds its model's shipped record
    assert model_name("/data/models/smollm2-135m-instruct") == "smollm2-135m"
    assert model_name("/elsewhere/my-finetune") == "my-finetune"
    assert shipped_blend_settings("no-such-model") is None and shipped_blend_settings("../secrets") is None
    files = sorted(SHIPPED_DIR.glob("*.json"))
    # both catalogue models, in both compute dtypes `auto` picks (bfloat16 with bf16 units, float32 without)
    assert {p.name for p in files} >= {
        f"{model}.{dtype}.json" for model in ("qwen2.5-coder-0.5b", "smollm2-135m") for dtype in ("bfloat16", "float32")
    }
    for path in files:
        name, dtype = path.name.removesuffix(".json").rsplit(".", 1)
        record = shipped_blend_settings(name, dtype)
        assert record is not None and (record.model, record.compute_dtype) == (name, dtype)
        assert shipped_path(name, dtype) == path
        EngineSettings(**record.values).blend_config()  # every shipped record is a valid configuration


def test_the_shipped_record_of_the_engines_dtype_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import app.calibration.shipped as shipped

    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)
    bf16 = _record(fingerprint="b" * 64, recompute_ratio=0.25)
    fp32 = BlendSettingsRecord(**{**bf16.__dict__, "fingerprint": "f" * 64, "compute_dtype": "float32"})
    (tmp_path / "m.bfloat16.json").write_text(bf16.to_json())
    assert shipped.shipped_blend_settings("m", "float32") == bf16  # none in float32: the model's other record
    (tmp_path / "m.float32.json").write_text(fp32.to_json())
    assert shipped.shipped_blend_settings("m", "float32") == fp32
    assert shipped.shipped_blend_settings("m", "bfloat16") == bf16
    assert shipped.shipped_blend_settings("m") == bf16 and shipped.shipped_records("m") == [bf16, fp32]
    (tmp_path / "m.bfloat16.json").write_text("{broken")
    assert shipped.shipped_records("m") == [fp32]  # a broken file is logged and skipped, not fatal


def test_candidates_scale_score_layers_with_depth() -> None:
    assert score_layers_at((0.4,), 24) == [10] and score_layers_at((0.4,), 30) == [12]
    assert score_layers_at((0.25, 0.5, 0.75), 24) == [6, 12, 18]
    assert score_layers_at((0.25, 0.5, 0.75), 2) == [1]
    assert score_layers_at((0.17, 0.33, 0.5, 0.67, 0.83), 24) == [4, 8, 12, 16, 20]
    got = candidates(30, (0.1, 0.2))
    assert [(c["recompute_ratio"], c["score_layers"], c["stale_key_bias"]) for c in got] == [
        (0.1, [12], 0.0),
        (0.1, [12], 0.5),
        (0.1, [8, 15, 22], 0.0),
        (0.1, [8, 15, 22], 0.5),
        (0.1, [5, 10, 15, 20, 25], 0.0),
        (0.1, [5, 10, 15, 20, 25], 0.5),
        (0.2, [12], 0.0),
        (0.2, [12], 0.5),
        (0.2, [8, 15, 22], 0.0),
        (0.2, [8, 15, 22], 0.5),
        (0.2, [5, 10, 15, 20, 25], 0.0),
        (0.2, [5, 10, 15, 20, 25], 0.5),
    ]
    assert all(c["selector"] == "query" and c["history_ratio"] == 1.0 for c in got)
    # A shallow model's depth choices that fall on the same layers are one candidate, not two.
    assert [c["score_layers"] for c in candidates(2, (0.3,))] == [[1], [1]]
    assert [c["score_layers"] for c in candidates(4, (0.3,))] == [[2], [2], [1, 2, 3], [1, 2, 3]]
    assert parse_ratios("0.3, 0.1,0.1") == (0.1, 0.3)
    with pytest.raises(ValueError):
        parse_ratios("0,0.2")


def test_targets_name_every_miss() -> None:
    fig = CandidateFigures(
        kl=0.1,
        kl_reuse=0.25,
        kl_x_reuse=0.4,
        benefit=0.9,
        right={"lookup": 6, "two_hop": 3, "followup": 4},
        full_right={"lookup": 8, "two_hop": 3, "followup": 5},
        prompt_s=1.0,
        full_prompt_s=4.0,
    )
    assert Targets().misses(fig) == ["KL 0.40x reuse > 0.35", "benefit 0.90 < 0.95", "lookup 6 vs full 8"]
    assert Targets(kl_x_reuse_max=0.5, benefit_min=0.9, right_within=2).misses(fig) == []
    assert fig.speedup == 4.0


def _figures(kl_x_reuse: float, right: dict[str, int]) -> CandidateFigures:
    return CandidateFigures(
        kl=kl_x_reuse,
        kl_reuse=1.0,
        kl_x_reuse=kl_x_reuse,
        benefit=1.1,
        right=right,
        full_right={"lookup": 8, "two_hop": 2, "followup": 6},
        prompt_s=1.0,
        full_prompt_s=4.0,
    )


def test_when_none_meets_the_targets_the_answers_come_before_kl() -> None:
    # Qwen's calibration at 0.3: scoring at layer 10 lost look-ups 6 vs 8, at layers 6/12/18 follow-ups 3 vs 6
    # with the better KL. Answers short beyond the tolerance: 1 against 2, so layer 10 is kept.
    layer10 = ({"score_layers": [10]}, _figures(0.80, {"lookup": 6, "two_hop": 2, "followup": 6}))
    layers3 = ({"score_layers": [6, 12, 18]}, _figures(0.60, {"lookup": 7, "two_hop": 2, "followup": 3}))
    assert Targets().shortfall(layer10[1]) == 1 and Targets().shortfall(layers3[1]) == 2
    assert choose([], [layers3, layer10], Targets()) == layer10
    # Equal shortfalls: the better KL; any candidate meeting every target wins over all of them.
    other = ({"score_layers": [12]}, _figures(0.70, {"lookup": 6, "two_hop": 2, "followup": 6}))
    assert choose([], [layer10, other], Targets()) == other
    passing = ({"score_layers": [4]}, _figures(0.30, {"lookup": 8, "two_hop": 2, "followup": 6}))
    assert choose([passing], [layer10, passing], Targets()) == passing


def test_a_near_tie_in_kl_goes_to_the_candidate_scoring_at_more_layers() -> None:
    # The calibration-set figures of the 0.5B's bfloat16 calibration at 0.15 (docs/results/ship): three scoring
    # layers 0.2483x reuse's, five 0.2523x (within KL_NEAR_TIE), five without the bias 0.2615x (beyond it).
    three = ({"score_layers": [6, 12, 18], "stale_key_bias": 0.5}, _figures(0.2483, {"lookup": 8}))
    five = ({"score_layers": [4, 8, 12, 16, 20], "stale_key_bias": 0.5}, _figures(0.2523, {"lookup": 7}))
    five_far = ({"score_layers": [4, 8, 12, 16, 20], "stale_key_bias": 0.0}, _figures(0.2615, {"lookup": 8}))
    one = ({"score_layers": [10], "stale_key_bias": 0.5}, _figures(0.2681, {"lookup": 8}))
    order = preference_order([one, three, five_far, five], lambda vf: vf[1].kl_x_reuse, lambda vf: vf[0])
    assert order == [five, three, five_far, one]
    assert choose([one, three, five_far, five], [], Targets()) == five
    # Beyond the near-tie the best KL wins whatever its layers; an exact tie keeps the order given.
    far_three = ({"score_layers": [6, 12, 18]}, _figures(0.20, {"lookup": 8}))
    assert choose([five, far_three], [], Targets()) == far_three
    twin = ({"score_layers": [7, 14, 21]}, _figures(0.2483, {"lookup": 8}))
    assert preference_order([twin, three], lambda vf: vf[1].kl_x_reuse, lambda vf: vf[0]) == [twin, three]
    assert preference_order([], lambda vf: 0.0, lambda vf: {}) == []
    assert KL_NEAR_TIE == 0.01
