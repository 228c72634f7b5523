"""A Qwen3 model is calibrated like any other: the search runs on a tiny random Qwen3 (q/k norms, head_dim
24 while hidden / heads is 16) and at ratio 1 its blend is its full prefill."""

from __future__ import annotations

from pathlib import Path

import pytest
from enginetest_tiny import build_model

from app.calibration.search import Targets, calibrate
from engine.config import EngineSettings
from engine.engine import Engine
from kvcache.config import KVCacheSettings


@pytest.mark.slow  # the whole search on a generated case: ~10-30 s on two cores
def test_the_search_runs_on_a_qwen3_model(tmp_path_factory: pytest.TempPathFactory) -> None:
    model_dir: Path = build_model(tmp_path_factory.mktemp("qwen3"), "qwen3", seed=5, head_dim=24)
    engine = Engine(
        EngineSettings(model=str(model_dir), device="cpu", dtype="float32", max_new_tokens=8),
        models_dir=tmp_path_factory.mktemp("models"),
    )
    assert engine.config.model_type == "qwen3"
    record = calibrate(
        engine,
        engine.settings,
        KVCacheSettings(),
        "tiny-qwen3",
        ratios=(1.0,),
        targets=Targets(kl_x_reuse_max=1e-3),
        cases_per_kind=(1, 0, 0),
    )
    tried = record.measured["tried"]
    assert len(tried) == 4  # two scoring-layer choices at the one ratio, each without and with the stale-key bias
    for t in tried:  # r = 1: full prefill, whatever the scoring layers or the bias
        assert t["figures"]["kl"] == pytest.approx(0.0, abs=1e-6)
        assert t["figures"]["benefit"] == pytest.approx(1.0, abs=1e-3)
        assert t["figures"]["right"] == t["figures"]["full_right"]
    assert record.measured["targets_met"] and record.values["recompute_ratio"] == 1.0
    assert record.fingerprint == engine.fingerprint
