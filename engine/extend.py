"""Appending tokens to a working cache: teacher-forced scoring, and the reference decode step."""

from __future__ import annotations

import torch

from engine.host_sync import ids_on
from engine.layers import Transformer
from engine.working_cache import WorkingCache


@torch.no_grad()
def extend(
    tf: Transformer,
    cache: WorkingCache,
    token_ids: list[int],
    all_logits: bool = False,
) -> torch.Tensor:
    """Append tokens after the cache's last position; logits (float32) of the last one, or of all of them.

    Teacher-forced scoring feeds the whole target at once; decode is extend with one token.
    """
    start, n = cache.length, len(token_ids)
    cache.ensure_capacity(start + n)
    rows = tf.rows(range(start, start + n), kv_len=start + n, key_bias=cache.key_bias)
    h = tf.embed(ids_on(token_ids, tf.device))[None]  # (1, n, hidden)
    for layer in range(tf.cfg.num_layers):
        h, _, _ = tf.layer(layer, h, rows, cache)
    cache.length = start + n
    return tf.logits(h[0] if all_logits else h[0, -1])


def decode(tf: Transformer, cache: WorkingCache, token_id: int) -> torch.Tensor:
    """One token through the prompt pass's layer path: the next-token logits (vocab,) float32. The engine
    decodes with `batched_decode.decode_batch`; this is the reference its tests compare against (and what
    `bench decode --kernels` times as the step before it)."""
    return extend(tf, cache, [token_id])
