"""Gemma 3 (text): embeddings × √hidden, RMSNorms scaling by (1 + weight), q/k norms, a norm after attention and
after the MLP, a GELU-tanh gated MLP, queries scaled by query_pre_attn_scalar^-½, and sliding-window layers with
a RoPE base of their own beside full-attention layers. Checked against transformers' forward on a tiny random
config whose window (8) is far shorter than the prompts, in every row set a prompt pass uses and in decode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from enginetest_tiny import (
    assert_blend_at_ratio_one_is_full,
    build_model,
    dense_attention,
    engine_logits,
    hf_logits,
    random_chunks,
)

from engine.batched_decode import decode_batch
from engine.cache_pool import CacheLayout, WorkingCachePool
from engine.config import EngineSettings
from engine.decode_graphs import DecodeGraphs
from engine.engine import Engine
from engine.extend import extend
from engine.layers import Transformer
from engine.model import ModelLoadError, load_model
from engine.models.convert import ConversionError, convert_gguf
from engine.types import BlendConfig
from engine.working_cache import WorkingCache
from kvcache.types import InMemoryLayerReader

ATOL = 1e-4
WINDOW = 8
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(
        tmp_path_factory.mktemp("gemma3"),
        "gemma3_text",
        seed=9,
        head_dim=16,
        query_pre_attn_scalar=24,  # not head_dim: the scaling is the config's, not SDPA's default
        sliding_window=WINDOW,
        layer_types=LAYER_TYPES,
        rope_parameters={
            # Gemma 3 4B and larger scale their full layers' RoPE linearly (×8); the sliding layers' is plain.
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        tie_word_embeddings=True,
    )


@pytest.fixture(scope="module")
def gemma3_engine(gemma3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    settings = EngineSettings(model=str(gemma3_dir), device="cpu", dtype="float32")
    return Engine(settings, models_dir=tmp_path_factory.mktemp("models"))


def test_the_checkpoint_loads_as_gemma3(gemma3_dir: Path) -> None:
    model = load_model(gemma3_dir, "float32", "cpu")
    cfg = model.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        "gemma3_text",
        64,
        4,
        2,
        16,
    )
    assert (cfg.activation, cfg.embed_scale, cfg.attn_scale) == ("gelu_tanh", 8.0, 24**-0.5)
    assert cfg.layer_windows == (WINDOW, WINDOW, None, WINDOW) and cfg.sliding_window == WINDOW
    layer = model.weights.layers[0]
    assert layer.q_norm is not None and layer.k_norm is not None and layer.q_norm.shape == (16,)
    assert layer.post_attn_norm is not None and layer.post_mlp_norm is not None
    from safetensors.torch import load_file

    stored = load_file(str(gemma3_dir / "model.safetensors"))
    # The layers multiply by 1 + w: Gemma's checkpoints store w.
    assert torch.equal(layer.attn_norm, stored["model.layers.0.input_layernorm.weight"] + 1)
    assert torch.equal(layer.mlp_norm, stored["model.layers.0.pre_feedforward_layernorm.weight"] + 1)
    assert torch.equal(layer.post_attn_norm, stored["model.layers.0.post_attention_layernorm.weight"] + 1)
    assert model.weights.lm_head is model.weights.embed  # tied, and unscaled: only the input is × √hidden
    tf = Transformer(model)
    assert tf.rope_local is not None and tf.layer_rope(0) is tf.rope_local and tf.layer_rope(2) is tf.rope
    assert torch.allclose(tf.rope.inv_freq[1], torch.tensor(1_000_000.0 ** (-2 / 16) / 4))
    assert torch.allclose(tf.rope_local.inv_freq[1], torch.tensor(10_000.0 ** (-2 / 16)))


@pytest.mark.parametrize("length", [WINDOW - 2, WINDOW, WINDOW + 1, 120])
def test_logits_match_transformers(gemma3_dir: Path, length: int) -> None:
    ids = random_chunks([length], seed=3 + length)[0]
    torch.testing.assert_close(engine_logits(gemma3_dir, ids), hf_logits(gemma3_dir, ids), atol=ATOL, rtol=0)


def test_the_window_the_local_rope_and_the_scaling_each_change_the_logits(gemma3_dir: Path, tmp_path: Path) -> None:
    """Each Gemma-specific part is computed: read without it, the same weights answer otherwise."""
    ids = random_chunks([60], seed=4)[0]
    ours = engine_logits(gemma3_dir, ids)
    config = json.loads((gemma3_dir / "config.json").read_text())
    rope = config["rope_parameters"]
    variants = {
        "no window": {"sliding_window": 4096},
        "one rope": {"rope_parameters": rope | {"sliding_attention": rope["full_attention"]}},
        "sdpa scale": {"query_pre_attn_scalar": 16},
    }
    for name, change in variants.items():
        other = tmp_path / name.replace(" ", "-")
        shutil.copytree(gemma3_dir, other)
        (other / "config.json").write_text(json.dumps(config | change))
        assert (engine_logits(other, ids) - ours).abs().max() > 0.05, name


def test_unsupported_gemma_settings_are_refused(gemma3_dir: Path, tmp_path: Path) -> None:
    config = json.loads((gemma3_dir / "config.json").read_text())
    other = tmp_path / "softcapped"
    shutil.copytree(gemma3_dir, other)
    (other / "config.json").write_text(json.dumps(config | {"final_logit_softcapping": 30.0}))
    with pytest.raises(ModelLoadError) as err:
        load_model(other, "float32", "cpu")
    assert str(err.value) == f"{other}: gemma3_text with final_logit_softcapping=30.0 is not supported"


@pytest.mark.parametrize("sync_free", [False, True], ids=["cpu-path", "device-path"])
@pytest.mark.parametrize(
    "cfg",
    [
        BlendConfig(recompute_ratio=1.0, selector="query"),
        BlendConfig(recompute_ratio=1.0, selector="deviation", check_layers=(1,)),
    ],
    ids=["query", "deviation"],
)
def test_blend_ratio_one_equals_full_prefill(gemma3_engine: Engine, cfg: BlendConfig, sync_free: bool) -> None:
    assert_blend_at_ratio_one_is_full(gemma3_engine, cfg, sync_free, ATOL)


def test_a_blend_with_stored_rows_rotates_each_layer_with_its_own_rope(gemma3_engine: Engine) -> None:
    """Mode reuse keeps every context row's stored K, re-rotated per layer: one chunk reused equals full prefill
    (its KV was computed behind the same prefix at the same positions)."""
    chunks = random_chunks([30], seed=12)
    layout = gemma3_engine.prompt.layout(chunks, "who jumps?")
    source = InMemoryLayerReader(gemma3_engine.precompute_chunks(chunks))
    full = gemma3_engine.prompt_pass(layout, None, "full")
    reuse = gemma3_engine.prompt_pass(layout, source, "reuse")
    torch.testing.assert_close(reuse.logits, full.logits, atol=ATOL, rtol=0)
    n = layout.num_tokens
    torch.testing.assert_close(reuse.cache.k[:, :, :, :n], full.cache.k[:, :, :, :n], atol=ATOL, rtol=0)


def test_decode_sees_the_window_in_every_path(gemma3_dir: Path) -> None:
    """Decode past the window: the reference step (extend), the batched step and the static step (what a CUDA
    graph records, run as is on the CPU) each give transformers' logits of the same sequence."""
    tf = Transformer(load_model(gemma3_dir, "float32", "cpu"))
    cfg = tf.cfg
    ids = random_chunks([40], seed=21)[0]
    prompt, fed = ids[:5], ids[5:]
    ref = hf_logits(gemma3_dir, ids)  # (40, vocab)

    def fresh_cache() -> WorkingCache:
        cache = WorkingCache.allocate(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 64, tf.dtype, tf.device)
        extend(tf, cache, prompt)
        return cache

    reference, batched = fresh_cache(), fresh_cache()
    pool = WorkingCachePool(
        CacheLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, tf.dtype, tf.device), 1 << 24, slots=2, scratch=True
    )
    slotted = pool.acquire(64)
    assert slotted.in_slot  # decoded by the static step
    extend(tf, slotted, prompt)
    graphs = DecodeGraphs(capture=False)
    for step, token in enumerate(fed):
        want = ref[len(prompt) + step]
        torch.testing.assert_close(extend(tf, reference, [token]), want, atol=ATOL, rtol=0)
        torch.testing.assert_close(decode_batch(tf, [batched], [token])[0], want, atol=ATOL, rtol=0)
        torch.testing.assert_close(graphs.decode(tf, [slotted], [token], decode_batch)[0], want, atol=ATOL, rtol=0)
    assert reference.length == batched.length == slotted.length == len(ids)


@pytest.mark.parametrize("sync_free", [False, True], ids=["cpu-path", "device-path"])
@pytest.mark.parametrize("biased", [False, True], ids=["plain", "key-bias"])
def test_scattered_rows_see_their_window_only(gemma3_dir: Path, sync_free: bool, biased: bool) -> None:
    """A blend's rows (any ascending subset) in a sliding-window layer attend to keys q - window < k <= q, with
    the config's query scaling (reference: dense math); a full layer's rows to every earlier key."""
    tf = Transformer(load_model(gemma3_dir, "float32", "cpu"))
    tf.sync_free = sync_free
    cfg = tf.cfg
    gen = torch.Generator().manual_seed(0)
    kv_len = 300
    positions = torch.tensor(sorted(torch.randperm(kv_len, generator=gen)[:200].tolist()))
    bias = -torch.rand(kv_len + 10, generator=gen) if biased else None
    rows = tf.rows(positions, kv_len=kv_len, key_bias=bias)
    q = torch.randn(1, cfg.num_heads, positions.numel(), cfg.head_dim, generator=gen)
    k = torch.randn(1, cfg.num_kv_heads, kv_len + 10, cfg.head_dim, generator=gen)
    v = torch.randn(1, cfg.num_kv_heads, kv_len + 10, cfg.head_dim, generator=gen)
    for layer, window in enumerate(cfg.layer_windows):
        seen = tf.layer_rows(layer, rows)
        assert len(seen.blocks) == (1 if sync_free else 4)  # the blocked path on a CPU
        out = tf.attend(q, k, v, seen).transpose(1, 2)  # (1, heads, rows, D)
        ref = dense_attention(q, k, v, positions, kv_len, bias, window=window, scale=cfg.attn_scale)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    if not sync_free:  # keys before a block's first row's window are not read at all
        assert [int(positions[b.rows.start]) for b in tf.layer_rows(0, rows).blocks] == [1, 90, 190, 287]
        assert [b.kv_start for b in tf.layer_rows(0, rows).blocks] == [0, 83, 183, 280]
        assert [b.kv_start for b in tf.layer_rows(2, rows).blocks] == [0, 0, 0, 0]


def test_a_sliding_window_block_keeps_one_masked_call(gemma3_dir: Path) -> None:
    """A sliding-window layer's blocks hide old keys per row: no key range is shared by all rows of a block, so
    they stay one masked call; the model's full layers split."""
    tf = Transformer(load_model(gemma3_dir, "float32", "cpu"))
    windows = tf.cfg.layer_windows
    local, full = windows.index(next(w for w in windows if w is not None)), windows.index(None)
    positions = torch.arange(2, 300, 2)  # blocks of 64 rows from positions 2, 130 and 258
    rows = tf.rows(positions, kv_len=300)
    assert [b.shared_until for b in tf.layer_rows(local, rows).blocks] == [0, 0, 0]
    assert [b.shared_until for b in tf.layer_rows(full, rows).blocks] == [0, 130, 258]


def test_a_gemma3_gguf_with_rope_scaling_is_refused(tmp_path: Path) -> None:
    """transformers' gemma3 GGUF mapping drops rope.scaling: such a file would convert to another model."""
    import gguf

    path = tmp_path / "gemma-3-4b.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    writer.add_rope_scaling_factor(8.0)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConversionError) as err:
        convert_gguf(path, tmp_path / "models" / "gemma", {})
    assert str(err.value) == (
        "gemma-3-4b.gguf: a gemma3 GGUF with RoPE scaling (factor 8) is not supported: transformers' conversion "
        "drops the scaling, which would change every answer"
    )
    assert not (tmp_path / "models").exists()


@pytest.mark.slow
def test_the_catalogues_gemma3_270m_matches_transformers() -> None:
    """The real Gemma 3 270M (the catalogue's packages joined, hash-checked and converted): the engine's logits
    are transformers' on the converted weights over a prompt past its 512-token window, a blend at ratio 1 is its
    full prefill, and it completes a fact."""
    import os

    from transformers import AutoTokenizer

    from engine.models.catalog import CATALOG
    from engine.models.install import part_states
    from engine.models.resolve import ensure_catalog_model

    entry = CATALOG["gemma3-270m"]
    if not all(state.installed for state in part_states(entry)):
        pytest.skip(f"needs the model's packages: {entry.pip_command()}")
    path = ensure_catalog_model(entry, Path(os.environ["BLENDRAG_MODELS_DIR"]))
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = "The Eiffel Tower is in Paris. The capital of France is Paris, and the capital of Italy is"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id == 2
    ours = engine_logits(path, ids)
    assert tokenizer.decode(ours[-1].argmax()) == " Rome"
    long_ids = [ids[0]] + (ids[1:] * 40)[:699]  # 700 tokens: the sliding layers' window (512) cuts in
    ours, sdpa = engine_logits(path, long_ids), hf_logits(path, long_ids)
    torch.testing.assert_close(ours[:512], sdpa[:512], atol=ATOL, rtol=0)
    # Past the window, on this repetitive prompt, float32 rounding alone moves logits by a few 1e-4: transformers'
    # own eager attention is 3.9e-4 from its SDPA there. The engine must be no further from SDPA than that.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        eager = model(torch.tensor([long_ids])).logits[0]
    spread = (eager - sdpa).abs().max().item()
    assert (ours - sdpa).abs().max().item() <= max(ATOL, spread)

    engine = Engine(EngineSettings(model=str(path), device="cpu", dtype="float32"), models_dir=path.parent)
    chunks = [tokenizer(f"Passage {i}: " + text * 12, add_special_tokens=False)["input_ids"] for i in range(3)]
    layout = engine.prompt.layout(chunks, "What is the capital of Italy?")
    assert layout.num_tokens > 600
    source = InMemoryLayerReader(engine.precompute_chunks(chunks))
    full = engine.prompt_pass(layout, None, "full")
    blend = engine.prompt_pass(layout, source, "blend", BlendConfig(recompute_ratio=1.0, selector="query"))
    torch.testing.assert_close(blend.logits, full.logits, atol=ATOL, rtol=0)
