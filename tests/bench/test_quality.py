from __future__ import annotations

import math

import pytest

from bench.quality import summarize, window_figures


def test_quality_end_to_end(run_bench, dataset_path) -> None:
    code, result, png = run_bench(
        "quality",
        "--dataset",
        str(dataset_path),
        "--examples",
        "1",
        "--passages",
        "3",
        "--ratios",
        "0.15,1.0",
        "--max-tokens",
        "3",
    )
    assert code == 0 and png.is_file() and png.stat().st_size > 0
    assert result["model"] == "tiny-llama-smollm2-tok"
    assert result["examples"] == 1 and result["passages"] == 3
    assert list(result["modes"]) == ["full", "prefix", "reuse", "blend@0.15", "blend@1.0"]
    assert set(result["modes"]["full"]) >= {"f1", "nll"}
    for name in ("prefix", "reuse", "blend@0.15", "blend@1.0"):
        assert set(result["modes"][name]) >= {"f1", "fidelity_f1", "kl", "nll", "benefit_retained"}
    assert set(result["no_context"]) == {"f1", "nll"}
    assert len(result["run"]["load_avg_start"]) == 3
    # blend at r = 1 recomputes everything: it is full prefill
    blend1 = result["modes"]["blend@1.0"]
    assert abs(blend1["kl"]) < 1e-6
    assert blend1["fidelity_f1"] == 1.0
    assert blend1["nll"] == pytest.approx(result["modes"]["full"]["nll"], abs=1e-4)
    # per-example rows carry what the means are made of
    rows = result["per_example"]
    assert result["modes"]["reuse"]["kl"] == rows[0]["modes"]["reuse"]["kl"] > 0
    assert all(r["modes"]["reuse"]["num_recomputed_tokens"] == 0 for r in rows)


def _row(nc: float, full: float, reuse: float, f1: float = 0.0, reuse_finish: str = "stop") -> dict:
    return {
        "no_context": {"f1": 0.0, "nll": nc},
        "modes": {
            "full": {
                "f1": f1,
                "nll": full,
                "prompt_s": 1.0,
                "num_recomputed_tokens": 10,
                "finish_reason": "stop",
                "num_answer_tokens": 3,
            },
            "reuse": {
                "f1": 0.0,
                "nll": reuse,
                "prompt_s": 0.1,
                "num_recomputed_tokens": 0,
                "kl": 0.5,
                "fidelity_f1": 0.5,
                "same_first_token": False,
                "finish_reason": reuse_finish,
                "num_answer_tokens": 32 if reuse_finish == "length" else 4,
            },
        },
    }


def test_summary_benefit_is_means_first() -> None:
    summary = summarize([_row(4.0, 1.0, 2.0, f1=1.0, reuse_finish="length"), _row(2.0, 1.9, 1.95)], ["full", "reuse"])
    reuse = summary["modes"]["reuse"]
    assert (reuse["length_share"], reuse["answer_tokens"]) == (0.5, 18.0)  # answers that hit max_tokens
    assert summary["modes"]["full"]["length_share"] == 0.0
    assert reuse["nll"] == pytest.approx(1.975)
    assert reuse["benefit_retained"] == pytest.approx((3.0 - 1.975) / (3.0 - 1.45))
    assert reuse["kl"] == 0.5 and reuse["fidelity_f1"] == 0.5 and reuse["first_token_agreement"] == 0.0
    assert summary["modes"]["full"]["f1"] == 0.5
    assert summary["no_context"] == {"f1": 0.0, "nll": 3.0}
    assert "kl" not in summary["modes"]["full"]


def test_summary_benefit_undefined_without_context_gain() -> None:
    summary = summarize([_row(1.0, 1.0, 1.5)], ["full", "reuse"])
    assert math.isnan(summary["modes"]["reuse"]["benefit_retained"])


def test_summary_intervals_are_paired_and_kl_is_over_reuse() -> None:
    rows = [_row(4.0, 1.0, 2.0), _row(4.0, 1.0, 2.0), _row(4.0, 1.0, 2.0)]
    for r in rows:  # a blend mode with a fifth of reuse's KL and all of full's NLL
        r["modes"]["blend"] = r["modes"]["reuse"] | {"kl": 0.1, "nll": 1.0}
    modes = summarize(rows, ["full", "reuse", "blend"])["modes"]
    # every example alike: every resample gives the point value
    assert modes["reuse"]["benefit_retained_ci95"] == [0.6667, 0.6667]
    assert modes["blend"]["benefit_retained"] == 1.0 and modes["blend"]["benefit_retained_ci95"] == [1.0, 1.0]
    assert modes["blend"]["kl_x_reuse"] == pytest.approx(0.2)
    assert modes["blend"]["kl_x_reuse_ci95"] == [0.2, 0.2]
    assert "kl_x_reuse" not in modes["reuse"] and "benefit_retained_ci95" not in modes["full"]


def test_summary_f1_loss_interval_is_paired_on_full_prefills_answers() -> None:
    rows = [_row(4.0, 1.0, 2.0, f1=1.0), _row(4.0, 1.0, 2.0, f1=1.0)]  # reuse answers 0 where full answers 1
    reuse = summarize(rows, ["full", "reuse"])["modes"]["reuse"]
    assert reuse["f1_loss_ci95"] == [1.0, 1.0]
    rows += [_row(4.0, 1.0, 2.0, f1=0.0), _row(4.0, 1.0, 2.0, f1=0.0)]  # both answer 0: the loss halves
    lo, hi = summarize(rows, ["full", "reuse"])["modes"]["reuse"]["f1_loss_ci95"]
    assert 0.0 <= lo < 0.5 < hi <= 1.0
    assert "f1_loss_ci95" not in summarize(rows, ["full", "reuse"])["modes"]["full"]


def test_summary_benefit_interval_holds_the_point_value() -> None:
    rows = [_row(4.0, 1.0, 1.0 + 0.1 * i) for i in range(20)]  # reuse loses more on later examples
    reuse = summarize(rows, ["full", "reuse"])["modes"]["reuse"]
    lo, hi = reuse["benefit_retained_ci95"]
    assert lo < reuse["benefit_retained"] < hi
    assert reuse["benefit_retained"] == pytest.approx((4.0 - 1.95) / 3.0)


def test_window_figures_are_each_run_of_examples_means_first_and_leave_a_short_tail_out() -> None:
    rows = [_row(4.0, 1.0, 2.0) for _ in range(5)]  # reuse KL 0.5 throughout
    for i, r in enumerate(rows):  # the blend: KL 0.1 and full's NLL on examples 1-2, KL 0.4 and NLL 2.5 after
        r["modes"]["blend"] = r["modes"]["reuse"] | ({"kl": 0.1, "nll": 1.0} if i < 2 else {"kl": 0.4, "nll": 2.5})
    assert window_figures(rows, "blend", 2) == [
        {"examples": [1, 2], "kl_x_reuse": 0.2, "benefit_retained": 1.0},
        {"examples": [3, 4], "kl_x_reuse": 0.8, "benefit_retained": 0.5},
    ]  # example 5 alone is no window of 2
    assert window_figures(rows, "blend", 6) == []


def _tiny_record(fingerprint: str, ratio: float):
    from app.calibration.record import BlendSettingsRecord

    return BlendSettingsRecord(
        model="tiny-llama-smollm2-tok",
        fingerprint=fingerprint,
        compute_dtype="float32",
        values={"recompute_ratio": ratio},
        calibrated_at="2026-12-04T00:00:00+00:00",
        calibration_set="calset-3",
        measured={"kl_ratio": 0.1},
    )


def test_ship_checks_the_default_blend_at_the_records_ratio_and_writes_only_a_pass(
    run_bench, dataset20_path, tmp_path, monkeypatch
) -> None:
    from app.calibration import shipped
    from app.calibration.record import BlendSettingsRecord

    shipped_dir = tmp_path / "shipped"
    shipped_dir.mkdir()
    monkeypatch.setattr(shipped, "SHIPPED_DIR", shipped_dir)
    args = ("--dataset", str(dataset20_path), "--examples", "20", "--passages", "2", "--max-tokens", "2")
    args += ("--baselines", "reuse", "--ship")
    code, first, _ = run_bench("quality", *args)
    assert code == 1 and list(shipped_dir.iterdir()) == []  # no record ships for the tiny model: nothing written
    # Without a record the engine answers on the safe defaults: the one blend run is theirs.
    assert list(first["modes"]) == ["full", "reuse", f"blend@{first['blend']['recompute_ratio']}"]

    # A record at ratio 1: its default blend recomputes everything, so it is full prefill.
    path = shipped_dir / "tiny-llama-smollm2-tok.float32.json"
    path.write_text(_tiny_record(first["fingerprint"], 1.0).to_json())
    code, result, _ = run_bench("quality", *args)
    assert code == 0 and list(result["modes"]) == ["full", "reuse", "blend@1.0"]
    record = BlendSettingsRecord.from_json(path.read_text())
    entry, blend = record.measured["heldout_check"], result["modes"]["blend@1.0"]
    assert record.measured["kl_ratio"] == 0.1 and entry["meets_target"] is True
    assert (entry["num_examples"], entry["num_passages"], entry["dataset"]) == (20, 2, "made_up_20.json")
    assert (entry["kl_x_reuse"], entry["benefit_retained"]) == (blend["kl_x_reuse"], blend["benefit_retained"])
    assert entry["kl_x_reuse"] < 1e-4 and entry["benefit_retained"] == pytest.approx(1.0, abs=1e-3)
    assert entry["blend"]["recompute_ratio"] == 1.0 and entry["kv_storage_dtype"] == "int4"
    assert (entry["f1_full"], entry["f1_blend"]) == (result["modes"]["full"]["f1"], blend["f1"])
    assert entry["f1_loss_ci95"] == blend["f1_loss_ci95"] and len(entry["f1_loss_ci95"]) == 2
    # 20 examples are one window, whose figures are the run's (rounded as the record keeps them).
    assert entry["by_window"] == [
        {
            "examples": [1, 20],
            "kl_x_reuse": round(blend["kl_x_reuse"], 4),
            "benefit_retained": round(blend["benefit_retained"], 4),
        }
    ]

    # A record whose blend recomputes only the tokens the question names (ratio 0) misses, and nothing is written.
    path.write_text(_tiny_record(first["fingerprint"], 0.0).to_json())
    written = path.read_text()
    code, result, _ = run_bench("quality", *args)
    assert code == 1 and result["modes"]["blend@0.0"]["kl_x_reuse"] > 0.3
    assert path.read_text() == written


def test_ship_refuses_options_the_server_does_not_answer_with() -> None:
    from bench.__main__ import main

    base = ["quality", "--model", "m", "--ship"]
    with pytest.raises(SystemExit, match="drop --ratios"):
        main([*base, "--ratios", "0.2"])
    with pytest.raises(SystemExit, match="as the server stores it"):
        main([*base, "--kv-dtype", "fp16"])
    with pytest.raises(SystemExit, match="drop --stale-key-bias"):
        main([*base, "--stale-key-bias", "0.5"])
    with pytest.raises(SystemExit, match="server's decoding"):
        main([*base, "--no-repetition-control"])
