"""The query selector's scoring pass: how much the question attends to each context token before anything is
recomputed (ProphetKV, A³, InfoFlow KV do variants of this)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.blend.config import BlendConfig
from engine.blend.plan import BlendPlan
from engine.host_sync import ids_on
from engine.layers import Transformer
from engine.stored_context import StoredContext
from engine.working_cache import WorkingCache


@torch.no_grad()
def score_context(
    tf: Transformer,
    plan: BlendPlan,
    suffix_ids: list[int],
    cache: WorkingCache,
    stored: StoredContext,
    config: BlendConfig,
    boundary: Callable[[], None] = lambda: None,
) -> torch.Tensor:
    """(N,) float32: the question's attention to each context token over the reused cache.

    The suffix rows alone run through layers 0…ℓ (ℓ = the plan's deepest score layer) over the stored context KV;
    at each score layer the softmax attention of every suffix row is summed over heads and rows for each context
    key, and the layers are fused by `config.score_fuse`. The cache's layers 0…ℓ keep the stored context KV for
    the prompt pass (the suffix rows written here are recomputed there). `boundary()` runs before every layer.
    """
    p, n, total = plan.num_prefix_tokens, plan.num_context_tokens, plan.num_tokens
    score_layers = plan.score_layers
    rows = tf.rows(plan.suffix, kv_len=total)
    h = tf.embed(ids_on(suffix_ids, tf.device))[None]  # (1, S, hidden)
    per_layer = []
    for layer in range(score_layers[-1] + 1):
        boundary()
        stored.fill(layer)
        q, _, _ = tf.project_qkv(layer, h, rows, cache)
        if layer in score_layers:
            probs = tf.attention_probs(q, cache.k[layer], rows, kv_len=total)[0, :, :, p : p + n]  # (heads, S, N)
            if config.score_by == "output":
                # What a key adds to a row's output is its weight times its value: weighting by ‖v‖ is meant
                # to rank low the keys that soak up attention but carry little (separators, articles). On
                # SmolLM2 it changed little (docs/benchmarks.md), so plain attention is the default.
                group = tf.cfg.num_heads // tf.cfg.num_kv_heads
                v_norm = cache.v[layer, 0, :, p : p + n].float().norm(dim=-1)  # (kv_heads, N)
                probs = probs * v_norm.repeat_interleave(group, dim=0)[:, None, :]
            per_layer.append(probs.sum(dim=(0, 1)))  # (N,)
        if layer < score_layers[-1]:
            h = tf.attend_and_mlp(layer, h, q, rows, cache)
    scores = torch.stack(per_layer)  # (num_score_layers, N)
    return scores.mean(0) if config.score_fuse == "mean" else scores.max(0).values
