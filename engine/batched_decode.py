"""One decode step for several requests at once, each with its own working cache.

On a CPU a decode step is bound by reading the weights: one token per request costs nearly as much as
eight. So the scheduler feeds the last sampled token of every decoding request through the layers
together: the norms, projections and MLP run on a (B, 1, hidden) batch, and only attention runs per
request, each against its own cache (the caches have different lengths, so nothing is padded).

Each layer is `Transformer.qkv`, then a cache write and attention per request, then
`Transformer.output_and_mlp`: the same two halves of the layer body that `Transformer.layer` runs
(engine/layers.py). Only the GEMMs see B rows instead of one, which may change the last bits of a logit
but not the greedy token in the tests (tests/engine/test_batched_decode.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.layers import Transformer
from engine.threads import parallel
from engine.working_cache import WorkingCache


def decode_batch(tf: Transformer, caches: list[WorkingCache], token_ids: list[int]) -> torch.Tensor:
    """Feed token_ids[b] after caches[b]'s last position; next-token logits (B, vocab) float32.

    Each cache grows by one position, exactly as `phases.decode` would grow it.
    """
    if len(caches) != len(token_ids) or not caches:
        raise ValueError(f"decode_batch needs one token per cache, got {len(token_ids)} for {len(caches)}")
    cfg = tf.cfg
    bsz = len(caches)
    heads, kv_heads, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    gqa = heads != kv_heads
    positions = [c.length for c in caches]
    for cache in caches:
        cache.ensure_capacity(cache.length + 1)
    cos, sin = tf.rope.at(torch.tensor(positions, device=tf.device))  # (B, D/2) each
    cos, sin = cos[:, None, None], sin[:, None, None]  # (B, 1, 1, D/2): broadcasts over (B, 1, heads, D)

    # A blend's stale-key bias (WorkingCache.key_bias) holds for every token it decodes: one view per request,
    # (1, 1, 1, keys), for every layer.
    biases = [
        None if c.key_bias is None else c.key_bias[: pos + 1].to(tf.dtype)[None, None, None]
        for c, pos in zip(caches, positions, strict=True)
    ]
    h = tf.embed(torch.tensor(token_ids, device=tf.device))[:, None]  # (B, 1, hidden)
    with tf.serial_small(h):
        for idx in range(cfg.num_layers):
            q, _, k, v = tf.qkv(idx, h, cos, sin)  # q (B, 1, heads, D); k (RoPE'd), v (B, 1, kv_heads, D)
            q = q.transpose(1, 2)  # (B, heads, 1, D)
            outs = []
            for b, (cache, pos, bias) in enumerate(zip(caches, positions, biases, strict=True)):
                cache.k[idx][0, :, pos] = k[b, 0]
                cache.v[idx][0, :, pos] = v[b, 0]
                with parallel():
                    outs.append(
                        F.scaled_dot_product_attention(
                            q[b : b + 1],
                            cache.k[idx][:, :, : pos + 1],
                            cache.v[idx][:, :, : pos + 1],
                            attn_mask=bias,
                            enable_gqa=gqa,
                        )
                    )  # (1, heads, 1, D)
            o = torch.cat(outs).transpose(1, 2).reshape(bsz, 1, heads * d)
            h = tf.output_and_mlp(idx, h, o)
    for cache in caches:
        cache.length += 1
    return tf.logits(h[:, 0])
