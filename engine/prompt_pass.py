"""The prompt pass of every mode: carries out a `BlendPlan` (engine/blend/plan.py) and decides nothing.

1. select   an up-front blend's rows: the scoring pass (query), then the plan's forced rows and the
            selector's pick (engine/blend/select.py); the stale-key bias on the rows left stored
2. layers   the fresh rows through every layer; every other row's K/V comes from the prefix or the store,
            re-rotated to its position (engine/stored_context.py); a check-layer blend narrows its rows at
            the plan's check layers
3. result   the last suffix row's logits and the working cache that decode continues
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.blend.config import BlendConfig
from engine.blend.key_bias import key_bias_tensor
from engine.blend.plan import BlendPlan
from engine.blend.scoring import score_context
from engine.blend.select import choose_upfront, keep_at_check, segment_index
from engine.blend.selectors import TokenSelector, make_selector
from engine.host_sync import ids_on
from engine.layers import Rows, Transformer
from engine.precompute import PrefixKV
from engine.stored_context import StoredContext
from engine.threads import serial
from engine.types import EngineError, PromptLayout, PromptResult, PromptTimings, RequestCancelled
from engine.working_cache import WorkingCache
from kvcache.types import LayerKVReader

if TYPE_CHECKING:
    from engine.cache_pool import WorkingCachePool


@dataclass(frozen=True)
class LayerBoundary:
    """What a prompt pass does at each layer boundary (before every layer, the first included).

    `between_layers()` runs first: the scheduler uses it to give the requests already decoding their next
    step, so one long prompt does not stall every other answer. Then `cancelled()` is asked; True raises
    RequestCancelled, which `Engine.run_prompt` turns into a cancelled finish. Neither is called elsewhere.
    """

    between_layers: Callable[[], None] | None = None
    cancelled: Callable[[], bool] | None = None

    def __call__(self) -> None:
        if self.between_layers is not None:
            self.between_layers()
        if self.cancelled is not None and self.cancelled():
            raise RequestCancelled("request cancelled")


@torch.no_grad()
def prompt_pass(
    tf: Transformer,
    layout: PromptLayout,
    plan: BlendPlan,
    config: BlendConfig,
    kv_reader: LayerKVReader | None,
    prefix: PrefixKV | None,
    capacity: int,
    *,
    boundary: LayerBoundary | None = None,
    cache_pool: WorkingCachePool | None = None,
) -> PromptResult:
    """Carry out `plan` over `layout`: last-token logits and the working cache decode continues.

    `config` is the plan's blend config (the selector's own settings: pooling, score fusion). `kv_reader` serves
    the context's stored KV (None only in mode full); `capacity` sizes the working cache (prompt + decode room);
    `cache_pool`: where the working cache comes from (its size class's, reused; engine/cache_pool.py); None:
    allocated for this pass.
    """
    boundary = boundary or LayerBoundary()
    t0 = time.perf_counter()
    cfg = tf.cfg
    p, n_ctx, total = plan.num_prefix_tokens, plan.num_context_tokens, plan.num_tokens
    if plan.mode != "full":
        _check_reused_kv(layout, plan, kv_reader, prefix, cfg.num_layers)
    selector = make_selector(config) if plan.selector is not None else None

    size = max(capacity, total)
    if cache_pool is not None:
        cache = cache_pool.acquire(size)
    else:
        cache = WorkingCache.allocate(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, size, tf.dtype, tf.device)
    stored = None
    if plan.mode != "full":
        cache.k[:, 0, :, :p] = prefix.k  # type: ignore[union-attr]  # exact: reused as a true prefix
        cache.v[:, 0, :, :p] = prefix.v  # type: ignore[union-attr]
        stored = StoredContext(tf, kv_reader, cache, p, p + plan.num_stored_tokens)  # type: ignore[arg-type]

    try:
        # 1. Select (up-front blend): the context rows that are fresh in every layer.
        fresh: torch.Tensor | range
        if plan.upfront:
            assert selector is not None and stored is not None
            scores = None
            if plan.score_layers:
                scores = score_context(tf, plan, layout.suffix_ids, cache, stored, config, boundary)
            selected = choose_upfront(plan, selector, scores, tf.device)
            if plan.key_bias is not None:
                cache.key_bias = key_bias_tensor(plan.key_bias, selected, cache.capacity, tf.dtype, tf.device)
            fresh = torch.cat([selected, torch.arange(p + n_ctx, total, device=selected.device)])
        else:
            fresh = plan.fresh  # type: ignore[assignment]
        select_s = time.perf_counter() - t0

        # 2. The layer loop over the fresh rows.
        rows = tf.rows(fresh, kv_len=total, key_bias=cache.key_bias)
        h = tf.embed(ids_on(layout.all_ids(), tf.device)[rows.positions])[None]  # (1, rows, hidden)
        first_layer = 0
        if plan.checks:
            h, rows = _check_layers(tf, plan, h, rows, cache, stored, config, selector, boundary)  # type: ignore[arg-type]
            first_layer = plan.checks[-1].layer + 1
            select_s = time.perf_counter() - t0
        for layer in range(first_layer, cfg.num_layers):
            boundary()
            if stored is not None:
                stored.fill(layer)
            h, _, _ = tf.layer(layer, h, rows, cache)
    finally:
        if stored is not None:  # no background read outlives the pass (a cancelled one included)
            stored.wait_for_background()

    # 3. Result. The last row is always the last suffix token. The rows are ascending: the prefix's (full mode
    # only), the recomputed context's, the suffix's; their counts are known here, so the context rows are a slice
    # (on a device, no value is read back).
    logits = tf.logits(h[0, -1])
    first_ctx_row = p if plan.mode == "full" else 0
    num_ctx_rows = rows.num_rows - len(layout.suffix_ids) - first_ctx_row
    cache.length = total
    return PromptResult(
        logits=logits,
        cache=cache,
        mode=plan.mode,
        num_prompt_tokens=total,
        num_context_tokens=n_ctx,
        num_recomputed_tokens=num_ctx_rows,
        selected_positions=rows.positions[first_ctx_row : first_ctx_row + num_ctx_rows],
        selector=plan.selector,
        timings=PromptTimings(
            total_s=time.perf_counter() - t0, kv_wait_s=stored.wait_s if stored else 0.0, select_s=select_s
        ),
    )


def _check_layers(
    tf: Transformer,
    plan: BlendPlan,
    h: torch.Tensor,
    rows: Rows,
    cache: WorkingCache,
    stored: StoredContext,
    config: BlendConfig,
    selector: TokenSelector,
    boundary: LayerBoundary,
) -> tuple[torch.Tensor, Rows]:
    """Layers 0…last check layer of a check-layer blend (CacheBlend): every non-prefix row is fresh until the
    first check layer; at each check layer the selector keeps the plan's share of the context rows (plus all
    suffix rows) for the layers after it. Returns the hidden states and rows that continue."""
    p, total = plan.num_prefix_tokens, plan.num_tokens
    num_suffix = len(plan.suffix)
    checks = {check.layer: check for check in plan.checks}
    index = segment_index(plan, tf.device)
    all_rows_fresh = True  # until a check layer drops rows, the stored KV only serves the deviation
    num_ctx_rows = plan.num_context_tokens  # the context rows still recomputed (ascending), then the suffix's
    for layer in range(plan.checks[-1].layer + 1):
        boundary()
        if all_rows_fresh or layer in checks:
            stored_k, stored_v = stored.read(layer)
            if not all_rows_fresh:
                stored.write(layer, stored_k, stored_v)
        else:
            stored.fill(layer)
        if layer not in checks:
            h, _, _ = tf.layer(layer, h, rows, cache)
            continue
        # Check layer: K/V of every current row are computed (and kept: they are fresh), then only the rows
        # that stay selected go through attention and the MLP: the others' hidden states are never used.
        q, k_pre, v = tf.project_qkv(layer, h, rows, cache)
        on_k = config.deviation_on == "k"
        with serial(tf.device.type == "cpu"):  # many small ops: one thread (engine/threads.py)
            keep = keep_at_check(
                checks[layer],
                selector,
                rows.positions,
                num_ctx_rows,
                index,
                k_pre if on_k else v,
                stored_k if on_k else stored_v,
                p,
            )
        if keep is not None:
            h, q = h[:, keep], q[:, :, keep]
            rows = tf.rows(rows.positions[keep], kv_len=total)
            num_ctx_rows = keep.shape[0] - num_suffix
            all_rows_fresh = False  # from the next layer on, unselected rows use the stored KV
        h = tf.attend_and_mlp(layer, h, q, rows, cache)
    return h, rows


def _check_reused_kv(
    layout: PromptLayout, plan: BlendPlan, kv_reader: LayerKVReader | None, prefix: PrefixKV | None, num_layers: int
) -> None:
    """The stored KV a mode other than `full` reuses fits the layout: its prefix, then its context."""
    n_ctx = plan.num_context_tokens
    if prefix is None or prefix.token_ids != tuple(layout.prefix_ids):
        raise EngineError("the prompt pass needs the PrefixKV of this layout's prefix")
    if kv_reader is None:
        raise EngineError(f"mode {plan.mode!r} reuses stored KV: the request needs a KV reader (or mode 'full')")
    if kv_reader.num_tokens != n_ctx or kv_reader.num_layers != num_layers:
        raise EngineError(
            f"KV reader has {kv_reader.num_tokens} tokens × {kv_reader.num_layers} layers, layout needs "
            f"{n_ctx} × {num_layers}"
        )
