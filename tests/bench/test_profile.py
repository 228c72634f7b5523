from __future__ import annotations

from app.calibration.in_force import safe_values


def test_profile_end_to_end(run_bench, dataset_path) -> None:
    code, result, _ = run_bench(
        "profile", "--dataset", str(dataset_path), "--examples", "1", "--passages", "2", "--repeats", "1", "--top", "5"
    )
    assert code == 0
    # The blend in force for a model with no calibration record (the tiny test model): the safe settings.
    safe_ratio = safe_values(num_layers=2)["recompute_ratio"]
    assert list(result["modes"]) == ["full", "reuse", f"query@{safe_ratio:g}"]
    for mode in result["modes"].values():
        assert len(mode["ops"]) == 5 and mode["ttft_s_median"] > 0
        shares = [op["share"] for op in mode["ops"]]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1.0001
        assert all(op["calls"] >= 1 for op in mode["ops"])
    assert result["compute_dtype"] == "float32" and result["kv_dtype"] == "int4"
