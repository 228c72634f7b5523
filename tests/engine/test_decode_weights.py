"""Decode's compact weights (engine/decode_weights.py): what the int8/int4 forms hold, that the CPU kernels
compute with exactly them, that the cache in the models dir round-trips, and that the engine decodes with them
while the prompt pass keeps the model's own weights."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from enginetest_tiny import random_chunks

from engine.batched_decode import attend_one, decode_batch
from engine.config import EngineSettings
from engine.decode_weights import (
    AUTO_MIN_PARAMETERS,
    DECODE_WEIGHTS_DIR,
    INT4_GROUP_SIZE,
    W8A8_MIN_ROWS,
    Int4Weight,
    Int8Weight,
    _int4_weight,
    _num_gemm_parameters,
    build_decode_weights,
    choose_format,
    dequantize,
    quantize_int4,
    quantize_int8,
    w8a8_rows,
)
from engine.engine import Engine
from engine.quantized_weights import int8_gemm_exact, pack_int8
from engine.types import BlendConfig
from kvcache.types import InMemoryLayerReader


def _weight(out_features: int, in_features: int, seed: int) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_int8_holds_a_matrix_on_its_grid_exactly_and_others_within_half_a_step() -> None:
    scales = torch.tensor([0.5, 0.25, 2.0])  # bfloat16-exact
    codes = torch.tensor([[127, -3, 0, 5], [-127, 1, 2, 127], [10, -127, 64, 0]], dtype=torch.int8)
    on_grid = codes.float() * scales[:, None]
    got_codes, got_scales = quantize_int8(on_grid)
    assert torch.equal(got_codes, codes) and got_scales.dtype == torch.bfloat16
    assert torch.equal(dequantize(Int8Weight(got_codes, got_scales)), on_grid)

    w = _weight(40, 64, seed=1)
    q = Int8Weight(*quantize_int8(w))
    step = q.scales.float()[:, None]
    assert bool(((dequantize(q) - w).abs() <= step / 2 + 1e-7).all())
    assert int(q.qweight.abs().max()) == 127  # every row uses its whole range


def test_int4_codes_and_error_per_group() -> None:
    w = _weight(32, 4 * INT4_GROUP_SIZE, seed=2)
    codes, scales_zeros = quantize_int4(w)
    assert codes.shape == w.shape and codes.dtype == torch.uint8 and int(codes.max()) == 15 and int(codes.min()) == 0
    assert scales_zeros.shape == (4, 32, 2) and scales_zeros.dtype == torch.bfloat16
    step = scales_zeros[..., 0].float().t().repeat_interleave(INT4_GROUP_SIZE, dim=1)  # (out, in)
    weight = _int4_weight(codes, scales_zeros)
    err = (dequantize(weight, codes) - w).abs()
    # Half a step, plus the bfloat16 rounding of each group's zero point.
    assert bool((err <= step / 2 + w.abs().amax() * 2**-8).all())
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_int4(_weight(16, 48, seed=3))
    with pytest.raises(ValueError, match="one of 16"):
        quantize_int4(_weight(24, 64, seed=3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3])
def test_kernels_compute_with_the_stored_values(dtype: torch.dtype, rows: int) -> None:
    """The packed int8/int4 kernels give x @ dequantized(w)ᵀ, for activations in float32 and bfloat16 (cast
    to bfloat16 for the kernel and back): the codes and the scale/zero convention are the kernels' own."""
    w = _weight(96, 128, seed=4)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(5)).to(dtype)
    x16 = x.to(torch.bfloat16).float()  # what the kernel reads
    q8 = Int8Weight(*quantize_int8(w))
    codes, scales_zeros = quantize_int4(w)
    q4 = _int4_weight(codes, scales_zeros)
    for weight, dense in ((q8, dequantize(q8)), (q4, dequantize(q4, codes))):
        out = weight.matmul(x)
        assert out.shape == (rows, 96) and out.dtype == dtype
        expected = x16 @ dense.t()
        torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-3 * float(expected.abs().max()))


# W8A8 runs only where the int8 GEMM is exact (VNNI); elsewhere decode never takes it, and its values are wrong.
needs_exact_int8_gemm = pytest.mark.skipif(
    not int8_gemm_exact(), reason="this CPU's int8 GEMM is not exact (no VNNI): decode never runs W8A8 here"
)


@needs_exact_int8_gemm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_is_the_exact_int8_sum_of_each_row_times_both_scales(dtype: torch.dtype) -> None:
    """Rows on an int8 grid of their own (power-of-two scales, every row reaching code 127) quantize back to
    their codes, so the output is the exact integer sum scaled by the row's and the channel's scale."""
    gen = torch.Generator().manual_seed(7)
    codes = torch.randint(-127, 128, (6, 128), dtype=torch.int8, generator=gen)
    codes[:, 3] = 127
    codes[5] = 0  # an all-zero row: its output is zero
    row_scales = 2.0 ** torch.arange(-6.0, 0.0)[:, None]  # (6, 1)
    x = (codes.float() * row_scales).to(dtype)
    assert torch.equal(x.float(), codes.float() * row_scales)  # on the grid in bfloat16 too
    q = _batched(_weight(96, 128, seed=8), min_rows=1)
    exact_sums = (codes.long() @ q.qweight.long().t()).float()
    expected = (exact_sums * q.scales.float() * row_scales).to(dtype)
    out = q.matmul_w8a8(x)
    assert out.dtype == dtype and torch.equal(out, expected)
    assert not out[5].any()


@needs_exact_int8_gemm
def test_w8a8_gives_a_row_the_same_output_whatever_rows_share_the_call() -> None:
    """A decode step's result for a request does not depend on which others decode beside it."""
    q = _batched(_weight(96, 128, seed=9), min_rows=1)
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    x[4] *= 50  # one row of a much larger range: the others keep their own scales
    alone = torch.cat([q.matmul_w8a8(x[i : i + 1]) for i in range(9)])
    assert torch.equal(q.matmul_w8a8(x), alone)
    # And it is the weight-only product within int8's step on the activations.
    expected = x.float() @ dequantize(q).t()
    torch.testing.assert_close(q.matmul_w8a8(x).float(), expected, rtol=0.05, atol=0.02 * float(expected.abs().max()))


def _batched(w: torch.Tensor, min_rows: int) -> Int8Weight:
    codes, scales = quantize_int8(w)
    return Int8Weight(codes, scales, pack_int8(codes, scales, min_rows))


def test_int8_weight_takes_w8a8_from_its_row_threshold() -> None:
    batched = _batched(_weight(96, 128, seed=11), min_rows=5)
    plain = Int8Weight(batched.qweight, batched.scales)
    x = torch.randn(5, 1, 128, generator=torch.Generator().manual_seed(12))  # (B, 1, hidden) as a decode step
    rows = x[:, 0]
    assert torch.equal(batched.matmul(x[:4]), batched.matmul_rows(rows[:4])[:, None])
    assert torch.equal(batched.matmul(x), batched.matmul_w8a8(rows)[:, None])
    assert torch.equal(plain.matmul(x), plain.matmul_rows(rows)[:, None])
    with pytest.raises(ValueError, match="packed copy"):
        plain.matmul_w8a8(rows)


def test_w8a8_is_chosen_for_int8_where_the_int8_gemm_is_exact() -> None:
    exact = int8_gemm_exact()
    assert w8a8_rows("int8", torch.bfloat16) == (W8A8_MIN_ROWS[torch.bfloat16] if exact else None)
    assert w8a8_rows("int8", torch.float32) == (W8A8_MIN_ROWS[torch.float32] if exact else None)
    assert w8a8_rows("int4", torch.bfloat16) is None and w8a8_rows("same", torch.float32) is None


def test_an_int8_gemm_without_vnni_is_found_inexact() -> None:
    """oneDNN capped below VNNI (what an AVX2-only CPU runs) saturates its 16-bit pair sums: the probe must see
    it, so decode keeps the weight-only kernel there."""
    code = (
        "import torch; from engine.decode_weights import w8a8_rows; from engine.quantized_weights import "
        "int8_gemm_exact; print(int8_gemm_exact(), w8a8_rows('int8', torch.bfloat16))"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "None"]


def test_attend_one_is_attention_over_every_key() -> None:
    """The decode step's attention for one query row equals SDPA's (GQA, with and without a key bias)."""
    gen = torch.Generator().manual_seed(6)
    kv_heads, group, keys, d = 2, 3, 37, 16
    q = torch.randn(kv_heads, group, d, generator=gen)
    k = torch.randn(kv_heads, keys, d, generator=gen)
    v = torch.randn(kv_heads, keys, d, generator=gen)
    bias = torch.zeros(keys)
    bias[5:20] = -1.5
    for b in (None, bias):
        got = attend_one(q, k, v, b)
        ref = F.scaled_dot_product_attention(
            q.reshape(1, kv_heads * group, 1, d),
            k[None],
            v[None],
            attn_mask=None if b is None else b[None, None, None],
            enable_gqa=True,
        )
        torch.testing.assert_close(got.reshape(1, kv_heads * group, 1, d), ref, rtol=1e-5, atol=1e-6)


def test_auto_keeps_a_small_model_own_weights_and_named_formats_need_a_cpu(tiny_engine: Engine) -> None:
    model = tiny_engine.model
    assert _num_gemm_parameters(model.weights) < AUTO_MIN_PARAMETERS
    assert choose_format("auto", model) == "same" and tiny_engine.decode_weights.format == "same"
    assert tiny_engine.transformer.decoder is tiny_engine.transformer
    assert choose_format("int8", model) == "int8" and choose_format("int4", model) == "int4"
    on_gpu = dataclasses.replace(model, device=torch.device("cuda"))
    assert choose_format("auto", on_gpu) == "same"
    with pytest.raises(ValueError, match="runs on a CPU only"):
        choose_format("int8", on_gpu)


def test_cache_round_trips_and_a_damaged_file_is_replaced(
    tiny_engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = tiny_engine.model
    first = build_decode_weights(model, "int8", tmp_path)
    assert not first.from_cache and first.format == "int8" and first.max_rows == 64  # float32 model
    assert first.w8a8_min_rows == w8a8_rows("int8", torch.float32)
    thresholds = {None if w.batched is None else w.batched.min_rows for w in _int8_weights(first)}  # type: ignore[attr-defined]
    assert thresholds == {first.w8a8_min_rows}
    (cached,) = tmp_path.glob("*-int8-v2.safetensors")
    assert cached.name.startswith(model.fingerprint[:32])
    layer = first.weights.layers[0]
    assert isinstance(layer.wqkv, Int8Weight) and isinstance(first.weights.lm_head, Int8Weight)
    assert layer.attn_norm is model.weights.layers[0].attn_norm  # norms and biases are shared, not copied
    num_gemm = sum(
        getattr(layer, n).numel() for layer in model.weights.layers for n in ("wqkv", "wo", "w_gate_up", "w_down")
    )
    num_scales = sum(
        getattr(layer, n).shape[0] for layer in model.weights.layers for n in ("wqkv", "wo", "w_gate_up", "w_down")
    )
    head = model.weights.lm_head
    packed = 0 if first.w8a8_min_rows is None else num_gemm + head.numel() + 12 * (num_scales + head.shape[0])
    assert first.num_bytes == num_gemm + head.numel() + 2 * (num_scales + head.shape[0]) + packed

    again = build_decode_weights(model, "int8", tmp_path)
    assert again.from_cache
    assert torch.equal(again.weights.layers[1].w_down.qweight, first.weights.layers[1].w_down.qweight)
    assert torch.equal(again.weights.lm_head.scales, first.weights.lm_head.scales)

    cached.write_bytes(b"not a safetensors file")
    with caplog.at_level(logging.WARNING, logger="engine.decode_weights"):
        repaired = build_decode_weights(model, "int8", tmp_path)
    assert not repaired.from_cache and "unreadable decode-weights cache" in caplog.text
    assert torch.equal(repaired.weights.layers[1].w_down.qweight, first.weights.layers[1].w_down.qweight)
    assert build_decode_weights(model, "int8", tmp_path).from_cache  # the damaged file was replaced

    # A readable file that does not fit (another layout under the same name) is quantized again, not trusted.
    from safetensors.torch import save_file

    save_file({"lm_head.codes": torch.zeros(2, 2, dtype=torch.int8)}, str(cached))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.decode_weights"):
        refit = build_decode_weights(model, "int8", tmp_path)
    assert not refit.from_cache and "does not fit this model" in caplog.text
    assert torch.equal(refit.weights.lm_head.qweight, first.weights.lm_head.qweight)

    int4 = build_decode_weights(model, "int4", None)  # no cache dir: nothing written
    assert isinstance(int4.weights.layers[0].w_gate_up, Int4Weight) and not int4.from_cache
    assert sorted(p.name.split("-")[-2] for p in tmp_path.glob("*.safetensors")) == ["int8"]


def _int8_weights(decode: object) -> list[object]:
    weights = decode.weights  # type: ignore[attr-defined]
    names = ("wqkv", "wo", "w_gate_up", "w_down")
    return [getattr(layer, n) for layer in weights.layers for n in names] + [weights.lm_head]


@pytest.fixture(scope="module")
def int8_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    settings = EngineSettings(model=str(tiny_model_dir), device="cpu", dtype="float32", decode_weights="int8")
    return Engine(settings, models_dir=tmp_path_factory.mktemp("models-int8"))


def test_engine_decodes_with_int8_and_prompts_with_its_own_weights(tiny_engine: Engine, int8_engine: Engine) -> None:
    assert int8_engine.decode_weights.format == "int8"
    assert (int8_engine.settings.model, int8_engine.fingerprint) == (
        tiny_engine.settings.model,
        tiny_engine.fingerprint,
    )
    cache_file = int8_engine.decode_weights.cache_path
    assert cache_file is not None and cache_file.parent.name == DECODE_WEIGHTS_DIR and cache_file.is_file()
    assert cache_file.name == f"{int8_engine.fingerprint[:32]}-int8-v2.safetensors"
    chunks = random_chunks([14, 9], seed=11)
    layout = tiny_engine.prompt.layout(chunks, "what is it?")
    results = []
    for engine in (tiny_engine, int8_engine):
        source = InMemoryLayerReader(engine.precompute_chunks(chunks))
        results.append(engine.prompt_pass(layout, source, "blend", BlendConfig(recompute_ratio=0.3), extra_capacity=4))
    own, compact = results
    # The prompt pass (and so the first token) is the model's own in both engines, bit for bit.
    assert torch.equal(own.logits, compact.logits)
    token = int(own.logits.argmax())
    step_own = decode_batch(tiny_engine.transformer.decoder, [own.cache], [token])[0]
    step_int8 = decode_batch(int8_engine.transformer.decoder, [compact.cache], [token])[0]
    assert not torch.equal(step_own, step_int8)  # the decode step really read other weights
    kl = F.kl_div(torch.log_softmax(step_int8, -1), torch.log_softmax(step_own, -1), log_target=True, reduction="sum")
    assert float(kl) < 1e-3
    assert int(step_int8.argmax()) == int(step_own.argmax())


def test_int8_batched_steps_decode_the_tokens_of_one_request_at_a_time(int8_engine: Engine) -> None:
    """Six requests in one step (W8A8 where the int8 GEMM is exact) against each alone (weight-only int8):
    the same greedy tokens for 6 steps, next-token distributions within a small KL."""
    assert int8_engine.decode_weights.w8a8_min_rows == w8a8_rows("int8", torch.float32)
    decoder = int8_engine.transformer.decoder
    caches, tokens = [], []
    for i in range(6):
        chunks = random_chunks([9 + 4 * i, 12 + i], seed=400 + i)
        layout = int8_engine.prompt.layout(chunks, "what is it?" + " really" * i)
        source = InMemoryLayerReader(int8_engine.precompute_chunks(chunks))
        result = int8_engine.prompt_pass(layout, source, "blend", BlendConfig(recompute_ratio=0.3), extra_capacity=8)
        caches.append(result.cache)
        tokens.append(int(result.logits.argmax()))
    alone = [type(c)(k=c.k.clone(), v=c.v.clone(), length=c.length) for c in caches]
    alone_tokens = list(tokens)
    for _ in range(6):
        together = decode_batch(decoder, caches, tokens)
        each = torch.cat([decode_batch(decoder, [c], [t]) for c, t in zip(alone, alone_tokens, strict=True)])
        kl = F.kl_div(torch.log_softmax(together, -1), torch.log_softmax(each, -1), log_target=True, reduction="none")
        assert float(kl.sum(-1).max()) < 1e-3
        # Where W8A8 runs, the step really computed otherwise (int8 activations) than the row path.
        assert torch.equal(together, each) == (int8_engine.decode_weights.w8a8_min_rows is None)
        tokens, alone_tokens = together.argmax(-1).tolist(), each.argmax(-1).tolist()
        assert tokens == alone_tokens
