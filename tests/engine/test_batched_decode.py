"""Batched decode: several requests' decode steps in one pass give what one request at a time gives."""

from __future__ import annotations

import asyncio

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.batched_decode import decode_batch
from engine.extend import decode
from engine.scheduler import Scheduler
from engine.types import BlendConfig, FinishEvent, GenerationRequest, SamplingParams, TokenEvent
from kvcache.types import InMemoryLayerReader


def _prompt_caches(engine, n: int):
    """n working caches of different lengths (different chunks and questions), plus their first tokens."""
    caches, tokens = [], []
    for i in range(n):
        chunks = random_chunks([8 + 5 * i, 13 + i], seed=200 + i)
        layout = engine.prompt.layout(chunks, "what is it?" + " really" * i)
        source = InMemoryLayerReader(engine.precompute_chunks(chunks))
        result = engine.prompt_pass(
            layout, source, "blend", BlendConfig(recompute_ratio=0.3), extra_capacity=2
        )  # small: decode must grow some caches
        caches.append(result.cache)
        tokens.append(int(result.logits.argmax()))
    return caches, tokens


def _copy(cache):
    return type(cache)(k=cache.k.clone(), v=cache.v.clone(), length=cache.length)


def test_batched_steps_match_single_steps(tiny_engine) -> None:
    caches, first = _prompt_caches(tiny_engine, 5)
    assert len({c.length for c in caches}) == 5  # really different lengths
    single = [_copy(c) for c in caches]
    batched_tokens, single_tokens = [first], [first]
    for _ in range(6):
        logits = decode_batch(tiny_engine.transformer, caches, batched_tokens[-1])
        pairs = zip(single, single_tokens[-1], strict=True)
        ref = torch.stack([decode(tiny_engine.transformer, c, t) for c, t in pairs])
        assert logits.shape == ref.shape == (5, tiny_engine.config.vocab_size)
        torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
        batched_tokens.append(logits.argmax(-1).tolist())
        single_tokens.append(ref.argmax(-1).tolist())
    assert batched_tokens == single_tokens
    for b, s in zip(caches, single, strict=True):
        assert b.length == s.length
        torch.testing.assert_close(b.k[:, :, :, : b.length], s.k[:, :, :, : s.length], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b.v[:, :, :, : b.length], s.v[:, :, :, : s.length], rtol=1e-4, atol=1e-4)


def test_decode_batch_rejects_mismatched_inputs(tiny_engine) -> None:
    caches, first = _prompt_caches(tiny_engine, 2)
    with pytest.raises(ValueError, match="one token per cache"):
        decode_batch(tiny_engine.transformer, caches, first[:1])


def _request(engine, i: int, mode: str) -> GenerationRequest:
    chunks = random_chunks([10 + 3 * i, 17], seed=300 + i)
    layout = engine.prompt.layout(chunks, f"question {i}?")
    return GenerationRequest(
        f"b{i}",
        layout,
        InMemoryLayerReader(engine.precompute_chunks(chunks)),
        mode,
        BlendConfig(recompute_ratio=0.25),
        SamplingParams(max_tokens=12 + i, ignore_eos=True),  # different lengths: the batch shrinks as they end
    )


async def _collect(stream) -> list:
    return [event async for event in stream]


async def test_eight_concurrent_requests_decode_like_one_at_a_time(tiny_engine) -> None:
    modes = ["blend", "full", "reuse", "prefix"] * 2
    expected = [
        [e.token_id for e in tiny_engine.generate(_request(tiny_engine, i, m)) if isinstance(e, TokenEvent)]
        for i, m in enumerate(modes)
    ]
    async with Scheduler(tiny_engine, max_queue=8, max_running=8) as scheduler:
        streams = [scheduler.submit(_request(tiny_engine, i, m)) for i, m in enumerate(modes)]
        results = await asyncio.wait_for(asyncio.gather(*(_collect(s) for s in streams)), 120)
    for i, events in enumerate(results):
        assert [e.token_id for e in events if isinstance(e, TokenEvent)] == expected[i]
        assert len(expected[i]) == 12 + i
        fin = events[-1]
        assert isinstance(fin, FinishEvent) and fin.finish_reason == "length" and fin.num_completion_tokens == 12 + i
