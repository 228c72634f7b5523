"""The blend's stale-key bias: which keys get it, that attention adds it exactly (prompt pass and decode,
one request or a batch), and that it changes nothing where no stored key is left (ratio 1, full, reuse)."""

from __future__ import annotations

import pytest
import torch
from enginetest_tiny import dense_attention, random_chunks

from engine.batched_decode import decode_batch
from engine.config import EngineSettings
from engine.extend import decode
from engine.types import BlendConfig, GenerationRequest, SamplingParams, TokenEvent
from engine.working_cache import WorkingCache
from kvcache.types import InMemoryLayerReader

ATOL = 1e-4


@pytest.fixture(scope="module")
def chunks() -> list[list[int]]:
    return random_chunks([23, 40, 17, 31], seed=11)


@pytest.fixture(scope="module")
def layout(tiny_engine, chunks):
    return tiny_engine.prompt.layout(chunks, "who jumps over the lazy dog?")


@pytest.fixture(scope="module")
def chunk_kvs(tiny_engine, chunks):
    return tiny_engine.precompute_chunks(chunks)


def _pass(engine, layout, kvs, config, mode="blend"):
    return engine.prompt_pass(layout, InMemoryLayerReader(kvs), mode, config)


def _greedy(engine, layout, kvs, config, max_tokens=10) -> list[int]:
    source = None if kvs is None else InMemoryLayerReader(kvs)
    mode = "full" if kvs is None else "blend"
    req = GenerationRequest("g", layout, source, mode, config, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return [e.token_id for e in engine.generate(req) if isinstance(e, TokenEvent)]


def test_the_bias_sits_on_the_stored_keys_only(tiny_engine, layout, chunks, chunk_kvs) -> None:
    got = _pass(tiny_engine, layout, chunk_kvs, BlendConfig(recompute_ratio=0.3, stale_key_bias=1.5))
    bias = got.cache.key_bias
    assert bias is not None and bias.numel() == got.cache.capacity and bias.dtype == tiny_engine.dtype
    p, n = layout.num_prefix_tokens, layout.num_context_tokens
    expected = torch.zeros(got.cache.capacity, dtype=bias.dtype)
    # The first chunk was computed behind this very prefix (exact), the selected rows are recomputed.
    expected[p + len(chunks[0]) : p + n] = -1.5
    expected[got.selected_positions] = 0.0
    assert torch.equal(bias.cpu(), expected)
    assert int((bias != 0).sum()) == n - len(chunks[0]) - int((got.selected_positions >= p + len(chunks[0])).sum())


@pytest.mark.parametrize("bias", [0.5, 4.0])
def test_ratio_one_with_a_bias_is_full_prefill(tiny_engine, layout, chunk_kvs, bias) -> None:
    config = BlendConfig(recompute_ratio=1.0, stale_key_bias=bias)
    full = tiny_engine.prompt_pass(layout, None, "full")
    blend = _pass(tiny_engine, layout, chunk_kvs, config)
    torch.testing.assert_close(blend.logits, full.logits, atol=ATOL, rtol=0)
    assert int((blend.cache.key_bias != 0).sum()) == 0  # no stored key is left to bias
    assert _greedy(tiny_engine, layout, chunk_kvs, config) == _greedy(tiny_engine, layout, None, BlendConfig())


def test_no_bias_leaves_the_pass_as_it_was(tiny_engine, layout, chunk_kvs) -> None:
    plain = _pass(tiny_engine, layout, chunk_kvs, BlendConfig(recompute_ratio=0.3))
    zero = _pass(tiny_engine, layout, chunk_kvs, BlendConfig(recompute_ratio=0.3, stale_key_bias=0.0))
    assert plain.cache.key_bias is None and zero.cache.key_bias is None
    assert torch.equal(plain.logits, zero.logits)
    biased = _pass(tiny_engine, layout, chunk_kvs, BlendConfig(recompute_ratio=0.3, stale_key_bias=1.0))
    assert torch.equal(biased.selected_positions, plain.selected_positions)  # the choice is made before it
    assert (biased.logits - plain.logits).abs().max() > 1e-3
    # Only up-front selectors carry it; reuse has no blend config of its own.
    dev = _pass(
        tiny_engine, layout, chunk_kvs, BlendConfig(recompute_ratio=0.3, selector="deviation", stale_key_bias=1.0)
    )
    reuse = _pass(tiny_engine, layout, chunk_kvs, BlendConfig(recompute_ratio=0.3, stale_key_bias=1.0), mode="reuse")
    assert dev.cache.key_bias is None and reuse.cache.key_bias is None


@pytest.mark.parametrize("contiguous", [False, True], ids=["scattered-rows", "causal-block"])
def test_attention_adds_the_bias_exactly(tiny_engine, contiguous) -> None:
    """Against dense math: softmax(q·k/√d + bias, causal) · v, for scattered rows (masked blocks) and for
    contiguous rows that end at the last key (a causal block without a bias, a masked one with it)."""
    tf, cfg = tiny_engine.transformer, tiny_engine.transformer.cfg
    gen = torch.Generator().manual_seed(3)
    kv_len = 120
    if contiguous:
        positions = torch.arange(4, kv_len)
    else:
        positions = torch.tensor(sorted(torch.randperm(kv_len, generator=gen)[:80].tolist()))
    assert any(b.is_causal for b in tf.rows(positions, kv_len=kv_len).blocks) == contiguous
    bias = torch.zeros(kv_len + 8)
    bias[10:70] = -2.0
    rows = tf.rows(positions, kv_len=kv_len, key_bias=bias)
    assert not any(b.is_causal for b in rows.blocks)  # a biased block carries its own mask
    q = torch.randn(1, cfg.num_heads, positions.numel(), cfg.head_dim, generator=gen)
    k = torch.randn(1, cfg.num_kv_heads, kv_len + 8, cfg.head_dim, generator=gen)
    v = torch.randn(1, cfg.num_kv_heads, kv_len + 8, cfg.head_dim, generator=gen)
    out = tf.attend(q, k, v, rows).transpose(1, 2)  # (1, heads, rows, D)
    ref = dense_attention(q, k, v, positions, kv_len, bias)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    plain = tf.attend(q, k, v, tf.rows(positions, kv_len=kv_len)).transpose(1, 2)
    assert not torch.allclose(out, plain, atol=1e-3)


def test_decode_keeps_the_bias_one_request_or_a_batch(tiny_engine) -> None:
    caches, first = [], []
    for i in range(3):
        chunks = random_chunks([9 + 4 * i, 14], seed=300 + i)
        layout = tiny_engine.prompt.layout(chunks, "what is it?" + " really" * i)
        result = tiny_engine.prompt_pass(
            layout,
            InMemoryLayerReader(tiny_engine.precompute_chunks(chunks)),
            "blend",
            BlendConfig(recompute_ratio=0.25, stale_key_bias=2.0 if i != 1 else 0.0),  # one cache without a bias
            extra_capacity=1,  # decode grows the caches (and their bias)
        )
        caches.append(result.cache)
        first.append(int(result.logits.argmax()))
    assert [c.key_bias is None for c in caches] == [False, True, False]
    single = [WorkingCache(k=c.k.clone(), v=c.v.clone(), length=c.length, key_bias=c.key_bias) for c in caches]
    tokens = first
    for _ in range(4):
        batched = decode_batch(tiny_engine.transformer, caches, tokens)
        ref = torch.stack([decode(tiny_engine.transformer, c, t) for c, t in zip(single, tokens, strict=True)])
        torch.testing.assert_close(batched, ref, rtol=1e-4, atol=1e-4)
        tokens = ref.argmax(-1).tolist()
    grown = caches[0]
    assert grown.key_bias is not None and grown.key_bias.numel() == grown.capacity
    assert int((grown.key_bias[grown.length - 4 :] != 0).sum()) == 0  # decoded positions carry no bias
    # Decode over a biased cache is not decode over the same cache without its bias.
    unbiased = WorkingCache(k=grown.k.clone(), v=grown.v.clone(), length=grown.length)
    with_bias = WorkingCache(k=grown.k.clone(), v=grown.v.clone(), length=grown.length, key_bias=grown.key_bias)
    tf = tiny_engine.transformer
    assert (decode(tf, with_bias, tokens[0]) - decode(tf, unbiased, tokens[0])).abs().max() > 1e-4


def test_growing_a_cache_keeps_its_bias_and_zeroes_the_new_room() -> None:
    cache = WorkingCache.allocate(2, 1, 4, 6, torch.float32, torch.device("cpu"))
    cache.key_bias = torch.tensor([0.0, -1.0, -1.0, 0.0, -1.0, 0.0])
    cache.length = 6
    cache.ensure_capacity(9)
    assert cache.capacity == 12
    assert cache.key_bias.tolist() == [0.0, -1.0, -1.0, 0.0, -1.0, 0.0] + [0.0] * 6


@pytest.mark.parametrize("value", [-0.5, 16.5])
def test_a_bias_out_of_range_is_refused(value) -> None:
    with pytest.raises(ValueError, match="stale_key_bias"):
        BlendConfig(stale_key_bias=value)
    with pytest.raises(ValueError, match="stale_key_bias"):
        EngineSettings(stale_key_bias=value)
    assert EngineSettings(stale_key_bias=1.0).blend_config().stale_key_bias == 1.0
