from __future__ import annotations


def test_ingest_end_to_end(run_bench, dataset_path, tmp_path) -> None:
    code, result, png = run_bench(
        "ingest",
        "--dataset",
        str(dataset_path),
        "--chunks",
        "5",
        "--dtype-sample",
        "3",
        "--tmp-dir",
        str(tmp_path),
        "--kv-dtype",
        "fp16",  # the default is the server's (int4); fp16 entries have the exact size checked below
    )
    assert code == 0 and png.is_file()
    ingest = result["ingest"]
    assert ingest["documents"] == 5 and ingest["chunks"] == 5  # each short passage is one chunk
    assert set(ingest["stages"]) == {"parse", "chunk", "embed", "kv", "commit"}
    assert all(s["seconds"] > 0 for s in ingest["stages"].values())  # each stage ran and took time
    assert sum(s["seconds"] for s in ingest["stages"].values()) <= ingest["seconds"] + 1e-6
    assert ingest["kv_storage_dtype"] == "fp16"
    # 5 entry files of 2 layers × 2 heads × 16 dims × K and V in fp16, plus their headers
    assert ingest["kv_bytes"] > 5 * 0 + ingest["tokens"] * 2 * 2 * 2 * 16 * 2
    assert ingest["faiss_index_bytes"] >= 5 * 384 * 4  # five float32 MiniLM vectors
    assert result["kv_bytes"]["fp16"]["bytes_per_token"] == 256
    assert result["kv_bytes"]["int8"]["bytes_per_token"] == 160
    assert result["kv_sample"]["sample_chunks"] == 3
    retrieval = result["retrieval"]
    assert set(retrieval["recall"]) == {"1", "5", "10"}
    assert retrieval["questions"] == 2 and retrieval["passages"] == 6
    assert retrieval["recall"]["10"] == 1.0  # only 6 passages: every gold one is in the top 10
    assert retrieval["recall"]["1"] <= retrieval["recall"]["5"] <= 1.0
    assert not list(tmp_path.glob("blendrag-bench-ingest-*"))
