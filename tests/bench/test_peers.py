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
    if llama_cpp_available():  # the tiny model is a checkpoint dir: no GGUF it came from
        assert reason.startswith("no GGUF for --model") and "give --gguf" in reason
    else:
        assert reason.startswith("llama_cpp is not importable")


def _quantized_gguf(path, rng) -> dict:
    """A small GGUF like the shipped one: Q4_1 and Q8_0 matrices, F32 vectors, scalar and array metadata."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    tensors = {
        "token_embd.weight": (rng.standard_normal((8, 64)).astype(np.float32), GGMLQuantizationType.Q8_0),
        "blk.0.attn_q.weight": (rng.standard_normal((4, 64)).astype(np.float32), GGMLQuantizationType.Q4_1),
        "blk.0.attn_norm.weight": (rng.standard_normal(64).astype(np.float32), GGMLQuantizationType.F32),
    }
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_file_type(3)  # MOSTLY_Q4_1
    writer.add_token_list(["<a>", "<b>", "c"])
    writer.add_rope_freq_base(100000.0)
    for name, (values, qtype) in tensors.items():
        data = values if qtype == GGMLQuantizationType.F32 else quantize(values, qtype)
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def test_f16_gguf_holds_the_same_weights_and_metadata(tmp_path) -> None:
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from bench.gguf_f16 import write_f16_gguf

    _quantized_gguf(tmp_path / "q.gguf", np.random.default_rng(0))
    source, written = (
        GGUFReader(tmp_path / "q.gguf"),
        GGUFReader(write_f16_gguf(tmp_path / "q.gguf", tmp_path / "f16.gguf")),
    )
    assert written.fields["general.file_type"].contents() == 1  # MOSTLY_F16
    for name in ("general.architecture", "llama.block_count", "tokenizer.ggml.tokens", "llama.rope.freq_base"):
        assert written.fields[name].contents() == source.fields[name].contents()
    assert [t.name for t in written.tensors] == [t.name for t in source.tensors]
    types = {t.name: t.tensor_type.name for t in written.tensors}
    assert types == {"token_embd.weight": "F16", "blk.0.attn_q.weight": "F16", "blk.0.attn_norm.weight": "F32"}
    for a, b in zip(source.tensors, written.tensors, strict=True):
        assert list(a.shape) == list(b.shape)
        x, y = dequantize(a.data, a.tensor_type), dequantize(b.data, b.tensor_type)
        assert x.shape == y.shape and np.allclose(x, y, rtol=1e-3, atol=1e-4)  # F16 rounding of the same values
    # An existing file is kept as it is (the F16 GGUF is written once).
    before = (tmp_path / "f16.gguf").stat().st_mtime_ns
    write_f16_gguf(tmp_path / "q.gguf", tmp_path / "f16.gguf")
    assert (tmp_path / "f16.gguf").stat().st_mtime_ns == before


def test_llamacpp_peer_is_named_by_the_files_quantisation(tmp_path) -> None:
    import numpy as np

    from bench.gguf_f16 import write_f16_gguf
    from bench.peers import gguf_peer_name

    _quantized_gguf(tmp_path / "q.gguf", np.random.default_rng(0))
    assert gguf_peer_name(tmp_path / "q.gguf") == "llamacpp_q4_1"
    assert gguf_peer_name(write_f16_gguf(tmp_path / "q.gguf", tmp_path / "f16.gguf")) == "llamacpp_f16"


def test_the_gguf_llamacpp_runs_is_the_one_the_model_comes_from(tmp_path, tiny_llama_dir) -> None:
    import argparse

    from bench.peers import model_gguf
    from engine.builtin import builtin_gguf_path

    def args(model: str, gguf=None) -> argparse.Namespace:
        return argparse.Namespace(model=model, gguf=gguf, models_dir=tmp_path)

    assert model_gguf(args("builtin")) == builtin_gguf_path()
    assert model_gguf(args("smollm2-135m-instruct")) == builtin_gguf_path()  # its converted dir's name
    assert model_gguf(args(str(tiny_llama_dir))) is None
    assert model_gguf(args(str(tiny_llama_dir), gguf=tmp_path / "mine.gguf")) == tmp_path / "mine.gguf"
    (tmp_path / "own.gguf").write_bytes(b"GGUF")
    assert model_gguf(args(str(tmp_path / "own.gguf"))) == tmp_path / "own.gguf"


@pytest.mark.slow
@pytest.mark.skipif(not llama_cpp_available(), reason="needs the optional llama-cpp-python (llamacpp extra)")
def test_peers_runs_llamacpp_on_the_gguf_and_its_f16_copy(run_bench, dataset_path, tmp_path) -> None:
    from engine.builtin import builtin_gguf_path

    # The tiny model speaks SmolLM2's token ids, so llama.cpp can prefill them on SmolLM2's GGUF.
    code, result, _ = run_bench(
        "peers",
        *("--dataset", str(dataset_path), "--examples", "1", "--passages", "2", "--hf-dtypes", ""),
        *("--gguf", str(builtin_gguf_path()), "--f16-gguf", str(tmp_path / "smol.F16.gguf")),
    )
    assert code == 0
    assert list(result["modes"]) == ["llamacpp_q4_1", "llamacpp_f16", "blendrag_full", "blendrag_blend"]
    facts = result["llamacpp"]
    assert (facts["gguf"], facts["peer"]) == (builtin_gguf_path().name, "llamacpp_q4_1")
    assert facts["f16_gguf"] == "smol.F16.gguf"
    assert all(result["per_example"][0]["ttft_s"][name] > 0 for name in result["modes"])
