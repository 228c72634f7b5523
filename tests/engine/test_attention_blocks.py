"""A blend's scattered rows attend in blocks; the keys before a block's first row go without a mask and are merged
with the masked rest by their log-sum-exp (engine/layers.py `AttentionBlock.shared_until`)."""

from __future__ import annotations

import pytest
import torch
from enginetest_tiny import dense_attention


def _qkv(cfg, num_rows: int, kv_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # noqa: ANN001
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, cfg.num_heads, num_rows, cfg.head_dim, generator=gen)
    k = torch.randn(1, cfg.num_kv_heads, kv_len + 8, cfg.head_dim, generator=gen)
    v = torch.randn(1, cfg.num_kv_heads, kv_len + 8, cfg.head_dim, generator=gen)
    return q, k, v


def test_blocks_split_at_their_first_row(tiny_engine) -> None:
    """Every block after the first 32 keys attends keys 0…first-1 unmasked and keeps a mask from its first row on,
    laid out as the GQA rows (group · rows); the first block, whose first row comes early, has one masked call."""
    tf = tiny_engine.transformer
    cfg = tf.cfg
    group = cfg.num_heads // cfg.num_kv_heads
    positions = torch.cat([torch.arange(5, 400, 3), torch.arange(560, 600)])  # (172,) scattered, then a suffix
    rows = tf.rows(positions, kv_len=600)
    firsts = [int(positions[b.rows.start]) for b in rows.blocks]
    assert firsts == [5, 197, 389]  # blocks of 64 rows (the minimum)
    assert [b.shared_until for b in rows.blocks] == [0, 197, 389]
    assert [b.kv_len for b in rows.blocks] == [195, 387, 600]
    assert rows.blocks[0].mask is not None and rows.blocks[0].mask.shape == (64, 195)
    assert [tuple(b.mask.shape) for b in rows.blocks[1:]] == [(group * 64, 387 - 197), (group * 44, 600 - 389)]
    assert all(b.shared_bias is None for b in rows.blocks)


@pytest.mark.parametrize("biased", [False, True], ids=["plain", "key-bias"])
def test_split_blocks_equal_dense_attention(tiny_engine, biased: bool) -> None:
    """The merged two-call attention is the dense reference's, with and without a key bias, and no key after a
    row's position reaches it."""
    tf = tiny_engine.transformer
    cfg = tf.cfg
    kv_len = 700
    gen = torch.Generator().manual_seed(5)
    positions = torch.tensor(sorted(torch.randperm(kv_len, generator=gen)[:300].tolist()))
    bias = None
    if biased:
        bias = torch.zeros(kv_len + 8)
        bias[40:500] = -1.5
        bias[positions] = 0.0
    rows = tf.rows(positions, kv_len=kv_len, key_bias=bias)
    assert sum(1 for b in rows.blocks if b.shared_until) == len(rows.blocks) - 1
    if biased:
        split = [b for b in rows.blocks if b.shared_until]
        assert all(torch.equal(b.shared_bias, bias[: b.shared_until]) for b in split)  # type: ignore[arg-type]
    q, k, v = _qkv(cfg, positions.numel(), kv_len, seed=6)
    out = tf.attend(q, k, v, rows).transpose(1, 2)  # (1, heads, rows, D)
    torch.testing.assert_close(out, dense_attention(q, k, v, positions, kv_len, bias), atol=1e-5, rtol=0)
    k2, v2 = k.clone(), v.clone()
    cut = int(positions[200])
    k2[:, :, cut + 1 :], v2[:, :, cut + 1 :] = 50.0, -50.0
    out2 = tf.attend(q, k2, v2, rows).transpose(1, 2)
    torch.testing.assert_close(out2[:, :, :201], out[:, :, :201], atol=1e-6, rtol=0)


def test_a_one_row_block_needs_no_mask(tiny_engine) -> None:
    """A last block of one row (the question's last token) sees every key up to itself: its masked part is the
    one key at its position, with no mask at all; the merge still gives the dense result."""
    tf = tiny_engine.transformer
    cfg = tf.cfg
    positions = torch.cat([torch.arange(0, 128), torch.tensor([299])])  # blocks of 64 rows, then one
    rows = tf.rows(positions, kv_len=300)
    assert [(b.rows.start, b.rows.stop) for b in rows.blocks] == [(0, 64), (64, 128), (128, 129)]
    last = rows.blocks[-1]
    assert (last.shared_until, last.kv_len, last.mask) == (299, 300, None)
    q, k, v = _qkv(cfg, positions.numel(), 300, seed=7)
    out = tf.attend(q, k, v, rows).transpose(1, 2)
    torch.testing.assert_close(out, dense_attention(q, k, v, positions, 300), atol=1e-5, rtol=0)
