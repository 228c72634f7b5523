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


def test_ingest_of_a_docs_folder_chunks_its_pages(run_bench, dataset_path, tmp_path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    long_page = "# Widgets\n\n" + "\n\n".join(
        f"Paragraph {i} explains how the widget number {i} is set up." for i in range(150)
    )
    (docs / "widgets.md").write_text(long_page, encoding="utf-8")
    (docs / "intro.md").write_text("# Intro\n\nA short page that fits in one chunk.\n", encoding="utf-8")
    code, result, _ = run_bench(
        "ingest", "--dataset", str(dataset_path), "--docs", str(docs), "--dtype-sample", "2", "--no-recall"
    )
    assert code == 0
    ingest = result["ingest"]
    assert result["corpus"] == "docs folder"
    assert ingest["documents"] == 2
    # the long page is cut at the 512-token chunk budget with a 64-token overlap: 7 chunks, plus the short page
    assert ingest["chunks"] == 8
    assert ingest["tokens"] == 3297
    assert "retrieval" not in result


def test_ingest_of_a_folder_without_pages_is_refused(dataset_path, tmp_path) -> None:
    from bench.__main__ import main

    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "refused.json"
    code = main(
        ["ingest", "--model", "unused", "--dataset", str(dataset_path), "--docs", str(empty), "--out", str(out)]
    )
    assert code == 2
    assert not out.exists()
