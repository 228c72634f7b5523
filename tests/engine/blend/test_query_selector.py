"""The query selector: question-attention scores before the prompt pass, and the up-front blend path."""

from __future__ import annotations

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.blend.scoring import score_context
from engine.blend.selectors import QuerySelector, SelectionInput, num_recompute_tokens
from engine.stored_context import StoredContext
from engine.types import BlendConfig
from engine.working_cache import WorkingCache
from kvcache.types import ChunkKV, InMemoryLayerReader


@pytest.fixture(scope="module")
def chunks() -> list[list[int]]:
    return random_chunks([26, 35, 19], seed=21)


@pytest.fixture(scope="module")
def layout(tiny_engine, chunks):
    return tiny_engine.prompt.layout(chunks, "which code opens the vault?")


@pytest.fixture(scope="module")
def chunk_kvs(tiny_engine, chunks) -> list[ChunkKV]:
    return tiny_engine.precompute_chunks(chunks)


def _scores(engine, layout, kvs, cfg: BlendConfig) -> torch.Tensor:
    tf, c = engine.transformer, engine.config
    cache = WorkingCache.allocate(c.num_layers, c.num_kv_heads, c.head_dim, layout.num_tokens, tf.dtype, tf.device)
    prefix = engine.prefix_kv(layout.prefix_ids)
    cache.k[:, 0, :, : layout.num_prefix_tokens] = prefix.k
    cache.v[:, 0, :, : layout.num_prefix_tokens] = prefix.v
    p, n = layout.num_prefix_tokens, layout.num_context_tokens
    stored = StoredContext(tf, InMemoryLayerReader(kvs), cache, p, p + n)
    return score_context(tf, engine.plan(layout, "blend", cfg), layout.suffix_ids, cache, stored, cfg)


def _inp(scores: list[float], chunk_index: list[int], num_keep: int) -> SelectionInput:
    n = len(scores)
    return SelectionInput(
        positions=torch.arange(5, 5 + n),
        chunk_index=torch.tensor(chunk_index),
        num_keep=num_keep,
        scores=torch.tensor(scores),
    )


def test_budget_rounds_half_up() -> None:
    assert [num_recompute_tokens(r, 75) for r in (0.0, 0.02, 0.05, 0.1, 0.15, 0.3, 1.0)] == [0, 2, 4, 8, 11, 23, 75]
    assert num_recompute_tokens(0.15, 3666) == 550 and num_recompute_tokens(1.0, 0) == 0


def test_query_selector_keeps_top_scores_ties_to_earlier() -> None:
    sel = QuerySelector()
    assert sel.select(_inp([0.1, 0.9, 0.3, 0.9, 0.0, 0.5], [0, 0, 0, 1, 1, 1], 3)).tolist() == [1, 3, 5]
    assert sel.select(_inp([0.2, 0.2, 0.2, 0.2], [0, 0, 1, 1], 2)).tolist() == [0, 1]
    assert sel.select(_inp([0.2, 0.1], [0, 0], 5)).tolist() == [0, 1]


def test_query_selector_pooling_and_per_chunk_minimum() -> None:
    # Max-pooling over 3 neighbours spreads the peak at 2 to 1 and 3; ties then go to the earliest.
    pooled = QuerySelector(pool_window=3).select(_inp([0.0, 0.1, 0.9, 0.1, 0.0, 0.05], [0] * 6, 3))
    assert pooled.tolist() == [1, 2, 3]
    # Chunk 1 is weak everywhere but still gets its best token when every chunk keeps one.
    scores = [0.9, 0.8, 0.7, 0.01, 0.03, 0.02]
    assert QuerySelector().select(_inp(scores, [0, 0, 0, 1, 1, 1], 3)).tolist() == [0, 1, 2]
    assert QuerySelector(min_per_chunk=1).select(_inp(scores, [0, 0, 0, 1, 1, 1], 3)).tolist() == [0, 1, 4]
    # Minimums beyond the budget: the best of the per-chunk picks.
    assert QuerySelector(min_per_chunk=2).select(_inp(scores, [0, 0, 0, 1, 1, 1], 3)).tolist() == [0, 1, 4]


def test_scores_equal_transformers_attention_when_stored_kv_is_exact(tiny_engine, tiny_model_dir, chunks) -> None:
    """With one chunk the stored KV is what full prefill computes, so the scoring pass must see exactly the
    attention weights transformers' own (eager) forward computes for the suffix rows."""
    from transformers import AutoModelForCausalLM

    one = tiny_engine.prompt.layout(chunks[:1], "which code opens the vault?")
    kvs = tiny_engine.precompute_chunks(chunks[:1])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        attn = model.eval()(torch.tensor([one.all_ids()]), output_attentions=True).attentions  # per layer (1,H,T,T)
    p, n = one.num_prefix_tokens, one.num_context_tokens
    for layers in ((1,), (0, 2)):
        expected = torch.stack([attn[layer][0, :, p + n :, p : p + n].sum(dim=(0, 1)) for layer in layers]).mean(0)
        got = _scores(tiny_engine, one, kvs, BlendConfig(score_layers=layers, score_by="attention"))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    fused_max = _scores(tiny_engine, one, kvs, BlendConfig(score_layers=(0, 2), score_fuse="max", score_by="attention"))
    per_layer = torch.stack([attn[layer][0, :, p + n :, p : p + n].sum(dim=(0, 1)) for layer in (0, 2)])
    torch.testing.assert_close(fused_max, per_layer.max(0).values, atol=1e-5, rtol=0)


def test_output_scores_weight_attention_by_value_norm(tiny_engine, tiny_model_dir, chunks) -> None:
    """score_by="output": each key's attention weight times the norm of its value (what it adds to a row)."""
    from transformers import AutoModelForCausalLM

    one = tiny_engine.prompt.layout(chunks[:1], "which code opens the vault?")
    kvs = tiny_engine.precompute_chunks(chunks[:1])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        attn = model.eval()(torch.tensor([one.all_ids()]), output_attentions=True).attentions
    p, n = one.num_prefix_tokens, one.num_context_tokens
    group = tiny_engine.config.num_heads // tiny_engine.num_kv_heads
    v_norm = kvs[0].v[2].norm(dim=-1).repeat_interleave(group, dim=0)  # (heads, N): stored V is exact here
    expected = (attn[2][0, :, p + n :, p : p + n] * v_norm[:, None, :]).sum(dim=(0, 1))
    got = _scores(tiny_engine, one, kvs, BlendConfig(score_layers=(2,), score_by="output"))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_score_layers_beyond_the_model_use_its_last_layer(tiny_engine, layout, chunk_kvs) -> None:
    last = tiny_engine.num_layers - 1
    deep = _scores(tiny_engine, layout, chunk_kvs, BlendConfig(score_layers=(last + 10,)))
    assert torch.equal(deep, _scores(tiny_engine, layout, chunk_kvs, BlendConfig(score_layers=(last,))))


def test_attention_probs_exact_mask(tiny_engine) -> None:
    tf, cfg = tiny_engine.transformer, tiny_engine.config
    gen = torch.Generator().manual_seed(3)
    positions = torch.tensor([3, 9, 10, 40])
    rows = tf.rows(positions, kv_len=41)
    q = torch.randn(1, cfg.num_heads, 4, cfg.head_dim, generator=gen)
    k = torch.randn(1, cfg.num_kv_heads, 50, cfg.head_dim, generator=gen)
    probs = tf.attention_probs(q, k, rows, kv_len=41)
    assert probs.shape == (1, cfg.num_heads, 4, 41)
    later = torch.arange(41)[None, :] > positions[:, None]  # (rows, keys)
    assert torch.all(probs[:, :, later] == 0) and torch.all(probs[:, :, ~later] > 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, cfg.num_heads, 4))


def test_scoring_never_changes_stored_kv(tiny_engine, layout, chunk_kvs) -> None:
    before = [(kv.k.clone(), kv.v.clone()) for kv in chunk_kvs]
    for ratio in (0.1, 0.5):
        tiny_engine.prompt_pass(
            layout, InMemoryLayerReader(chunk_kvs), "blend", BlendConfig(recompute_ratio=ratio, score_layers=(2,))
        )
    for kv, (k, v) in zip(chunk_kvs, before, strict=True):
        assert torch.equal(kv.k, k) and torch.equal(kv.v, v)


def test_query_selection_is_deterministic_and_follows_scores(tiny_engine, layout, chunk_kvs) -> None:
    cfg = BlendConfig(recompute_ratio=0.25, score_layers=(1,))
    a = tiny_engine.prompt_pass(layout, InMemoryLayerReader(chunk_kvs), "blend", cfg)
    b = tiny_engine.prompt_pass(layout, InMemoryLayerReader(chunk_kvs), "blend", cfg)
    assert torch.equal(a.selected_positions, b.selected_positions) and torch.equal(a.logits, b.logits)
    scores = _scores(tiny_engine, layout, chunk_kvs, cfg)
    n_keep = num_recompute_tokens(0.25, layout.num_context_tokens)
    expected = torch.sort(scores, descending=True, stable=True).indices[:n_keep].sort().values
    assert a.selected_positions.tolist() == (expected + layout.num_prefix_tokens).tolist()
    assert a.selector == "query" and a.num_recomputed_tokens == n_keep


def test_upfront_rows_are_fresh_in_every_layer_and_others_stored(tiny_engine, layout, chunk_kvs) -> None:
    """Unselected context rows hold the stored KV (re-rotated) in every layer; selected rows hold fresh KV."""
    from engine.rope import apply_rope

    res = tiny_engine.prompt_pass(
        layout, InMemoryLayerReader(chunk_kvs), "blend", BlendConfig(recompute_ratio=0.3, selector="first_k")
    )
    tf, p, n = tiny_engine.transformer, layout.num_prefix_tokens, layout.num_context_tokens
    cos, sin = tf.rope.at(slice(p, p + n))
    selected = set(res.selected_positions.tolist())
    unselected = torch.tensor([i for i in range(n) if p + i not in selected])
    stored_k = torch.cat([kv.k for kv in chunk_kvs], dim=2)  # (layers, kv_heads, N, D) pre-RoPE
    stored_v = torch.cat([kv.v for kv in chunk_kvs], dim=2)
    for layer in range(tiny_engine.num_layers):
        rotated = apply_rope(stored_k[layer], cos, sin)
        torch.testing.assert_close(res.cache.k[layer, 0, :, p + unselected], rotated[:, unselected], atol=1e-6, rtol=0)
        torch.testing.assert_close(res.cache.v[layer, 0, :, p + unselected], stored_v[layer][:, unselected])
    # Fresh rows differ from the stored KV from layer 1 on (they now see the chunks before them).
    sel = res.selected_positions - p
    late = sel[sel >= len(layout.chunk_ids[0])]
    assert (res.cache.v[1, 0, :, p + late] - stored_v[1][:, late]).abs().max() > 1e-4


def test_adaptive_budget_takes_the_fewest_tokens_holding_the_share() -> None:
    from engine.blend.selectors import adaptive_num_keep

    scores = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])  # sorted: 0.4 0.3 0.15 0.1 0.05 → cumulative 0.4 0.7 0.85 0.95 1
    assert [adaptive_num_keep(scores, share, 0, 5) for share in (0.3, 0.4, 0.5, 0.7, 0.8, 0.9, 1.0)] == [
        1,
        1,
        2,
        2,
        3,
        4,
        5,
    ]
    assert adaptive_num_keep(scores, 0.3, 2, 5) == 2  # clamped up to the minimum
    assert adaptive_num_keep(scores, 1.0, 0, 3) == 3  # and down to the maximum
    assert adaptive_num_keep(torch.zeros(4), 0.5, 1, 3) == 3  # no attention at all: as many as allowed
    assert adaptive_num_keep(torch.zeros(0), 0.5, 1, 3) == 0


def test_adaptive_budget_in_the_prompt_pass(tiny_engine, layout, chunk_kvs) -> None:
    from engine.blend.selectors import adaptive_num_keep

    n = layout.num_context_tokens
    scores = _scores(tiny_engine, layout, chunk_kvs, BlendConfig(recompute_ratio=0.15))
    expected = adaptive_num_keep(scores, 0.5, num_recompute_tokens(0.05, n), num_recompute_tokens(0.6, n))
    assert num_recompute_tokens(0.05, n) < expected < num_recompute_tokens(0.6, n)  # not at a bound
    cfg = BlendConfig(recompute_ratio=0.15, attention_share=0.5, ratio_min=0.05, ratio_max=0.6)
    result = tiny_engine.prompt_pass(layout, InMemoryLayerReader(chunk_kvs), "blend", cfg)
    assert result.num_recomputed_tokens == expected
    # The adaptive pick is the same top-scored set a fixed budget of that size picks.
    p = layout.num_prefix_tokens
    top = QuerySelector().select(_inp(scores.tolist(), [0] * n, expected))
    assert result.selected_positions.tolist() == (top + p).tolist()
    # All of the attention, all tokens allowed: the blend is the full prefill.
    whole = tiny_engine.prompt_pass(
        layout,
        InMemoryLayerReader(chunk_kvs),
        "blend",
        BlendConfig(recompute_ratio=0.15, attention_share=1.0, ratio_max=1.0),
    )
    full = tiny_engine.prompt_pass(layout, None, "full")
    torch.testing.assert_close(whole.logits, full.logits, atol=1e-4, rtol=0)


def test_adaptive_settings_map_and_a_request_ratio_turns_them_off() -> None:
    from engine.config import EngineSettings

    settings = EngineSettings(attention_share=0.6, ratio_min=0.1, ratio_max=0.25)
    cfg = settings.blend_config()
    assert (cfg.attention_share, cfg.ratio_min, cfg.ratio_max) == (0.6, 0.1, 0.25)
    assert settings.blend_config(recompute_ratio=0.2).attention_share is None
    assert EngineSettings().blend_config().attention_share is None  # off by default
    with pytest.raises(ValueError, match="ratio_min <= ratio_max"):
        BlendConfig(recompute_ratio=0.15, attention_share=0.5, ratio_min=0.4, ratio_max=0.2)
    with pytest.raises(ValueError, match="attention_share\n  Input should be greater than 0"):
        BlendConfig(recompute_ratio=0.15, attention_share=0.0)
