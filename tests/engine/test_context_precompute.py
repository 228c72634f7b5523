"""A chunk's KV computed behind a context (the cross-chunk variant): the chunk's own rows of prefix + context +
chunk, and, when the context is the chunk that precedes it in the prompt, exactly what full prefill computes for
it, so reusing such KV with nothing recomputed gives full prefill's logits."""

from __future__ import annotations

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.precompute import precompute_chunks
from engine.types import EngineError
from kvcache.types import InMemoryLayerReader

ATOL = 1e-4


@pytest.fixture(scope="module")
def chunks() -> list[list[int]]:
    return random_chunks([23, 40, 17], seed=5)


def test_context_kv_is_the_chunks_rows_of_context_plus_chunk(tiny_engine, chunks) -> None:
    prefix = tiny_engine.prefix_kv()
    a, b, c = chunks
    got = precompute_chunks(tiny_engine.transformer, prefix, [b, c], contexts=[a, []])
    (joined,) = precompute_chunks(tiny_engine.transformer, prefix, [[*a, *b]])
    (plain_c,) = precompute_chunks(tiny_engine.transformer, prefix, [c])
    assert got[0].k.shape == (4, 2, len(b), tiny_engine.head_dim)
    torch.testing.assert_close(got[0].k, joined.k[:, :, len(a) :], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[0].v, joined.v[:, :, len(a) :], atol=1e-5, rtol=0)
    # an empty context is the plain KV, and the other chunk in the batch never sees the first one's context
    torch.testing.assert_close(got[1].k, plain_c.k, atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1].v, plain_c.v, atol=1e-5, rtol=0)
    assert not torch.allclose(got[0].k[1:], precompute_chunks(tiny_engine.transformer, prefix, [b])[0].k[1:])


def test_engine_batches_contexts_like_single_calls(tiny_engine, chunks) -> None:
    a, b, c = chunks
    contexts = [[], a, [*a, *b]]
    batched = tiny_engine.precompute_chunks(chunks, contexts=contexts, max_batch_tokens=64)
    for chunk, context, kv in zip(chunks, contexts, batched, strict=True):
        (alone,) = tiny_engine.precompute_chunks([chunk], contexts=[context])
        assert kv.num_tokens == len(chunk)
        torch.testing.assert_close(kv.k, alone.k, atol=1e-5, rtol=0)
        torch.testing.assert_close(kv.v, alone.v, atol=1e-5, rtol=0)


def test_reuse_of_kv_computed_behind_the_prompts_own_predecessors_is_full_prefill(tiny_engine, chunks) -> None:
    a, b, c = chunks
    layout = tiny_engine.prompt.layout(chunks, "who jumps over the lazy dog?")
    exact = tiny_engine.precompute_chunks(chunks, contexts=[[], a, [*a, *b]])
    full = tiny_engine.prompt_pass(layout, None, "full").logits
    reuse = tiny_engine.prompt_pass(layout, InMemoryLayerReader(exact), "reuse").logits
    torch.testing.assert_close(reuse, full, atol=ATOL, rtol=0)
    plain = tiny_engine.prompt_pass(layout, InMemoryLayerReader(tiny_engine.precompute_chunks(chunks)), "reuse")
    assert not torch.allclose(plain.logits, full, atol=ATOL, rtol=0)  # the plain KV is stale: the test can fail


def test_contexts_must_match_the_chunks(tiny_engine, chunks) -> None:
    with pytest.raises(EngineError, match="2 contexts for 3 chunks"):
        precompute_chunks(tiny_engine.transformer, tiny_engine.prefix_kv(), chunks, contexts=[[], []])
