from __future__ import annotations


def test_lookup_end_to_end_through_the_ask_service(run_bench) -> None:
    code, result, png = run_bench(
        "lookup", "--examples", "2", "--passages", "2", "--selectors", "query", "--ratio", "0.5", "--max-tokens", "3"
    )
    assert code == 0 and png.is_file()
    assert result["questions"] == 2 and result["top_k"] == 2 and result["ratio"] == 0.5
    assert list(result["right"]) == ["full", "reuse", "query@0.5"]
    assert all(0 <= right <= 2 for right in result["right"].values())
    assert result["kv_dtype"] == "int4" and result["compute_dtype"] == "float32"
    rows = result["per_question"]
    assert len(rows) == 2 and rows[0]["modes"]["query@0.5"]["selector"] == "query"
    assert rows[0]["modes"]["full"]["selector"] is None
