from __future__ import annotations


def test_throughput_in_process_end_to_end(run_bench, dataset_path, tmp_path) -> None:
    code, result, png = run_bench(
        "throughput",
        "--dataset",
        str(dataset_path),
        "--examples",
        "2",
        "--passages",
        "2",
        "--clients",
        "2",
        "--max-tokens",
        "2",
        "--decode-clients",
        "1,3",
        "--decode-tokens",
        "6",
        "--tmp-dir",
        str(tmp_path),
    )
    assert code == 0 and png.is_file()
    assert result["target"] == "in-process" and result["clients"] == 2
    assert result["corpus_passages"] == 4
    assert list(result["modes"]) == ["blend", "full"]
    for m in result["modes"].values():
        assert m["requests"] == 2 and m["errors"] == 0, m["first_errors"]
        assert m["requests_per_min"] > 0
        assert 0 < m["ttft_p50_s"] <= m["ttft_p90_s"]
        assert 1 <= m["completion_tokens_mean"] <= 2
        assert m["prompt_tokens_mean"] > 0
    assert [p["mode"] for p in result["phases"]] == ["blend", "full"]
    assert all(r["mode"] == p["mode"] for p in result["phases"] for r in p["requests"])

    decode = result["decode"]
    assert list(decode["per_clients"]) == ["1", "3"] and decode["window_tokens_per_request"] == 6
    one, three = decode["per_clients"]["1"], decode["per_clients"]["3"]
    assert one["clients"] == 1 and three["clients"] == 3
    assert one["window_tokens"] == 6 and one["tokens_before_window"] == [1]  # the first token opens it
    # The window opens at the third request's first token, however many the first two decoded before it,
    # and closes when the first of them has its 6 tokens in it.
    assert len(three["tokens_before_window"]) == 3 and three["tokens_before_window"][-1] == 1
    assert min(three["tokens_before_window"]) >= 1
    assert 6 <= three["window_tokens"] <= 3 * 6
    assert one["decode_tokens_per_s"] == one["window_tokens"] / one["window_s"]
    assert decode["speedup"] == three["decode_tokens_per_s"] / one["decode_tokens_per_s"]


def test_summary_counts_503s_apart_from_200_then_busy() -> None:
    from bench.throughput import AskTiming, summarize

    timings = [
        AskTiming("blend", True, 0.5, 1.0),
        AskTiming("blend", False, None, 0.1, error="HTTP 503: busy"),
        AskTiming("blend", False, None, 0.1, error="HTTP 503: busy"),
        AskTiming("blend", False, None, 0.2, error="busy: the engine is busy"),
    ]
    summary = summarize(timings, wall_s=2.0)
    assert (summary["errors"], summary["busy_503"], summary["busy_after_200"]) == (3, 2, 1)
    assert summary["share_503"] == 0.5


def test_rss_of_a_process_and_of_one_that_is_gone() -> None:
    import os

    from bench.throughput import process_rss_bytes

    assert (process_rss_bytes(os.getpid()) or 0) > 10 * 2**20
    assert process_rss_bytes(2**22 + 12345) is None
