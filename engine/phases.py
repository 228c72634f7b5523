"""The phases of a request: prefill (prefix, chunks), the blended prompt pass of every mode, decode.

Layout of positions (all absolute, no gaps):

    0 … P-1        prefix (system prompt + template opening), exact KV computed once per engine
    P … P+N-1      context: the retrieved chunks, KV served by a LayerKVSource (K before RoPE)
    P+N … T-1      suffix (question + template close), always computed fresh

Modes differ only in which rows each layer computes fresh; all others keep the cached KV, rotated to
their real positions:

    full     rows 0…T-1 at every layer (no reuse at all)
    prefix   rows after the first chunk (prefix + chunk 1 were computed exactly in this order at ingest)
    reuse    suffix rows only (r = 0)
    blend    every non-prefix row up to the first check layer; at each check layer keep the context
             rows the selector picks (top r·N by KV deviation) plus all suffix rows
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.kv import KVCache
from engine.layers import Transformer
from engine.rope import apply_rope
from engine.selectors import SelectionInput, TokenSelector, make_selector
from engine.threads import SERIAL_MAX_ELEMENTS, serial
from engine.types import (
    BlendConfig,
    BlendResult,
    BlendTimings,
    EngineError,
    Mode,
    PromptLayout,
    RequestCancelled,
)
from kvcache.types import ChunkKV, LayerKVSource

StopCheck = Callable[[], bool]


@dataclass(frozen=True)
class PrefixKV:
    """Exact KV of the shared prefix at positions 0…P-1 (K after RoPE)."""

    token_ids: tuple[int, ...]
    k: torch.Tensor  # (num_layers, kv_heads, P, head_dim)
    v: torch.Tensor  # (num_layers, kv_heads, P, head_dim)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def _ids(tf: Transformer, ids: list[int]) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64, device=tf.device)


def _check(should_stop: StopCheck | None) -> None:
    if should_stop is not None and should_stop():
        raise RequestCancelled("request cancelled")


# ------------------------------------------------------------------------------------------ prefill
@torch.no_grad()
def prefill_prefix(tf: Transformer, prefix_ids: list[int]) -> PrefixKV:
    """KV of the prefix on its own (positions 0…P-1); exact, so it is reused as a true prefix."""
    cfg, n = tf.cfg, len(prefix_ids)
    cache = KVCache.allocate(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max(n, 1), tf.dtype, tf.device)
    if n:
        rows = tf.rows(range(0, n), kv_len=n)
        h = tf.embed(_ids(tf, prefix_ids))[None]  # (1, P, hidden)
        for layer in range(cfg.num_layers):
            h, _, _ = tf.layer(layer, h, rows, cache, kv_only=layer == cfg.num_layers - 1)
    return PrefixKV(token_ids=tuple(prefix_ids), k=cache.k[:, 0, :, :n].clone(), v=cache.v[:, 0, :, :n].clone())


@torch.no_grad()
def prefill_chunks(
    tf: Transformer, prefix: PrefixKV, chunks: list[list[int]], out_dtype: torch.dtype | None = None
) -> list[ChunkKV]:
    """Run prefix + chunk at positions 0…P+L-1 for several chunks at once (padded to the longest)
    and keep each chunk's rows of K before RoPE and V for every layer.

    Padding sits after each chunk's last token, so the causal mask keeps it invisible to real tokens.
    """
    if not chunks or any(len(c) == 0 for c in chunks):
        raise EngineError("prefill_chunks needs non-empty chunks")
    cfg, p = tf.cfg, prefix.num_tokens
    bsz, longest = len(chunks), max(len(c) for c in chunks)
    out_dtype = out_dtype or tf.dtype
    cache = KVCache.allocate(
        cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, p + longest, tf.dtype, tf.device, batch=bsz
    )
    cache.k[:, :, :, :p] = prefix.k[:, None]
    cache.v[:, :, :, :p] = prefix.v[:, None]
    ids = torch.zeros(bsz, longest, dtype=torch.int64, device=tf.device)
    for b, chunk in enumerate(chunks):
        ids[b, : len(chunk)] = _ids(tf, chunk)
    outs = [
        ChunkKV(
            k=torch.empty(cfg.num_layers, cfg.num_kv_heads, len(c), cfg.head_dim, dtype=out_dtype),
            v=torch.empty(cfg.num_layers, cfg.num_kv_heads, len(c), cfg.head_dim, dtype=out_dtype),
        )
        for c in chunks
    ]
    rows = tf.rows(range(p, p + longest), kv_len=p + longest)
    h = tf.embed(ids)  # (B, L, hidden)
    for layer in range(cfg.num_layers):
        h, k_pre, v = tf.layer(layer, h, rows, cache, kv_only=layer == cfg.num_layers - 1)
        for b, chunk in enumerate(chunks):
            outs[b].k[layer] = k_pre[b, :, : len(chunk)]
            outs[b].v[layer] = v[b, :, : len(chunk)]
    return outs


# -------------------------------------------------------------------------------------- prompt pass
@dataclass
class _Plan:
    fresh_start: int  # first position computed fresh in the early layers
    reuse_start: int  # context rows reuse_start…reuse_stop-1 are filled from the KV source
    reuse_stop: int


def _plan(mode: Mode, layout: PromptLayout) -> _Plan:
    p, n = layout.num_prefix_tokens, layout.num_context_tokens
    if mode == "full":
        return _Plan(fresh_start=0, reuse_start=p, reuse_stop=p)
    if mode == "prefix":
        first = len(layout.chunk_ids[0]) if layout.chunk_ids else 0
        return _Plan(fresh_start=p + first, reuse_start=p, reuse_stop=p + first)
    if mode == "reuse":
        return _Plan(fresh_start=p + n, reuse_start=p, reuse_stop=p + n)
    return _Plan(fresh_start=p, reuse_start=p, reuse_stop=p + n)  # blend


def _chunk_index(layout: PromptLayout, device: torch.device) -> torch.Tensor:
    """(N,) chunk number of every context token."""
    sizes = torch.tensor([len(c) for c in layout.chunk_ids], dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(len(sizes)), sizes).to(device)


@torch.no_grad()
def blend(
    tf: Transformer,
    layout: PromptLayout,
    kv_source: LayerKVSource | None,
    mode: Mode,
    config: BlendConfig,
    prefix: PrefixKV | None,
    capacity: int,
    should_stop: StopCheck | None = None,
) -> BlendResult:
    """The prompt pass of any mode; returns last-token logits and the working cache decode continues.

    Every mode is a blend with a different plan of fresh rows (see the module docstring); `config` only
    matters in mode `blend`. `capacity` sizes the working cache (prompt + tokens decode will append).
    """
    t0 = time.perf_counter()
    cfg = tf.cfg
    p, n_ctx, total = layout.num_prefix_tokens, layout.num_context_tokens, layout.num_tokens
    if kv_source is None or n_ctx == 0:
        mode = "full" if kv_source is None else mode
    if mode != "full":
        if prefix is None or prefix.token_ids != tuple(layout.prefix_ids):
            raise EngineError("run_prompt needs the PrefixKV of this layout's prefix")
        if kv_source is not None and (kv_source.num_tokens != n_ctx or kv_source.num_layers != cfg.num_layers):
            raise EngineError(
                f"KV source has {kv_source.num_tokens} tokens × {kv_source.num_layers} layers, layout needs "
                f"{n_ctx} × {cfg.num_layers}"
            )
    if mode == "blend" and config.check_layers[-1] >= cfg.num_layers:
        raise EngineError(f"check layer {config.check_layers[-1]} ≥ num_layers {cfg.num_layers}")
    plan = _plan(mode, layout)
    num_reused = plan.reuse_stop - plan.reuse_start

    cache = KVCache.allocate(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max(capacity, total), tf.dtype, tf.device)
    if plan.fresh_start > 0:
        cache.k[:, 0, :, :p] = prefix.k  # type: ignore[union-attr]
        cache.v[:, 0, :, :p] = prefix.v  # type: ignore[union-attr]
    all_ids = _ids(tf, layout.all_ids())
    rows = tf.rows(range(plan.fresh_start, total), kv_len=total)
    h = tf.embed(all_ids[plan.fresh_start :])[None]  # (1, rows, hidden)

    # Cached context rows are rotated to their real positions with one cos/sin lookup for all layers.
    reuse_cos, reuse_sin = tf.rope.at(slice(plan.reuse_start, plan.reuse_stop))
    check_at = dict(zip(config.check_layers, config.ratios(), strict=True)) if mode == "blend" else {}
    last_check = max(check_at) if check_at else -1
    selector = make_selector(config.selector, config.seed) if mode == "blend" else None
    chunk_index = _chunk_index(layout, tf.device) if mode == "blend" else None
    kv_wait = early = 0.0
    small_fill = tf.device.type == "cpu" and cfg.num_kv_heads * n_ctx * cfg.head_dim <= SERIAL_MAX_ELEMENTS
    # Until the first check layer every context row is fresh: the cached KV only serves the deviation.
    all_rows_fresh = mode == "blend"

    for layer in range(cfg.num_layers):
        _check(should_stop)
        t_layer = time.perf_counter()
        cached_k = cached_v = None
        if num_reused:
            with serial(small_fill):
                t = time.perf_counter()
                cached_k, cached_v = kv_source.layer(layer)  # type: ignore[union-attr]  # (kv_heads, N, D) each
                cached_k = cached_k.to(tf.device, tf.dtype)
                cached_v = cached_v.to(tf.device, tf.dtype)
                kv_wait += time.perf_counter() - t
                if not all_rows_fresh:
                    span = slice(plan.reuse_start, plan.reuse_stop)
                    apply_rope(cached_k[:, :num_reused], reuse_cos, reuse_sin, out=cache.k[layer, 0, :, span])
                    cache.v[layer, 0, :, span] = cached_v[:, :num_reused]
        if layer not in check_at:
            h, _, _ = tf.layer(layer, h, rows, cache)
        else:
            # Check layer: K/V of every current row are computed (and kept: they are fresh), then only
            # the rows that stay selected go through attention and the MLP, since the hidden states of
            # the others are never used again.
            q, k_pre, v = tf.project_qkv(layer, h, rows, cache)
            with serial(tf.device.type == "cpu"):
                keep = _select(
                    layer,
                    check_at[layer],
                    selector,
                    rows.positions,
                    chunk_index,  # type: ignore[arg-type]
                    k_pre if config.deviation_on == "k" else v,
                    cached_k if config.deviation_on == "k" else cached_v,
                    p,
                    n_ctx,
                )
                if keep is not None:
                    h, q = h[:, keep], q[:, :, keep]
                    rows = tf.rows(rows.positions[keep], kv_len=total)
            h = tf.attend_and_mlp(layer, h, q, rows, cache)
            all_rows_fresh = all_rows_fresh and keep is None
        if layer <= last_check:
            early += time.perf_counter() - t_layer

    logits = tf.logits(h[0, -1])  # the last row is always the last suffix token
    is_ctx = (rows.positions >= p) & (rows.positions < p + n_ctx)
    selected = rows.positions[is_ctx].cpu()
    total_s = time.perf_counter() - t0
    return BlendResult(
        logits=logits,
        cache=_with_length(cache, total),
        mode=mode,
        num_prompt_tokens=total,
        num_context_tokens=n_ctx,
        num_recomputed_tokens=int(selected.numel()),
        selected_positions=selected,
        timings=BlendTimings(total_s=total_s, kv_wait_s=kv_wait, early_layers_s=early, late_layers_s=total_s - early),
    )


def _with_length(cache: KVCache, length: int) -> KVCache:
    cache.length = length
    return cache


def _select(
    layer: int,
    ratio: float,
    selector: TokenSelector,
    positions: torch.Tensor,
    chunk_index: torch.Tensor,
    fresh: torch.Tensor,
    cached: torch.Tensor | None,
    p: int,
    n_ctx: int,
) -> torch.Tensor | None:
    """Row indices (into the current rows) that stay fresh after this check layer; None keeps all."""
    is_ctx = (positions >= p) & (positions < p + n_ctx)
    ctx_idx = torch.nonzero(is_ctx).squeeze(1)  # candidates: the context rows still being recomputed
    num_keep = min(ctx_idx.numel(), int(math.floor(ratio * n_ctx + 0.5)))
    if num_keep == ctx_idx.numel():
        return None
    other_idx = torch.nonzero(~is_ctx).squeeze(1)  # suffix rows: always kept
    ctx_pos = positions[ctx_idx]
    assert cached is not None
    inp = SelectionInput(
        layer=layer,
        positions=ctx_pos,
        chunk_index=chunk_index[ctx_pos - p],
        fresh=fresh[0][:, ctx_idx],
        cached=cached[:, ctx_pos - p],
        num_keep=num_keep,
    )
    kept = ctx_idx[selector.select(inp)]
    return torch.cat([kept, other_idx]).sort().values


# ------------------------------------------------------------------------------------------- decode
@torch.no_grad()
def extend(
    tf: Transformer,
    cache: KVCache,
    token_ids: list[int],
    all_logits: bool = False,
    should_stop: StopCheck | None = None,
) -> torch.Tensor:
    """Append tokens after the cache's last position; logits (float32) of the last one, or of all of them.

    Teacher-forced scoring feeds the whole target at once; decode is extend with one token.
    """
    start, n = cache.length, len(token_ids)
    cache.ensure_capacity(start + n)
    rows = tf.rows(range(start, start + n), kv_len=start + n)
    h = tf.embed(_ids(tf, token_ids))[None]  # (1, n, hidden)
    for layer in range(tf.cfg.num_layers):
        if n > 1:
            _check(should_stop)
        h, _, _ = tf.layer(layer, h, rows, cache)
    cache.length = start + n
    return tf.logits(h[0] if all_logits else h[0, -1])


def decode(tf: Transformer, cache: KVCache, token_id: int) -> torch.Tensor:
    """One decode step: feed the last sampled token, get the next-token logits (vocab,) float32."""
    return extend(tf, cache, [token_id])
