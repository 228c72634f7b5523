"""Blend invariants on a tiny random Llama: r=1 == full, one chunk r=0 == full, prefix == full, exact
causal mask, re-rotated K == K computed at the target positions, decode continues the blended cache."""

from __future__ import annotations

import pytest
import torch
from enginetest_tiny import dense_attention, random_chunks

from engine.types import BlendConfig, EngineError, GenerationRequest, PromptLayout, SamplingParams, TokenEvent
from kvcache.types import InMemoryLayerReader

ATOL = 1e-4


@pytest.fixture(scope="module")
def chunks() -> list[list[int]]:
    return random_chunks([23, 40, 17, 31], seed=11)


@pytest.fixture(scope="module")
def layout(tiny_engine, chunks) -> PromptLayout:
    return tiny_engine.prompt.layout(chunks, "who jumps over the lazy dog?")


@pytest.fixture(scope="module")
def chunk_kvs(tiny_engine, chunks):
    return tiny_engine.precompute_chunks(chunks)


def _source(kvs):
    return InMemoryLayerReader(kvs)


def _full(engine, layout):
    return engine.prompt_pass(layout, None, "full")


def test_full_matches_transformers(tiny_engine, tiny_model_dir, layout) -> None:
    from enginetest_tiny import hf_logits

    ref = hf_logits(tiny_model_dir, layout.all_ids())[-1]
    torch.testing.assert_close(_full(tiny_engine, layout).logits, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "cfg",
    [
        BlendConfig(recompute_ratio=1.0, selector="query"),
        BlendConfig(
            recompute_ratio=1.0, selector="query", score_layers=(0, 2), score_fuse="max", pool_window=3, min_per_chunk=2
        ),
        BlendConfig(recompute_ratio=1.0, selector="first_k"),
        BlendConfig(recompute_ratio=1.0, selector="random"),
        BlendConfig(recompute_ratio=1.0, selector="deviation", check_layers=(1,)),
        BlendConfig(recompute_ratio=1.0, selector="deviation", check_layers=(0,)),
        BlendConfig(recompute_ratio=1.0, selector="deviation", check_layers=(1, 2), ratio_schedule=(1.0, 1.0)),
    ],
    ids=["query", "query-options", "first_k", "random", "deviation-c1", "deviation-c0", "deviation-c12"],
)
def test_blend_ratio_one_equals_full(tiny_engine, layout, chunk_kvs, cfg) -> None:
    full = _full(tiny_engine, layout)
    blend = tiny_engine.prompt_pass(layout, _source(chunk_kvs), "blend", cfg)
    torch.testing.assert_close(blend.logits, full.logits, atol=ATOL, rtol=0)
    # The whole working cache, not just the logits, is the full prefill's.
    n = layout.num_tokens
    torch.testing.assert_close(blend.cache.k[:, :, :, :n], full.cache.k[:, :, :, :n], atol=ATOL, rtol=0)
    torch.testing.assert_close(blend.cache.v[:, :, :, :n], full.cache.v[:, :, :, :n], atol=ATOL, rtol=0)
    assert blend.num_recomputed_tokens == layout.num_context_tokens and blend.recompute_ratio == 1.0


def test_blend_partial_is_neither_full_nor_reuse(tiny_engine, layout, chunk_kvs) -> None:
    full = _full(tiny_engine, layout).logits
    reuse = tiny_engine.prompt_pass(layout, _source(chunk_kvs), "reuse").logits
    half = tiny_engine.prompt_pass(
        layout, _source(chunk_kvs), "blend", BlendConfig(recompute_ratio=0.5, selector="deviation")
    )
    assert (reuse - full).abs().max() > 1e-2  # stale cross-chunk KV matters on this model
    assert half.num_recomputed_tokens == round(0.5 * layout.num_context_tokens)
    # Recomputing half the context (the most deviating half) gets closer to full than reusing everything.
    assert (half.logits - full).abs().max() < (reuse - full).abs().max()
    assert torch.all(half.selected_positions[1:] > half.selected_positions[:-1])
    lo, hi = layout.num_prefix_tokens, layout.num_prefix_tokens + layout.num_context_tokens
    assert half.selected_positions.min() >= lo and half.selected_positions.max() < hi


@pytest.mark.parametrize(
    "mode,ratio,selector",
    [
        ("blend", 0.0, "query"),
        ("blend", 0.0, "deviation"),
        ("reuse", 0.0, "query"),
        ("prefix", 0.0, "query"),
        ("blend", 0.3, "query"),
        ("blend", 0.3, "deviation"),
    ],
)
def test_one_chunk_cached_equals_full(tiny_engine, chunks, chunk_kvs, mode, ratio, selector) -> None:
    one = tiny_engine.prompt.layout(chunks[:1], "one chunk only")
    full = _full(tiny_engine, one)
    cfg = BlendConfig(recompute_ratio=ratio, selector=selector)
    got = tiny_engine.prompt_pass(one, _source(chunk_kvs[:1]), mode, cfg)
    torch.testing.assert_close(got.logits, full.logits, atol=ATOL, rtol=0)


def test_prefix_mode_equals_full(tiny_engine, layout, chunks, chunk_kvs) -> None:
    got = tiny_engine.prompt_pass(layout, _source(chunk_kvs), "prefix")
    torch.testing.assert_close(got.logits, _full(tiny_engine, layout).logits, atol=ATOL, rtol=0)
    assert got.num_recomputed_tokens == layout.num_context_tokens - len(chunks[0])


def test_a_mode_that_reuses_kv_without_a_reader_is_refused_not_changed(tiny_engine) -> None:
    # The mode is decided once, by the caller (app/services/ask/resolve.py: no chunks → full); the engine never
    # turns one mode into another.
    bare = tiny_engine.prompt.layout([], "no documents at all")
    full = _full(tiny_engine, bare)
    assert full.mode == "full" and full.recompute_ratio == 0.0
    for mode in ("blend", "prefix", "reuse"):
        with pytest.raises(EngineError, match=f"mode '{mode}' reuses stored KV"):
            tiny_engine.prompt_pass(bare, None, mode)


def test_chunk_kv_does_not_depend_on_batching_or_order(tiny_engine, chunks, chunk_kvs) -> None:
    single = [tiny_engine.precompute_chunk(c) for c in reversed(chunks)][::-1]
    for a, b in zip(single, chunk_kvs, strict=True):
        assert a.k.shape == (tiny_engine.num_layers, tiny_engine.num_kv_heads, a.num_tokens, tiny_engine.head_dim)
        torch.testing.assert_close(a.k, b.k, atol=1e-5, rtol=0)
        torch.testing.assert_close(a.v, b.v, atol=1e-5, rtol=0)


def test_chunk_kv_is_prefix_plus_chunk_precompute(tiny_engine, chunks, chunk_kvs) -> None:
    """Pre-RoPE K re-rotated to where it was computed, and V, equal a plain prefill of prefix + chunk."""
    one = PromptLayout(tiny_engine.prompt.prefix_ids, [chunks[1]], [5])
    full = _full(tiny_engine, one)
    p, n = one.num_prefix_tokens, len(chunks[1])
    rot = tiny_engine.transformer.rope
    cos, sin = rot.at(slice(p, p + n))
    from engine.rope import apply_rope

    for layer in range(tiny_engine.num_layers):
        torch.testing.assert_close(
            apply_rope(chunk_kvs[1].k[layer], cos, sin), full.cache.k[layer, 0, :, p : p + n], atol=1e-5, rtol=0
        )
        torch.testing.assert_close(chunk_kvs[1].v[layer], full.cache.v[layer, 0, :, p : p + n], atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ["default", "llama3", "linear"])
def test_rerotated_k_equals_k_at_target_positions(variant, tmp_path_factory) -> None:
    """Chunk 3's stored K (computed at P…P+L-1) rotated to its real place equals K computed there.

    Layer 0's pre-RoPE K depends only on the token itself, so the cache of a `reuse` pass must hold
    exactly what a full prefill computes at those positions, whatever the RoPE scaling."""
    from enginetest_tiny import ROPE_LINEAR, ROPE_LLAMA3, build_model

    from engine.config import EngineSettings
    from engine.engine import Engine

    rope = {"default": {}, "llama3": {"rope_parameters": ROPE_LLAMA3}, "linear": {"rope_parameters": ROPE_LINEAR}}[
        variant
    ]
    path = build_model(tmp_path_factory.mktemp(f"rope-{variant}"), "llama", seed=2, **rope)
    engine = Engine(EngineSettings(model=str(path), device="cpu", dtype="float32"), tmp_path_factory.mktemp("m"))
    chunks = random_chunks([50, 60, 45], seed=5)  # chunk 3 lands past position 64 (llama3's original ctx)
    layout = engine.prompt.layout(chunks, "where?")
    reused = engine.prompt_pass(layout, InMemoryLayerReader(engine.precompute_chunks(chunks)), "reuse")
    full = engine.prompt_pass(layout, None, "full")
    start = layout.num_prefix_tokens + 110
    span = slice(start, start + 45)
    torch.testing.assert_close(reused.cache.k[0, 0, :, span], full.cache.k[0, 0, :, span], atol=1e-5, rtol=0)
    torch.testing.assert_close(reused.cache.v[0, 0, :, span], full.cache.v[0, 0, :, span], atol=1e-5, rtol=0)
    # …and at deeper layers it is stale (computed without chunks 1-2), which is why blending exists.
    assert (reused.cache.v[1, 0, :, span] - full.cache.v[1, 0, :, span]).abs().max() > 1e-3


@pytest.mark.parametrize("selector", ["query", "deviation", "first_k", "random"])
@pytest.mark.parametrize("ratio", [0.3, 1.0])
def test_selected_tokens_never_see_later_tokens(tiny_engine, layout, chunk_kvs, ratio, selector) -> None:
    """Changing the last prompt token changes nothing at any earlier position, in any layer."""
    changed = PromptLayout(layout.prefix_ids, layout.chunk_ids, layout.suffix_ids[:-1] + [7])
    assert changed.suffix_ids != layout.suffix_ids
    cfg = BlendConfig(recompute_ratio=ratio, selector=selector)
    a = tiny_engine.prompt_pass(layout, _source(chunk_kvs), "blend", cfg)
    b = tiny_engine.prompt_pass(changed, _source(chunk_kvs), "blend", cfg)
    assert torch.equal(a.selected_positions, b.selected_positions)
    n = layout.num_tokens - 1
    torch.testing.assert_close(a.cache.k[:, :, :, :n], b.cache.k[:, :, :, :n], atol=1e-6, rtol=0)
    torch.testing.assert_close(a.cache.v[:, :, :, :n], b.cache.v[:, :, :, :n], atol=1e-6, rtol=0)
    assert not torch.allclose(a.logits, b.logits)


def test_attention_mask_uses_absolute_positions(tiny_engine) -> None:
    """Scattered query rows attend exactly to keys at positions <= their own (reference: dense math)."""
    tf = tiny_engine.transformer
    cfg = tf.cfg
    gen = torch.Generator().manual_seed(0)
    kv_len = 300
    positions = torch.tensor(sorted(torch.randperm(kv_len, generator=gen)[:200].tolist()))
    rows = tf.rows(positions, kv_len=kv_len)
    assert len(rows.blocks) > 1  # exercises the blocked path
    q = torch.randn(1, cfg.num_heads, positions.numel(), cfg.head_dim, generator=gen)
    k = torch.randn(1, cfg.num_kv_heads, kv_len + 10, cfg.head_dim, generator=gen)
    v = torch.randn(1, cfg.num_kv_heads, kv_len + 10, cfg.head_dim, generator=gen)
    out = tf.attend(q, k, v, rows).transpose(1, 2)  # (1, heads, rows, D)
    ref = dense_attention(q, k, v, positions, kv_len)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    # Garbage in keys after a row's position must not reach it.
    k2, v2 = k.clone(), v.clone()
    cut = int(positions[60])
    k2[:, :, cut + 1 :] = 100.0
    v2[:, :, cut + 1 :] = -100.0
    out2 = tf.attend(q, k2, v2, rows).transpose(1, 2)
    torch.testing.assert_close(out2[:, :, :61], out[:, :, :61], atol=1e-6, rtol=0)
    assert not torch.allclose(out2[:, :, 61:], out[:, :, 61:])


def _greedy(engine, layout, source, mode, ratio=1.0, max_tokens=12) -> list[int]:
    req = GenerationRequest(
        "g",
        layout,
        source,
        mode,
        BlendConfig(recompute_ratio=ratio),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )
    return [e.token_id for e in engine.generate(req) if isinstance(e, TokenEvent)]


def test_decode_after_blend_continues_blended_cache(tiny_engine, tiny_model_dir, layout, chunk_kvs) -> None:
    full = _greedy(tiny_engine, layout, None, "full")
    assert _greedy(tiny_engine, layout, _source(chunk_kvs), "blend", 1.0) == full
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([layout.all_ids()])
    with torch.no_grad():
        ref = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert full == ref[0, ids.shape[1] :].tolist()
    # With stale KV (r=0) decode continues from that cache, so the answer may differ from full.
    assert len(_greedy(tiny_engine, layout, _source(chunk_kvs), "reuse")) == 12


def test_score_matches_reference_nll(tiny_engine, tiny_model_dir, layout, chunk_kvs) -> None:
    from enginetest_tiny import hf_logits

    target = [40, 41, 42, 43, 44]
    got = tiny_engine.score(layout, None, "full", None, target)
    logits = hf_logits(tiny_model_dir, layout.all_ids() + target)[layout.num_tokens - 1 : -1]
    ref = -torch.log_softmax(logits, -1).gather(1, torch.tensor(target)[:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(got.token_nlls), ref, atol=1e-4, rtol=0)
    blended = tiny_engine.score(layout, _source(chunk_kvs), "blend", BlendConfig(recompute_ratio=1.0), target)
    torch.testing.assert_close(torch.tensor(blended.token_nlls), ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(blended.first_token_logits, got.first_token_logits, atol=ATOL, rtol=0)


def test_source_shape_mismatch_is_an_error(tiny_engine, layout, chunk_kvs) -> None:
    from engine.types import EngineError

    with pytest.raises(EngineError, match="KV reader"):
        tiny_engine.prompt_pass(layout, _source(chunk_kvs[:2]), "blend")


def test_cancel_is_checked_between_layers(tiny_engine, layout, chunk_kvs) -> None:
    from engine.types import RequestCancelled

    calls: list[int] = []

    def stop_on_third_check() -> bool:
        calls.append(1)
        return len(calls) >= 3

    with pytest.raises(RequestCancelled):
        tiny_engine.prompt_pass(layout, _source(chunk_kvs), "blend", cancelled=stop_on_third_check)
    assert len(calls) == 3  # stopped before layer 2 of 4
