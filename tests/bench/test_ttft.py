from __future__ import annotations

from bench.cpu_share import available_cores
from bench.harness import server_kv_dtype


def test_ttft_end_to_end(run_bench, dataset_path) -> None:
    code, result, png = run_bench(
        "ttft", "--dataset", str(dataset_path), "--examples", "1", "--passages", "2", "--ratios", "0.5", "--no-rss"
    )
    assert code == 0 and png.is_file()
    assert list(result["modes"]) == ["full", "prefix", "reuse", "blend@0.5"]
    assert result["kv_dtype"] == server_kv_dtype() == "int4"  # the server's storage dtype by default
    assert result["compute_dtype"] == "float32" and result["examples"] == 1
    row = result["per_example"][0]
    # the budget, with at most match_extra's share (0.1) on top for the tokens the question names
    budget, extra = (int(r * row["num_context_tokens"] + 0.5) for r in (0.5, 0.1))
    assert budget <= row["num_recomputed_tokens"]["blend@0.5"] <= budget + extra
    assert row["num_recomputed_tokens"]["full"] == row["num_context_tokens"]
    assert set(result["run"]) == {"elapsed_s", "load_avg_start", "load_avg_end", "unix_time", "cpu_share_start"}
    assert result["run"]["cpu_share_start"]["num_cores"] == available_cores()
