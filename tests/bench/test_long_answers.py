"""`python -m bench long-answers`: whole answers compared with full prefill's (divergence, agreement, finishes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.long_answers import compare, divergence, summarize


def test_divergence_is_the_first_differing_token() -> None:
    assert divergence([1, 2, 3], [1, 2, 3]) is None
    assert divergence([1, 2, 3], [1, 9, 3]) == 1
    assert divergence([1, 2, 3], [1, 2]) == 2  # one stopped early: they part where it stopped
    assert divergence([], [4]) == 0


def test_agreement_needs_the_same_finish_when_the_answers_differ() -> None:
    full = {"answer": "use os.path.join to join the parts", "token_ids": [1, 2, 3], "finish_reason": "stop"}
    close = {"answer": "use os.path.join to join the two parts", "token_ids": [1, 2, 4], "finish_reason": "stop"}
    looped = close | {"finish_reason": "repetition"}
    assert compare(full, full, 0.8) == {"identical": True, "divergence_token": None, "f1_vs_full": 1.0, "agrees": True}
    assert compare(full, close, 0.8) == {
        "identical": False,
        "divergence_token": 2,
        "f1_vs_full": 0.9091,
        "agrees": True,
    }
    assert compare(full, looped, 0.8)["agrees"] is False
    rows = [
        {"finish_reason": "stop", "right": True, "token_ids": [1, 2]} | compare(full, close, 0.8),
        {"finish_reason": "repetition", "right": False, "token_ids": [1, 2, 3, 4]} | compare(full, looped, 0.8),
    ]
    assert summarize(rows, 2) == {
        "questions": 2,
        "finish_reasons": {"repetition": 1, "stop": 1},
        "repetition_stops": 1,
        "right": 1,
        "answer_tokens_mean": 3.0,
        "identical": 0,
        "agrees": 1,
        "f1_vs_full_mean": 0.9091,
        "divergence_token_median": 2.0,
    }


def test_long_answers_runs_both_modes_over_the_docs_questions(tmp_path: Path, tiny_llama_dir: Path) -> None:
    out = tmp_path / "long.json"
    args = ["long-answers", "--model", str(tiny_llama_dir), "--questions", "2", "--max-tokens", "6", "--ratios", "1.0"]
    assert main([*args, "--threads", "2", "--dtype", "float32", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "long-answers" and list(result["modes"]) == ["full", "blend", "blend@1.0"]
    # A blend that recomputes everything answers as full prefill does, token for token.
    assert result["modes"]["blend@1.0"]["identical"] == 2
    full, blend = result["modes"]["full"], result["modes"]["blend"]
    assert full["questions"] == blend["questions"] == 2 and "agrees" not in full
    assert sum(blend["finish_reasons"].values()) == 2
    for f, b in zip(full["answers"], blend["answers"], strict=True):
        assert f["question"] == b["question"]
        assert b["identical"] == (f["token_ids"] == b["token_ids"])


def test_ship_writes_the_check_into_the_models_shipped_record_only_when_one_ships_for_its_weights(
    tmp_path: Path, tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.calibration import shipped
    from app.calibration.record import BlendSettingsRecord

    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)
    out = tmp_path / "long.json"
    args = ["long-answers", "--model", str(tiny_llama_dir), "--max-tokens", "4", "--threads", "2"]
    args += ["--dtype", "float32", "--out", str(out), "--ship"]
    assert main(args) == 1  # no record ships for the tiny model: nothing written
    first = json.loads(out.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["long.json"]
    # A record at ratio 1: its default blend recomputes everything, so it answers as full prefill does.
    record = BlendSettingsRecord(
        model="tiny-llama-smollm2-tok",
        fingerprint=first["fingerprint"],
        compute_dtype="float32",
        values={"recompute_ratio": 1.0},
        calibrated_at="2026-12-04T00:00:00+00:00",
        calibration_set="calset-3",
        measured={"kl_ratio": 0.1},
    )
    path = tmp_path / "tiny-llama-smollm2-tok.float32.json"
    path.write_text(record.to_json())
    assert main(args) == 0
    measured = BlendSettingsRecord.from_json(path.read_text()).measured
    entry = measured["long_answers_check"]
    assert measured["kl_ratio"] == 0.1 and entry["meets_target"] is True
    assert entry["checked_on"] == (
        "the docs questions of bench/docs_corpus.py (12, question + 'Explain how to use it, with a short code "
        "example.'), greedy to 4 tokens, full prefill and the default blend, through /ask"
    )
    assert entry["num_questions"] == entry["identical"] == entry["agrees"] == 12
    assert entry["finish_blend"] == entry["finish_full"] == {"length": 12}
    assert (entry["length_full"], entry["length_blend"], entry["repetition_blend"]) == (12, 12, 0)
    assert entry["blend"]["recompute_ratio"] == 1.0 and entry["f1_vs_full_mean"] == 1.0


def test_ship_is_refused_on_another_question_set() -> None:
    with pytest.raises(SystemExit, match="built-in docs questions"):
        main(["long-answers", "--questions", "2", "--ship"])
