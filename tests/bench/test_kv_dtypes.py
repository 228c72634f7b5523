from __future__ import annotations

import pytest


def test_kv_end_to_end(run_bench, dataset_path, tmp_path) -> None:
    code, result, png = run_bench(
        "kv",
        "--dataset",
        str(dataset_path),
        "--examples",
        "1",
        "--passages",
        "3",
        "--max-tokens",
        "2",
        "--repeats",
        "1",
        "--tmp-dir",
        str(tmp_path),
        "--zipf-chunks",
        "40",
        "--zipf-questions",
        "60",
    )
    assert code == 0 and png.is_file()
    assert list(result["dtypes"]) == ["fp16", "bf16", "int8", "int4"]
    # tiny Llama: 2 layers × 2 KV heads × head_dim 16; int8 adds a float32 scale per (head, token) row
    assert result["dtypes"]["fp16"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 2
    assert result["dtypes"]["bf16"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 2
    assert result["dtypes"]["int8"]["bytes_per_token"] == 2 * 2 * 2 * (16 + 4)
    assert result["dtypes"]["int8"]["share_of_fp16"] == 20 / 32
    # int4: half a byte per value; V: one fp16 scale + zero per token and layer (its 32 channels are one
    # group); K: one fp16 scale + zero per (layer, head, channel) and group of ~128 tokens of each chunk
    chunk_tokens = result["per_example"][0]["chunk_tokens"]
    k_params = sum(2 * 2 * 16 * 4 * max(1, round(t / 128)) for t in chunk_tokens)
    expected_int4 = 2 * 2 * 2 * 16 / 2 + 2 * 4 + k_params / sum(chunk_tokens)
    assert result["dtypes"]["int4"]["bytes_per_token"] == pytest.approx(expected_int4, rel=1e-12)
    assert result["kv_elements_per_token"] == 2 * 2 * 2 * 16
    for dtype in ("fp16", "bf16", "int8", "int4"):
        d = result["dtypes"][dtype]
        assert d["file_bytes_per_token"] > d["bytes_per_token"]
        assert -1.0 < d["zlib_saving"] < 1.0
        assert (d["lzma_saving"] is None) == (dtype in ("fp16", "bf16"))
        assert set(d["modes"]) == {"reuse", "blend@0.15"}
        for m in d["modes"].values():
            assert set(m) >= {"kl", "kl_max", "first_token_agreement", "answer_agreement", "selection_overlap"}
            assert 0.0 <= m["answer_agreement"] <= 1.0
    # rounding to fp16 perturbs the stale KV far less than int8 does, and int8 less than int4
    kl = {d: result["dtypes"][d]["modes"]["reuse"]["kl"] for d in result["dtypes"]}
    assert kl["fp16"] < kl["int8"] < kl["int4"]
    ttft = result["ttft"]
    variants = ("memory", "disk", "disk_no_prefetch", "disk_cold", "disk_cold_no_prefetch", "disk_one_miss")
    for variant in variants:
        assert ttft[variant]["p50_s"] > 0 and ttft[variant]["kv_wait_s"] >= 0
        assert len(result["per_example"][0]["ttft"][variant]) == 1
    assert all(f"{v}_overhead" in ttft for v in variants[1:])
    assert (result["ttft_dtype"], result["ttft_memory_dtype"]) == ("int4", "fp16")
    assert "miss_cost_s" in ttft
    hits = result["hit_rates"]
    assert set(hits["policies"]) == {"frequency", "lru"} and hits["setup"]["num_chunks"] == 40
    for p in hits["policies"].values():
        assert 0.0 < p["hit_rate"] < 1.0 and p["num_bytes_held"] <= p["budget_bytes"]
        assert p["num_lookups"] == 48 * 6  # the questions after the first 20%, six chunks each
    assert not list(tmp_path.glob("blendrag-bench-kv-*"))  # the disk tier's temp dir is removed
    # reuse recomputes no context token, so its selection trivially agrees
    assert all(result["dtypes"][d]["modes"]["reuse"]["selection_overlap"] == 1.0 for d in result["dtypes"])
