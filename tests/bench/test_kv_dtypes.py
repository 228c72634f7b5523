from __future__ import annotations


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
    )
    assert code == 0 and png.is_file()
    assert list(result["dtypes"]) == ["fp16", "bf16", "int8"]
    # tiny Llama: 2 layers × 2 KV heads × head_dim 16; int8 adds a float32 scale per (head, token) row
    assert result["dtypes"]["fp16"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 2
    assert result["dtypes"]["bf16"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 2
    assert result["dtypes"]["int8"]["bytes_per_token"] == 2 * 2 * 2 * (16 + 4)
    assert result["kv_elements_per_token"] == 2 * 2 * 2 * 16
    for dtype in ("fp16", "bf16", "int8"):
        d = result["dtypes"][dtype]
        assert d["file_bytes_per_token"] > d["bytes_per_token"]
        assert set(d["modes"]) == {"reuse", "blend@0.15"}
        for m in d["modes"].values():
            assert set(m) >= {"kl", "kl_max", "first_token_agreement", "answer_agreement", "selection_overlap"}
            assert 0.0 <= m["answer_agreement"] <= 1.0
    # rounding to fp16 perturbs the stale KV far less than int8 does
    assert result["dtypes"]["fp16"]["modes"]["reuse"]["kl"] < result["dtypes"]["int8"]["modes"]["reuse"]["kl"]
    ttft = result["ttft"]
    variants = ("memory", "disk", "disk_no_prefetch", "disk_cold", "disk_cold_no_prefetch")
    for variant in variants:
        assert ttft[variant]["p50_s"] > 0 and ttft[variant]["kv_wait_s"] >= 0
        assert len(result["per_example"][0]["ttft"][variant]) == 1
    assert all(f"{v}_overhead" in ttft for v in variants[1:]) and result["ttft_dtype"] == "fp16"
    assert not list(tmp_path.glob("blendrag-bench-kv-*"))  # the disk tier's temp dir is removed
    # reuse recomputes no context token, so its selection trivially agrees
    assert all(result["dtypes"][d]["modes"]["reuse"]["selection_overlap"] == 1.0 for d in result["dtypes"])
