"""`bench peers` on the tiny model: HF transformers and blendrag always; llama.cpp only where installed."""

from __future__ import annotations

import pytest

from bench.llamacpp import llama_cpp_available


def test_peers_without_llamacpp_on_the_tiny_model(run_bench, dataset_path) -> None:
    code, result, png = run_bench(
        "peers", "--dataset", str(dataset_path), "--examples", "1", "--passages", "2", "--no-llamacpp"
    )
    assert code == 0 and png.is_file()
    assert list(result["modes"]) == ["hf_float32", "hf_bfloat16", "blendrag_full", "blendrag_blend"]
    assert result["llamacpp"] == {"skipped": "--no-llamacpp"}
    assert result["modes"]["blendrag_blend"]["times_blend"] == 1.0
    # HF's own float32 forward of the same checkpoint picks the same first token as our full prefill.
    assert result["modes"]["hf_float32"]["same_first_token_as_blendrag_full"] == 1.0
    row = result["per_example"][0]
    assert set(row["ttft_s"]) == set(result["modes"]) and row["num_prompt_tokens"] > 0


def test_peers_records_why_llamacpp_is_left_out(run_bench, dataset_path) -> None:
    code, result, _ = run_bench(
        "peers", "--dataset", str(dataset_path), "--examples", "1", "--passages", "2", "--hf-dtypes", ""
    )
    assert code == 0 and list(result["modes"]) == ["blendrag_full", "blendrag_blend"]
    reason = result["llamacpp"]["skipped"]
    if llama_cpp_available():  # the tiny model has no GGUF: its ids mean nothing to the built-in one
        assert reason.startswith("--model is not the built-in one")
    else:
        assert reason.startswith("llama_cpp is not importable")


@pytest.mark.slow
@pytest.mark.skipif(not llama_cpp_available(), reason="needs the optional llama-cpp-python (llamacpp extra)")
def test_f16_gguf_holds_the_shipped_weights(tmp_path) -> None:
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from bench.gguf_f16 import write_f16_gguf
    from engine.builtin import builtin_gguf_path

    source = builtin_gguf_path()
    written = GGUFReader(write_f16_gguf(source, tmp_path / "f16.gguf"))
    shipped = GGUFReader(source)
    assert written.fields["general.file_type"].contents() == 1  # MOSTLY_F16
    assert [t.name for t in written.tensors] == [t.name for t in shipped.tensors]
    for a, b in zip(shipped.tensors, written.tensors, strict=True):
        assert list(a.shape) == list(b.shape) and b.tensor_type.name == ("F16" if len(a.shape) > 1 else "F32")
        x, y = dequantize(a.data, a.tensor_type), dequantize(b.data, b.tensor_type)
        assert np.allclose(x.reshape(-1), y.reshape(-1), rtol=1e-3, atol=1e-6)  # F16 rounding only
