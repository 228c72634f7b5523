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
    # Decode: 64 tokens by default; every peer but our full prefill (TTFT only) decodes, and blendrag's rate
    # is compared with each other decoding peer's.
    assert result["decode"]["tokens"] == 64 and result["decode"]["decode_weights"] == "same"  # a tiny model
    assert set(row["decode_tokens_per_s"]) == {"hf_float32", "hf_bfloat16", "blendrag_blend"}
    assert "decode_tokens_per_s_median" not in result["modes"]["blendrag_full"]
    ours = result["modes"]["blendrag_blend"]["decode_tokens_per_s_median"]
    assert ours == round(row["decode_tokens_per_s"]["blendrag_blend"], 3) > 0
    assert set(result["decode"]["blendrag_vs"]) == {"hf_float32", "hf_bfloat16"}
    hf = result["modes"]["hf_float32"]["decode_tokens_per_s_median"]
    assert result["decode"]["blendrag_vs"]["hf_float32"] == round(ours / hf, 3)


def test_decode_rate_is_the_tokens_after_the_first_over_their_time() -> None:
    from bench.peer_run import PeerRun, decode_tokens_per_s

    # 3 tokens after the first, 2 s from the first token to the last: the prompt pass before it is not counted.
    assert decode_tokens_per_s([10.0, 10.25, 11.5, 12.0]) == 1.5
    assert decode_tokens_per_s([3.0, 3.5]) == 2.0
    assert decode_tokens_per_s([7.0]) is None  # the first token alone: nothing decoded
    assert decode_tokens_per_s([]) is None
    assert decode_tokens_per_s([2.0, 2.0]) is None  # no time between the tokens: no rate
    run = PeerRun(ttft_s=4.0, tokens=(5, 9, 9, 2), token_times=(104.0, 104.5, 105.0, 105.25))
    assert (run.first_token, run.decode_tokens_per_s) == (5, 3 / 1.25)


def test_decode_tokens_count_the_first_token(capsys) -> None:
    from bench.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["peers", "--decode-tokens", "0"])
    assert exc.value.code == 2 and "at least 1 (the first token), got 0" in capsys.readouterr().err


def test_summary_gives_decode_medians_and_blendrag_over_each_peer() -> None:
    from bench.peers import decode_ratios, summarize

    names = ["llamacpp_q4_k_m", "hf_float32", "blendrag_full", "blendrag_blend"]
    ttfts = [[30.0, 20.0, 20.0, 4.0], [36.0, 24.0, 25.0, 6.0], [33.0, 21.0, 22.0, 5.0]]
    rates = [[40.0, 8.0, 20.0], [50.0, 10.0, 30.0], [44.0, 9.0, 22.0]]  # our full prefill does not decode
    rows = [
        {
            "ttft_s": dict(zip(names, ttft, strict=True)),
            "first_token": dict.fromkeys(names, 7) | ({"hf_float32": 3} if n == 1 else {}),
            "decode_tokens_per_s": dict(zip(["llamacpp_q4_k_m", "hf_float32", "blendrag_blend"], rate, strict=True)),
        }
        for n, (ttft, rate) in enumerate(zip(ttfts, rates, strict=True))
    ]
    modes = summarize(rows, names)
    assert modes["llamacpp_q4_k_m"] == {
        "ttft_s_median": 33.0,
        "ttft_s_p90": 35.4,  # between 33 and 36, numpy's way
        "times_blend": 6.6,  # 33 / 5
        "times_blend_paired_median": 6.6,  # median of 7.5, 6.0, 6.6
        "same_first_token_as_blendrag_full": 1.0,
        "decode_tokens_per_s_median": 44.0,
        "decode_tokens_per_s_min": 40.0,
    }
    assert modes["hf_float32"]["same_first_token_as_blendrag_full"] == 2 / 3
    assert modes["hf_float32"]["decode_tokens_per_s_median"] == 9.0
    assert modes["blendrag_blend"]["decode_tokens_per_s_median"] == 22.0
    assert "decode_tokens_per_s_median" not in modes["blendrag_full"]
    assert decode_ratios(modes) == {"llamacpp_q4_k_m": 0.5, "hf_float32": 2.444}  # 22/44, 22/9
    # Without blendrag's decode (--decode-tokens 1) there is no ratio.
    assert decode_ratios({"hf_float32": {"decode_tokens_per_s_median": 9.0}, "blendrag_blend": {}}) == {}


def test_transformers_peer_decodes_what_generate_does(tiny_llama_dir) -> None:
    """The manual loop (the last token and the KV cache per step) picks transformers' own greedy `generate`
    tokens, EOS ignored."""
    import torch

    from bench.peers import HFRunner

    runner = HFRunner(tiny_llama_dir, "float32")
    ids = list(range(5, 45))
    run = runner.decode(ids, 12)
    with torch.inference_mode():
        want = runner.model.generate(
            torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False, attention_mask=None
        )
    assert run.tokens == tuple(want[0, len(ids) :].tolist())
    assert len(run.token_times) == 12 and run.ttft_s > 0 and run.decode_tokens_per_s is not None
    assert runner.decode(ids, 1).tokens == run.tokens[:1]  # one token: the prompt pass alone


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
        *("--decode-tokens", "8"),
    )
    assert code == 0
    assert list(result["modes"]) == ["llamacpp_q4_1", "llamacpp_f16", "blendrag_full", "blendrag_blend"]
    facts = result["llamacpp"]
    assert (facts["gguf"], facts["peer"]) == (builtin_gguf_path().name, "llamacpp_q4_1")
    assert facts["f16_gguf"] == "smol.F16.gguf"
    assert all(result["per_example"][0]["ttft_s"][name] > 0 for name in result["modes"])
    # llama.cpp decodes the same 8 tokens as every peer; blendrag's rate is set against both files'.
    assert set(result["per_example"][0]["decode_tokens_per_s"]) == {"llamacpp_q4_1", "llamacpp_f16", "blendrag_blend"}
    assert set(result["decode"]["blendrag_vs"]) == {"llamacpp_q4_1", "llamacpp_f16"}


@pytest.mark.skipif(not llama_cpp_available(), reason="needs the optional llama-cpp-python (llamacpp extra)")
def test_llamacpp_decodes_greedily_from_the_prompt(tmp_path) -> None:
    """llama.cpp's decode loop on SmolLM2's GGUF: the first token is the prompt pass's (`ttft`), each next one
    llama.cpp's greedy pick after the previous, EOS ignored (the run is as long as asked)."""
    from bench.llamacpp import LlamaCppRunner
    from engine.builtin import builtin_gguf_path

    runner = LlamaCppRunner(builtin_gguf_path(), n_ctx=128, n_threads=2, n_batch=64)
    ids = [1, 504, 3458, 282, 4649, 314, 260, 3575, 30, 216]
    run = runner.decode(ids, 10)
    assert len(run.tokens) == len(run.token_times) == 10 and run.decode_tokens_per_s is not None
    assert run.first_token == runner.ttft(ids)[1]
    # Greedy and deterministic: the same prompt decodes the same tokens; a prompt that already holds the
    # first five continues with the sixth.
    assert runner.decode(ids, 10).tokens == run.tokens
    assert runner.decode(ids + list(run.tokens[:5]), 5).tokens == run.tokens[5:]
