"""Precompute: the prefix's exact KV (once per engine and prefix) and each chunk's stored KV (ingest).

A chunk runs behind the prefix at positions 0…P+L-1, so it gets the same attention sink it will have at
question time; its rows of K before RoPE and V are kept for every layer and re-rotated to their real positions
when a question blends them (engine/stored_context.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.host_sync import ids_on
from engine.layers import Transformer
from engine.types import EngineError
from engine.working_cache import WorkingCache
from kvcache.types import ChunkKV


@dataclass(frozen=True)
class PrefixKV:
    """Exact KV of the shared prefix at positions 0…P-1 (K after RoPE)."""

    token_ids: tuple[int, ...]
    k: torch.Tensor  # (num_layers, kv_heads, P, head_dim)
    v: torch.Tensor  # (num_layers, kv_heads, P, head_dim)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@torch.no_grad()
def precompute_prefix(tf: Transformer, prefix_ids: list[int]) -> PrefixKV:
    """KV of the prefix on its own (positions 0…P-1); exact, so it is reused as a true prefix."""
    cfg, n = tf.cfg, len(prefix_ids)
    cache = WorkingCache.allocate(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max(n, 1), tf.dtype, tf.device)
    if n:
        rows = tf.rows(range(0, n), kv_len=n)
        h = tf.embed(ids_on(prefix_ids, tf.device))[None]  # (1, P, hidden)
        for layer in range(cfg.num_layers):
            h, _, _ = tf.layer(layer, h, rows, cache, kv_only=layer == cfg.num_layers - 1)
    return PrefixKV(token_ids=tuple(prefix_ids), k=cache.k[:, 0, :, :n].clone(), v=cache.v[:, 0, :, :n].clone())


@torch.no_grad()
def precompute_chunks(
    tf: Transformer,
    prefix: PrefixKV,
    chunks: list[list[int]],
    out_dtype: torch.dtype | None = None,
    contexts: list[list[int]] | None = None,
) -> list[ChunkKV]:
    """Run prefix + chunk at positions 0…P+L-1 for several chunks at once (padded to the longest)
    and keep each chunk's rows of K before RoPE and V for every layer.

    With `contexts`, chunk b runs behind prefix + contexts[b] (positions P…P+C_b-1 hold the context) and only
    the chunk's own rows are kept: its KV as if it stood deeper in a prompt, after related text (the
    cross-chunk variant; an empty context gives the plain KV). Padding sits after each sequence's last token,
    so the causal mask keeps it invisible to real tokens.
    """
    if not chunks or any(len(c) == 0 for c in chunks):
        raise EngineError("precompute_chunks needs non-empty chunks")
    if contexts is not None and len(contexts) != len(chunks):
        raise EngineError(f"precompute_chunks: {len(contexts)} contexts for {len(chunks)} chunks")
    offsets = [len(c) for c in contexts] if contexts is not None else [0] * len(chunks)
    if contexts is not None:
        chunks = [[*ctx, *chunk] for ctx, chunk in zip(contexts, chunks, strict=True)]
    cfg, p = tf.cfg, prefix.num_tokens
    bsz, longest = len(chunks), max(len(c) for c in chunks)
    out_dtype = out_dtype or tf.dtype
    cache = WorkingCache.allocate(
        cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, p + longest, tf.dtype, tf.device, batch=bsz
    )
    cache.k[:, :, :, :p] = prefix.k[:, None]
    cache.v[:, :, :, :p] = prefix.v[:, None]
    ids = torch.zeros(bsz, longest, dtype=torch.int64, device=tf.device)
    for b, chunk in enumerate(chunks):
        ids[b, : len(chunk)] = ids_on(chunk, tf.device)
    outs = [
        ChunkKV(
            k=torch.empty(cfg.num_layers, cfg.num_kv_heads, len(c) - skip, cfg.head_dim, dtype=out_dtype),
            v=torch.empty(cfg.num_layers, cfg.num_kv_heads, len(c) - skip, cfg.head_dim, dtype=out_dtype),
        )
        for c, skip in zip(chunks, offsets, strict=True)
    ]
    rows = tf.rows(range(p, p + longest), kv_len=p + longest)
    h = tf.embed(ids)  # (B, L, hidden)
    for layer in range(cfg.num_layers):
        h, k_pre, v = tf.layer(layer, h, rows, cache, kv_only=layer == cfg.num_layers - 1)
        for b, (chunk, skip) in enumerate(zip(chunks, offsets, strict=True)):
            outs[b].k[layer] = k_pre[b, :, skip : len(chunk)]
            outs[b].v[layer] = v[b, :, skip : len(chunk)]
    return outs
