"""The stored context KV read and rotated one layer ahead holds the same bits as reading each layer on demand."""

from __future__ import annotations

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.rope import apply_rope
from engine.stored_context import StoredContext
from engine.types import BlendConfig
from engine.working_cache import WorkingCache
from kvcache.types import InMemoryLayerReader


@pytest.fixture(scope="module")
def chunks() -> list[list[int]]:
    return random_chunks([21, 33, 18], seed=5)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engine(request, tiny_engine, tiny_model_dir, tmp_path_factory):
    if request.param == "float32":
        return tiny_engine
    from engine.config import EngineSettings
    from engine.engine import Engine

    settings = EngineSettings(model=str(tiny_model_dir), device="cpu", dtype="bfloat16")
    return Engine(settings, models_dir=tmp_path_factory.mktemp("models-bf16"))


class _FailingSource(InMemoryLayerReader):
    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx == 2:
            raise OSError("layer 2 unreadable")
        return super().layer(layer_idx)


def _cache(engine, num_tokens: int) -> WorkingCache:
    c, tf = engine.config, engine.transformer
    cache = WorkingCache.allocate(c.num_layers, c.num_kv_heads, c.head_dim, num_tokens, tf.dtype, tf.device)
    cache.k.zero_()
    cache.v.zero_()
    return cache


def _filled(engine, kvs, overlap: bool, order: list[int], start: int = 7) -> tuple[WorkingCache, StoredContext]:
    n = sum(kv.num_tokens for kv in kvs)
    cache = _cache(engine, start + n + 3)
    stored = StoredContext(engine.transformer, InMemoryLayerReader(kvs), cache, start, start + n, overlap=overlap)
    for layer in order:
        stored.fill(layer)
    return cache, stored


def test_layer_ahead_writes_the_same_bits_as_on_demand(engine, chunks) -> None:
    kvs = engine.precompute_chunks(chunks)
    num_layers = engine.config.num_layers
    # The query selector's order: its scoring layers first, then every layer of the pass (those are no-ops).
    order = [0, 1, 2, *range(num_layers)]
    ahead, stored = _filled(engine, kvs, True, order)
    on_demand, _ = _filled(engine, kvs, False, order)
    assert torch.equal(ahead.k, on_demand.k) and torch.equal(ahead.v, on_demand.v)
    assert stored.num_layers_written == num_layers
    # … and those bits are the stored K rotated to positions 7… and the stored V, every layer.
    source = InMemoryLayerReader(kvs)
    tf, n = engine.transformer, source.num_tokens
    cos, sin = tf.rope.at(slice(7, 7 + n))
    for layer in range(num_layers):
        k, v = source.layer(layer)
        k, v = k.to(tf.dtype), v.to(tf.dtype)
        assert torch.equal(ahead.k[layer, 0, :, 7 : 7 + n], apply_rope(k, cos, sin))
        assert torch.equal(ahead.v[layer, 0, :, 7 : 7 + n], v)
        assert not ahead.k[layer, 0, :, :7].any() and not ahead.k[layer, 0, :, 7 + n :].any()


def test_on_the_cpu_the_stored_kv_is_filled_on_demand_by_default(engine, chunks) -> None:
    # A background thread reading ahead only competes with the compute's OpenMP team for the CPU's cores.
    kvs = engine.precompute_chunks(chunks)
    n = sum(kv.num_tokens for kv in kvs)
    cache = _cache(engine, n + 3)
    source = InMemoryLayerReader(kvs)
    stored = StoredContext(engine.transformer, source, cache, 0, n)
    assert stored.overlap is False
    stored.fill(0)
    assert stored.num_layers_written == 1 and stored._pending is None


def test_a_read_out_of_order_gets_its_own_layer(engine, chunks) -> None:
    # The deviation selector reads the check layer's stored KV itself, with the next layer scheduled or not.
    kvs = engine.precompute_chunks(chunks)
    cache, stored = _filled(engine, kvs, True, [0])  # layer 1 is being read in the background
    expected = InMemoryLayerReader(kvs)
    for layer in (1, 3, 0):
        k, v = stored.read(layer)
        ref_k, ref_v = expected.layer(layer)
        assert torch.equal(k, ref_k.to(k.dtype)) and torch.equal(v, ref_v.to(v.dtype))
    stored.fill(1)  # dropped by the reads above: read again now
    ref_v = expected.layer(1)[1].to(cache.v.dtype)
    assert torch.equal(cache.v[1, 0, :, 7 : 7 + ref_v.shape[1]], ref_v)


def test_a_failed_background_read_is_raised_where_the_layer_is_needed(engine, chunks) -> None:
    kvs = engine.precompute_chunks(chunks)
    n = sum(kv.num_tokens for kv in kvs)
    stored = StoredContext(engine.transformer, _FailingSource(kvs), _cache(engine, n + 9), 7, 7 + n)
    stored.fill(0)
    stored.fill(1)  # schedules layer 2, which fails on the background thread
    with pytest.raises(OSError, match="layer 2 unreadable"):
        stored.fill(2)


def test_blend_at_ratio_one_still_equals_full_prefill(engine, chunks) -> None:
    # End to end through the prompt pass (the scoring pass fills layers 0…ℓ first, the pass the rest).
    layout = engine.prompt.layout(chunks, "what did the fox jump over?")
    full = engine.prompt_pass(layout, None, "full")
    blend = engine.prompt_pass(
        layout,
        InMemoryLayerReader(engine.precompute_chunks(chunks)),
        "blend",
        BlendConfig(recompute_ratio=1.0, selector="query"),
    )
    atol = 1e-4 if engine.transformer.dtype == torch.float32 else 0.1
    torch.testing.assert_close(blend.logits, full.logits, atol=atol, rtol=0)


def test_a_pass_under_inference_mode_reads_ahead_into_its_inference_cache(engine, chunks) -> None:
    # torch.inference_mode is per thread; the cache made under it (bench/passes.py runs the passes so) is
    # an inference tensor the background thread may only write in inference mode too.
    layout = engine.prompt.layout(chunks, "what did the fox jump over?")
    source = InMemoryLayerReader(engine.precompute_chunks(chunks))
    expected = engine.prompt_pass(layout, source, "reuse")
    with torch.inference_mode():
        result = engine.prompt_pass(layout, InMemoryLayerReader(engine.precompute_chunks(chunks)), "reuse")
    assert result.cache.k.is_inference()
    torch.testing.assert_close(result.logits, expected.logits, atol=0, rtol=0)
