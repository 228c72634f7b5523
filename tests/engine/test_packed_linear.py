"""GEMM weights packed once for oneDNN give the same bits as plain F.linear, in every mode the engine runs.

Packing applies in bfloat16 on a CPU with bf16 matrix units only; elsewhere (float32, an AVX2-only CPU, CUDA)
nothing is packed, which the first test pins for the machine it runs on.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from enginetest_tiny import random_chunks

from engine.packed_linear import can_pack, linear
from engine.types import BlendConfig, GenerationRequest, SamplingParams, TokenEvent
from kvcache.types import InMemoryLayerReader

BF16_UNITS = torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
needs_bf16_units = pytest.mark.skipif(not BF16_UNITS, reason="this CPU has no bf16 units: nothing is packed")


def _engine(model_dir, models_dir, dtype: str, pack: bool):
    from engine.config import EngineSettings
    from engine.engine import Engine

    settings = EngineSettings(model=str(model_dir), device="cpu", dtype=dtype, pack_weights=pack)
    return Engine(settings, models_dir=models_dir)


def test_packing_applies_to_bf16_on_a_cpu_with_bf16_units_only(tiny_model_dir, tmp_path) -> None:
    cpu = torch.device("cpu")
    assert can_pack(cpu, torch.bfloat16) is BF16_UNITS
    assert not can_pack(cpu, torch.float32) and not can_pack(cpu, torch.float16)
    assert not can_pack(torch.device("cuda"), torch.bfloat16)
    fp32 = _engine(tiny_model_dir, tmp_path, "float32", pack=True)
    assert fp32.num_packed_weights == 0 and not fp32.model.weights.layers[0].wqkv.is_mkldnn
    bf16 = _engine(tiny_model_dir, tmp_path, "bfloat16", pack=True)
    num_layers = bf16.config.num_layers
    assert bf16.num_packed_weights == (4 * num_layers if BF16_UNITS else 0)
    assert bf16.model.weights.layers[0].w_down.is_mkldnn is BF16_UNITS
    assert not bf16.model.weights.lm_head.is_mkldnn  # tied to the embedding: never a second copy
    off = _engine(tiny_model_dir, tmp_path, "bfloat16", pack=False)
    assert off.num_packed_weights == 0
    assert off.served_model.num_parameters == bf16.served_model.num_parameters


@needs_bf16_units
@pytest.mark.parametrize("num_rows", [1, 7, 45, 300])
def test_a_packed_weight_gives_plain_f_linear_bit_for_bit(num_rows: int) -> None:
    torch.manual_seed(num_rows)
    weight = (torch.randn(384, 96) * 0.05).to(torch.bfloat16)
    bias = torch.randn(384).to(torch.bfloat16)
    x = torch.randn(1, num_rows, 96).to(torch.bfloat16)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 4096)
    assert torch.equal(packed.to_dense(), weight)
    assert torch.equal(linear(x, packed, bias), F.linear(x, weight, bias))
    assert torch.equal(linear(x, packed), F.linear(x, weight))
    assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))  # plain weights pass through


@needs_bf16_units
def test_every_mode_and_decode_are_bit_identical_packed_or_not(tiny_model_dir, tmp_path) -> None:
    packed = _engine(tiny_model_dir, tmp_path, "bfloat16", pack=True)
    unpacked = _engine(tiny_model_dir, tmp_path, "bfloat16", pack=False)
    chunks = random_chunks([23, 40, 17], seed=3)
    for engine in (packed, unpacked):
        assert engine.fingerprint == packed.fingerprint  # same numerics: stored KV stays valid
    kvs_packed, kvs_plain = packed.precompute_chunks(chunks), unpacked.precompute_chunks(chunks)
    for a, b in zip(kvs_packed, kvs_plain, strict=True):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    layout = packed.prompt.layout(chunks, "who jumps over the lazy dog?")
    blend = BlendConfig(recompute_ratio=0.3, selector="query", score_layers=[1])
    for mode in ("full", "reuse", "blend"):
        results = []
        tokens = []
        for engine in (packed, unpacked):
            source = None if mode == "full" else InMemoryLayerReader(kvs_plain)
            result = engine.prompt_pass(layout, source, mode, blend if mode == "blend" else None)
            results.append(result)
            request = GenerationRequest(
                "t",
                layout,
                source,
                result.mode,
                sampling=SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
            )
            tokens.append([e.token_id for e in engine.answer(request, result) if isinstance(e, TokenEvent)])
        assert torch.equal(results[0].logits, results[1].logits), mode
        assert torch.equal(results[0].selected_positions, results[1].selected_positions), mode
        assert tokens[0] == tokens[1] and len(tokens[0]) == 6, mode
