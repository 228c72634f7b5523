"""One decode step for several requests at once, each with its own working cache.

On a CPU a decode step is bound by reading the weights: one token per request costs nearly as much as
eight. So the scheduler feeds the last sampled token of every decoding request through the layers
together: the norms, projections and MLP run on a (B, 1, hidden) batch, and only attention runs per
request, each against its own cache (the caches have different lengths, so nothing is padded).

The arithmetic of each row is the one of `phases.decode` (same functions, same order); only the GEMMs
see B rows instead of one, which may change the last bits of a logit but not the greedy token in the
tests (tests/engine/test_batched_decode.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.layers import Transformer, rms_norm
from engine.rope import apply_rope
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

    h = tf.embed(torch.tensor(token_ids, device=tf.device))[:, None]  # (B, 1, hidden)
    with tf.serial_small(h):
        for idx in range(cfg.num_layers):
            w = tf.w.layers[idx]
            x = rms_norm(h, w.attn_norm, cfg.rms_norm_eps)
            q, k, v = tf.linear(x, w.wqkv, w.bqkv).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
            k = apply_rope(k.view(bsz, 1, kv_heads, d), cos, sin)  # (B, 1, kv_heads, D)
            v = v.view(bsz, 1, kv_heads, d)
            q = apply_rope(q.view(bsz, 1, heads, d), cos, sin).transpose(1, 2)  # (B, heads, 1, D)
            outs = []
            for b, (cache, pos) in enumerate(zip(caches, positions, strict=True)):
                cache.k[idx][0, :, pos] = k[b, 0]
                cache.v[idx][0, :, pos] = v[b, 0]
                with parallel():
                    outs.append(
                        F.scaled_dot_product_attention(
                            q[b : b + 1], cache.k[idx][:, :, : pos + 1], cache.v[idx][:, :, : pos + 1], enable_gqa=gqa
                        )
                    )  # (1, heads, 1, D)
            o = torch.cat(outs).transpose(1, 2).reshape(bsz, 1, heads * d)
            h = h + tf.linear(o, w.wo, w.bo)
            x = rms_norm(h, w.mlp_norm, cfg.rms_norm_eps)
            gate, up = tf.linear(x, w.w_gate_up, w.b_gate_up).chunk(2, dim=-1)
            h = h + tf.linear(F.silu(gate) * up, w.w_down, w.b_down)
    for cache in caches:
        cache.length += 1
    return tf.logits(h[:, 0])
