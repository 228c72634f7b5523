"""The hand-written layer loop matches transformers' forward pass on every supported architecture."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from enginetest_tiny import ROPE_LINEAR, ROPE_LLAMA3, build_model, engine_logits, hf_logits, random_chunks

from engine.extend import extend
from engine.layers import Transformer
from engine.model import load_model
from engine.working_cache import WorkingCache

VARIANTS = {
    "llama-gqa": ("llama", {}),
    "llama-mha-tied": ("llama", {"num_key_value_heads": 4, "tie_word_embeddings": True}),
    "llama-rope-llama3": ("llama", {"rope_parameters": ROPE_LLAMA3}),
    "llama-rope-linear": ("llama", {"rope_parameters": ROPE_LINEAR}),
    "qwen2-bias": ("qwen2", {}),
    "mistral": ("mistral", {"num_key_value_heads": 1}),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    kind, overrides = VARIANTS[request.param]
    return build_model(tmp_path_factory.mktemp(request.param), kind, seed=1, **overrides)


def test_full_prefill_matches_transformers(variant_dir: Path) -> None:
    ids = random_chunks([150], seed=3)[0]  # > 64 positions: past llama3's original context
    ours = engine_logits(variant_dir, ids)
    ref = hf_logits(variant_dir, ids)
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


def test_qwen2_checkpoint_has_biases(tmp_path_factory: pytest.TempPathFactory) -> None:
    model = load_model(build_model(tmp_path_factory.mktemp("qwen2"), "qwen2"), "float32", "cpu")
    layer = model.weights.layers[0]
    assert layer.bqkv is not None and layer.bqkv.shape == (model.config.q_size + 2 * model.config.kv_size,)
    assert layer.bo is None  # Qwen2: q/k/v biases only


def test_fingerprint_stable_and_weight_sensitive(tiny_model_dir: Path, tmp_path: Path) -> None:
    a = load_model(tiny_model_dir, "float32", "cpu").fingerprint
    assert load_model(tiny_model_dir, "float32", "cpu").fingerprint == a  # same weights, a "restart"
    assert load_model(tiny_model_dir, "bfloat16", "cpu").fingerprint != a  # other dtype
    other = build_model(tmp_path / "other", "llama", seed=7)  # same shapes, other values
    assert load_model(other, "float32", "cpu").fingerprint != a
    assert re.fullmatch(r"[0-9a-f]{64}", a)  # a sha256 hex digest


def test_bfloat16_close_to_float32(tiny_model_dir: Path) -> None:
    ids = random_chunks([40], seed=4)[0]
    tf32 = Transformer(load_model(tiny_model_dir, "float32", "cpu"))
    tf16 = Transformer(load_model(tiny_model_dir, "bfloat16", "cpu"))
    outs = []
    for tf in (tf32, tf16):
        cfg = tf.cfg
        cache = WorkingCache.allocate(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, len(ids), tf.dtype, tf.device)
        outs.append(extend(tf, cache, ids, all_logits=True))
    assert outs[1].dtype == torch.float32  # logits always come back as float32
    p32, p16 = outs[0].softmax(-1), outs[1].softmax(-1)
    assert (p32 - p16).abs().max() < 0.05


@pytest.mark.parametrize("rope", [None, ROPE_LLAMA3, ROPE_LINEAR], ids=["default", "llama3", "linear"])
def test_rope_table_and_rotation_match_transformers(rope) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from engine.rope import RopeTable, apply_rope, rope_inv_freq

    extra = {"rope_parameters": rope} if rope else {}
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, **extra)
    positions = torch.arange(0, 300)
    ref_cos, ref_sin = LlamaRotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), positions[None])
    table = RopeTable(*rope_inv_freq(config, 16), torch.float32, torch.device("cpu"), initial_positions=8)
    cos, sin = table.at(positions)  # grows the table on demand
    torch.testing.assert_close(torch.cat([cos, cos], -1), ref_cos[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.cat([sin, sin], -1), ref_sin[0], atol=1e-6, rtol=0)
    q = torch.randn(1, 300, 4, 16)
    k = torch.randn(1, 300, 2, 16)
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), ref_cos, ref_sin)
    torch.testing.assert_close(apply_rope(q, cos[:, None], sin[:, None]).transpose(1, 2), q_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(apply_rope(k, cos[:, None], sin[:, None]).transpose(1, 2), k_ref, atol=1e-6, rtol=0)
    # Rotating by position p then by q is rotating by p + q: what moving a stored chunk relies on.
    if rope is None:
        c2, s2 = table.at(positions + 100)
        moved = apply_rope(k, c2[:, None], s2[:, None])
        c100, s100 = table.at(torch.full((300,), 100))
        torch.testing.assert_close(
            apply_rope(apply_rope(k, cos[:, None], sin[:, None]), c100[:, None], s100[:, None]),
            moved,
            atol=5e-5,
            rtol=0,
        )  # fp32 angles
