from __future__ import annotations

import math

import pytest

from bench.quality import summarize


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


def test_summary_benefit_interval_holds_the_point_value() -> None:
    rows = [_row(4.0, 1.0, 1.0 + 0.1 * i) for i in range(20)]  # reuse loses more on later examples
    reuse = summarize(rows, ["full", "reuse"])["modes"]["reuse"]
    lo, hi = reuse["benefit_retained_ci95"]
    assert lo < reuse["benefit_retained"] < hi
    assert reuse["benefit_retained"] == pytest.approx((4.0 - 1.95) / 3.0)
