"""`bench decode`: the fidelity comparison (a decoder against itself is exact, another weight form is not) and the
summary's arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from enginetest_tiny import build_model, random_chunks

from bench.decode import _aggregate, _clone, _compare, _greedy, _summary, _w8a8_every_step
from engine.config import EngineSettings
from engine.decode_weights import GEMM_FIELDS, _assemble, _quantize_all, build_decode_weights
from engine.engine import Engine
from engine.types import BlendConfig
from kvcache.types import InMemoryLayerReader


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    model_dir = build_model(tmp_path_factory.mktemp("tiny"), "llama")
    settings = EngineSettings(model=str(model_dir), device="cpu", dtype="float32")
    return Engine(settings, models_dir=tmp_path_factory.mktemp("models"))


def test_fidelity_of_a_decoder_against_itself_and_against_int4(engine: Engine, tmp_path: Path) -> None:
    chunks = random_chunks([12, 10], seed=3)
    layout = engine.prompt.layout(chunks, "which one?")
    source = InMemoryLayerReader(engine.precompute_chunks(chunks))
    result = engine.prompt_pass(layout, source, "blend", BlendConfig(recompute_ratio=0.3), extra_capacity=9)
    length = result.cache.length
    first = int(result.logits.argmax())

    class Args:
        fidelity_tokens = 8

    tokens, logps = _greedy(engine.transformer, result.cache, first, Args)  # type: ignore[arg-type]
    assert len(tokens) == len(logps) == 8 and result.cache.length == length  # decoded on a copy
    same = _compare(engine.transformer, result.cache, first, tokens, logps)
    assert same == {"kl_mean": 0.0, "kl_max": 0.0, "top1_agreement": 1.0, "same_answer": True, "first_difference": None}

    int4 = build_decode_weights(engine.model, "int4", tmp_path)
    engine.transformer.with_decode_weights(int4.weights)
    try:
        other = _compare(engine.transformer.decoder, result.cache, first, tokens, logps)
    finally:
        engine.transformer.with_decode_weights(engine.model.weights)
    assert other["kl_mean"] > 0.0 and other["kl_max"] >= other["kl_mean"]
    assert 0.0 <= other["top1_agreement"] <= 1.0


def test_clone_copies_the_cache_and_its_bias(engine: Engine) -> None:
    chunks = random_chunks([6], seed=4)
    source = InMemoryLayerReader(engine.precompute_chunks(chunks))
    result = engine.prompt_pass(engine.prompt.layout(chunks, "q?"), source, "full", BlendConfig(recompute_ratio=0.3))
    result.cache.key_bias = torch.zeros(result.cache.capacity)
    copy = _clone(result.cache)
    assert copy.length == result.cache.length and torch.equal(copy.k, result.cache.k)
    copy.k.zero_()
    copy.key_bias[0] = 1.0  # type: ignore[index]
    assert result.cache.k.abs().sum() > 0 and float(result.cache.key_bias[0]) == 0.0


def test_summary_ratios_and_aggregate() -> None:
    def run(one: float, eight: float) -> dict:
        return {"per_clients": {"1": {"decode_tokens_per_s": one}, "8": {"decode_tokens_per_s": eight}}}

    speed = {"same": [run(10.0, 40.0), run(12.0, 44.0)], "int8": [run(22.0, 55.0), run(22.0, 55.0)]}
    rows = [
        {"kl_mean": 0.1, "kl_max": 0.5, "top1_agreement": 1.0, "same_answer": True, "first_difference": None},
        {"kl_mean": 0.3, "kl_max": 0.2, "top1_agreement": 0.5, "same_answer": False, "first_difference": 3},
    ]
    fidelity = {"int8": {"per_example": rows, **_aggregate(rows)}}
    summary = _summary(speed, fidelity, ["same", "int8"], [1, 8])
    assert summary["same"] == {
        "tokens_per_s_1": 11.0,
        "vs_same_1": 1.0,
        "tokens_per_s_8": 42.0,
        "vs_same_8": 1.0,
        "batch_speedup": 42.0 / 11.0,
    }
    assert summary["int8"]["vs_same_1"] == 2.0 and summary["int8"]["batch_speedup"] == 2.5
    assert summary["int8"]["kl_mean"] == pytest.approx(0.2) and summary["int8"]["kl_max"] == 0.5
    assert (summary["int8"]["same_answers"], summary["int8"]["answers"], summary["int8"]["top1_agreement"]) == (
        1,
        2,
        0.75,
    )


def test_in_features_of_every_weight_form(engine: Engine, tmp_path: Path) -> None:
    from bench.decode import _in_features

    layer = engine.model.weights.layers[0]
    hidden, intermediate = engine.config.hidden_size, engine.config.intermediate_size
    assert (_in_features(layer.wqkv), _in_features(layer.w_down)) == (hidden, intermediate)
    for fmt in ("int8", "int4"):
        compact = build_decode_weights(engine.model, fmt, tmp_path).weights.layers[0]  # type: ignore[arg-type]
        assert (_in_features(compact.wqkv), _in_features(compact.w_down)) == (hidden, intermediate)


def test_w8a8_every_step_takes_the_packed_path_from_one_row(engine: Engine) -> None:
    """`int8-w8a8`'s weights: the same codes and packed copies, the W8A8 path from one row on."""
    weights = _assemble(engine.model.weights, "int8", _quantize_all(engine.model.weights, "int8"), 5)
    every = _w8a8_every_step(weights)
    pairs = [
        (getattr(a, n), getattr(b, n)) for a, b in zip(weights.layers, every.layers, strict=True) for n in GEMM_FIELDS
    ]
    pairs.append((weights.lm_head, every.lm_head))
    for before, after in pairs:
        assert before.batched.min_rows == 5 and after.batched.min_rows == 1
        assert after.qweight is before.qweight and after.batched.packed is before.batched.packed
    assert every.layers[0].attn_norm is weights.layers[0].attn_norm


def test_summary_lists_a_fidelity_only_decoder() -> None:
    rows = [{"kl_mean": 0.2, "kl_max": 0.4, "top1_agreement": 0.75, "same_answer": False, "first_difference": 1}]
    fidelity = {"int8-w8a8": {"per_example": rows, **_aggregate(rows)}}
    speed = {"int8": [{"per_clients": {"1": {"decode_tokens_per_s": 20.0}}}]}
    summary = _summary(speed, fidelity, ["int8"], [1])
    assert summary["int8-w8a8"] == {
        "kl_mean": 0.2,
        "kl_max": 0.4,
        "top1_agreement": 0.75,
        "same_answers": 0,
        "answers": 1,
    }
    assert summary["int8"] == {"tokens_per_s_1": 20.0}
