"""The decode step: the last sampled token of one or more requests through the model, each with its own cache.

On a CPU a decode step is bound by reading the weights: one token per request costs nearly as much as
eight. So every decoding request's token goes through the layers together: the norms, projections and MLP
run on a (B, 1, hidden) batch (with decode's compact weights, engine/decode_weights.py, when the transformer
has them), and only attention runs per request, each against its own cache (the caches have different
lengths, so nothing is padded).

Each layer is `Transformer.qkv`, then a cache write and attention per request, then
`Transformer.output_and_mlp`: the same two halves of the layer body that `Transformer.layer` runs
(engine/layers.py). Only the GEMMs see B rows instead of one, which may change the last bits of a logit
but not the greedy token in the tests (tests/engine/test_batched_decode.py).

Fixed costs are what remains once the weights are small, so the step keeps them few: the query heads of a
KV head attend as rows of that head (`attend_one`: no K/V repeated per query head), every op runs on the
caller's thread team as it is (no switching thread counts per op: ATen runs a one-row element-wise op inline
anyway), and nothing is read back to the host.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.layers import Transformer
from engine.working_cache import WorkingCache


def decode_batch(tf: Transformer, caches: list[WorkingCache], token_ids: list[int]) -> torch.Tensor:
    """Feed token_ids[b] after caches[b]'s last position; next-token logits (B, vocab) float32.

    Each cache grows by one position, exactly as `engine.extend.decode` would grow it. `tf` is the transformer whose
    weights decode reads (`Transformer.decoder`).
    """
    if len(caches) != len(token_ids) or not caches:
        raise ValueError(f"decode_batch needs one token per cache, got {len(token_ids)} for {len(caches)}")
    cfg = tf.cfg
    bsz = len(caches)
    heads, kv_heads, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    positions = [c.length for c in caches]
    for cache in caches:
        cache.ensure_capacity(cache.length + 1)
    on_device = torch.tensor(positions, device=tf.device)
    # Per RoPE table (a sliding-window layer's own, else the model's): (B, 1, 1, D/2), over (B, 1, heads, D).
    rotations: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for rope in {id(tf.layer_rope(idx)): tf.layer_rope(idx) for idx in range(cfg.num_layers)}.values():
        cos, sin = rope.at(on_device, bound=max(positions) + 1)  # (B, D/2) each
        rotations[id(rope)] = (cos[:, None, None], sin[:, None, None])

    # A blend's stale-key bias (WorkingCache.key_bias) holds for every token it decodes: one (keys,) row per
    # request, added to its scores in every layer.
    biases = [None if c.key_bias is None else c.key_bias[: pos + 1] for c, pos in zip(caches, positions, strict=True)]
    h = tf.embed(torch.tensor(token_ids, device=tf.device))[:, None]  # (B, 1, hidden)
    for idx in range(cfg.num_layers):
        window = tf.windows[idx]
        # q (B, 1, heads, D); k (RoPE'd), v (B, 1, kv_heads, D)
        q, _, k, v = tf.qkv(idx, h, *rotations[id(tf.layer_rope(idx))])
        # The query heads that share a KV head are consecutive (HF's repeat_interleave order).
        q = q.view(bsz, kv_heads, heads // kv_heads, d)  # (B, kv_heads, group, D)
        o = torch.empty(bsz, kv_heads, heads // kv_heads, d, dtype=q.dtype, device=q.device)
        for b, (cache, pos, bias) in enumerate(zip(caches, positions, biases, strict=True)):
            cache.k[idx][0, :, pos] = k[b, 0]
            cache.v[idx][0, :, pos] = v[b, 0]
            # A sliding-window layer reads the last `window` keys only: the others are outside the row's window.
            lo = 0 if window is None else max(0, pos + 1 - window)
            keys, values = cache.k[idx][0, :, lo : pos + 1], cache.v[idx][0, :, lo : pos + 1]
            o[b] = attend_one(q[b], keys, values, None if bias is None else bias[lo:], cfg.attn_scale)
        h = tf.output_and_mlp(idx, h, o.view(bsz, 1, heads * d))
    for cache in caches:
        cache.length += 1
    return tf.logits(h[:, 0])


def attend_one(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """One query row per head, q (kv_heads, group, D), against keys/values (kv_heads, T, D), the row's position
    the last key's (it sees every key): → (kv_heads, group, D).

    The query heads that share a KV head attend as `group` rows of that one head: none is masked (each sees
    every key), so SDPA's kernel runs without its GQA path, which repeats K and V for every query head (2.9 ms
    a layer at 3.5k keys in bfloat16 on two cores, against 0.26 ms this way; docs/benchmarks.md, "Decode").
    `bias` (T,), added to every head's scores; `scale`: of q·k (None: head_dim^-½).
    """
    mask = None if bias is None else bias.to(q.dtype)[None, None, None].expand(1, 1, q.shape[1], bias.shape[0])
    return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, scale=scale)[0]
