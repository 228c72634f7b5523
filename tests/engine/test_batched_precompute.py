"""Ingest precomputes several chunks per forward (padded to the longest, behind the shared prefix): each chunk's
KV must be what it gets alone, and no chunk may see another's tokens."""

from __future__ import annotations

import torch

from engine.precompute import precompute_chunks

# Different lengths, so the shorter chunks carry padding after their last token.
CHUNKS = [
    [5, 9, 14, 3, 22, 7, 40, 41, 2, 8, 19],
    [31, 4],
    [12, 12, 6, 90, 33, 17, 25],
    [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73],
]


def test_batched_precompute_equals_one_chunk_at_a_time(tiny_engine) -> None:
    prefix = tiny_engine.prefix_kv()
    batched = precompute_chunks(tiny_engine.transformer, prefix, CHUNKS)
    for chunk, kv in zip(CHUNKS, batched, strict=True):
        (alone,) = precompute_chunks(tiny_engine.transformer, prefix, [chunk])
        assert kv.k.shape == alone.k.shape == (4, 2, len(chunk), tiny_engine.head_dim)
        assert torch.allclose(kv.k, alone.k, rtol=0, atol=1e-5)
        assert torch.allclose(kv.v, alone.v, rtol=0, atol=1e-5)
    # The engine's own batching (sorted by length, by token budget) gives the same per chunk, in order.
    via_engine = tiny_engine.precompute_chunks(CHUNKS, max_batch_tokens=32)
    for kv, ref in zip(via_engine, batched, strict=True):
        assert torch.allclose(kv.k, ref.k, rtol=0, atol=1e-5) and torch.allclose(kv.v, ref.v, rtol=0, atol=1e-5)


def test_no_chunk_attends_to_another_in_the_same_batch(tiny_engine) -> None:
    prefix = tiny_engine.prefix_kv()
    before = precompute_chunks(tiny_engine.transformer, prefix, CHUNKS)
    changed = [list(CHUNKS[0]), *CHUNKS[1:]]
    changed[0][3] = 77  # one token of chunk 0, same length (same shapes, same padding)
    after = precompute_chunks(tiny_engine.transformer, prefix, changed)
    assert not torch.equal(after[0].k[1:, :, 3:], before[0].k[1:, :, 3:])  # chunk 0 itself did change
    assert torch.equal(after[0].k[:, :, :3], before[0].k[:, :, :3])  # its rows before the change did not
    for kv, ref in zip(after[1:], before[1:], strict=True):
        assert torch.equal(kv.k, ref.k) and torch.equal(kv.v, ref.v)
