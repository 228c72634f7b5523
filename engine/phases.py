"""The phases of a request: precompute (prefix, chunks), the blended prompt pass of every mode, decode.

Layout of positions (all absolute, no gaps):

    0 … P-1        prefix (system prompt + template opening), exact KV computed once per engine
    P … P+N-1      context: the retrieved chunks, KV served by a LayerKVSource (K before RoPE)
    P+N … T-1      suffix (question + template close), always computed fresh

Modes differ only in which rows each layer computes fresh; all others keep the cached KV, rotated to
their real positions:

    full     rows 0…T-1 at every layer (no reuse at all)
    prefix   rows after the first chunk (prefix + chunk 1 were computed exactly in this order at ingest)
    reuse    suffix rows only (r = 0)
    blend    up-front selectors (query, first_k, random): the r·N context rows the selector picks
             before the pass, plus the suffix rows, in every layer (`query` scores the context by a
             cheap pass of the suffix rows alone first: score_context);
             check-layer selector (deviation): every non-prefix row up to the first check layer; at each
             check layer keep the context rows with the largest KV deviation plus all suffix rows

With an up-front selector and `stale_key_bias` > 0, every row attending over the pass's cache (decode
included) adds −stale_key_bias to its logits at the stored context keys not recomputed (`_stale_key_bias`); with
`stale_key_scope: unnamed`, only at those of the segments the question does not name.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.host_sync import ids_on, to_device
from engine.layers import Rows, Transformer
from engine.selectors import (
    SelectionInput,
    TokenSelector,
    adaptive_num_keep,
    make_selector,
    num_recompute_tokens,
)
from engine.stored_context import StoredContext as _StoredContext
from engine.threads import serial
from engine.types import (
    BlendConfig,
    EngineError,
    Mode,
    PromptLayout,
    PromptResult,
    PromptTimings,
    RequestCancelled,
    StaleKeyScope,
)
from engine.working_cache import WorkingCache
from kvcache.types import ChunkKV, LayerKVSource

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


_NO_BOUNDARY = LayerBoundary()


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
    return ids_on(ids, tf.device)


# --------------------------------------------------------------------------------------- precompute
@torch.no_grad()
def precompute_prefix(tf: Transformer, prefix_ids: list[int]) -> PrefixKV:
    """KV of the prefix on its own (positions 0…P-1); exact, so it is reused as a true prefix."""
    cfg, n = tf.cfg, len(prefix_ids)
    cache = WorkingCache.allocate(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max(n, 1), tf.dtype, tf.device)
    if n:
        rows = tf.rows(range(0, n), kv_len=n)
        h = tf.embed(_ids(tf, prefix_ids))[None]  # (1, P, hidden)
        for layer in range(cfg.num_layers):
            h, _, _ = tf.layer(layer, h, rows, cache, kv_only=layer == cfg.num_layers - 1)
    return PrefixKV(token_ids=tuple(prefix_ids), k=cache.k[:, 0, :, :n].clone(), v=cache.v[:, 0, :, :n].clone())


@torch.no_grad()
def precompute_chunks(
    tf: Transformer, prefix: PrefixKV, chunks: list[list[int]], out_dtype: torch.dtype | None = None
) -> list[ChunkKV]:
    """Run prefix + chunk at positions 0…P+L-1 for several chunks at once (padded to the longest)
    and keep each chunk's rows of K before RoPE and V for every layer.

    Padding sits after each chunk's last token, so the causal mask keeps it invisible to real tokens.
    """
    if not chunks or any(len(c) == 0 for c in chunks):
        raise EngineError("precompute_chunks needs non-empty chunks")
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
def _chunk_index(layout: PromptLayout, device: torch.device) -> torch.Tensor:
    """(N,) chunk number of every context token (built on the host from the layout, copied without a sync)."""
    sizes = torch.tensor([len(c) for c in layout.chunk_ids], dtype=torch.int64)
    index = torch.repeat_interleave(torch.arange(len(sizes)), sizes, output_size=layout.num_context_tokens)
    return to_device(index, device)


@torch.no_grad()
def score_context(
    tf: Transformer,
    layout: PromptLayout,
    cache: WorkingCache,
    stored: _StoredContext,
    config: BlendConfig,
    boundary: LayerBoundary = _NO_BOUNDARY,
) -> torch.Tensor:
    """How much the question attends to each context token, before anything is recomputed: (N,) float32.

    The suffix rows alone run through layers 0…ℓ (ℓ = the deepest score layer) over the stored context
    KV; at each score layer the softmax attention of every suffix row is summed over heads and rows for
    each context key, and the layers are fused by `config.score_fuse`. The cache's layers 0…ℓ keep the
    stored context KV for the prompt pass (the suffix rows written here are recomputed there).
    """
    p, n, total = layout.num_prefix_tokens, layout.num_context_tokens, layout.num_tokens
    score_layers = sorted({min(layer, tf.cfg.num_layers - 1) for layer in config.score_layers})
    rows = tf.rows(range(p + n, total), kv_len=total)
    h = tf.embed(_ids(tf, layout.suffix_ids))[None]  # (1, S, hidden)
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


def _upfront_budget(config: BlendConfig, n_ctx: int, scores: torch.Tensor | None) -> int:
    """Context rows an up-front selector keeps: recompute_ratio · N, or the adaptive budget of `query`."""
    if config.attention_share is None or scores is None:
        return num_recompute_tokens(config.recompute_ratio, n_ctx)
    return adaptive_num_keep(
        scores,
        config.attention_share,
        num_recompute_tokens(config.ratio_min, n_ctx),
        num_recompute_tokens(config.ratio_max, n_ctx),
    )


@dataclass(frozen=True)
class _UpfrontGroup:
    """One budget of an up-front selection, planned on the host from the layout (context offsets 0…N-1)."""

    budget: int  # the rows this group recomputes (the selector's budget, with match_extra's rows)
    forced: list[int]  # the segments' sink tokens kept first (at most `budget`), in priority order
    rest: list[int]  # the group's other tokens, ascending: the selector's candidates
    rest_sizes: list[int]  # how many of `rest` each segment of the group holds, in order


def _plan_group(
    sizes: list[int],
    starts: list[int],
    segments: range,
    budget: int,
    sink_tokens: int,
    matched: set[int],
    extra: int = 0,
) -> _UpfrontGroup:
    """The first `sink_tokens` of every segment are forced (over budget: every segment's first token before any
    segment's second, …), then the `matched` offsets (`_question_matches`) in prompt order; the rest are the
    selector's candidates. `extra` more rows (`match_extra`) go to matched offsets on top of the budget, so the
    selector keeps what they would have taken. Host lists: the layout holds every count."""
    sinks = [(rank, starts[i] + rank) for i in segments for rank in range(min(sink_tokens, sizes[i]))]
    sink_offsets = [offset for _, offset in sorted(sinks)]
    is_sink = set(sink_offsets)
    group_matched = sorted(
        o for i in segments for o in matched if starts[i] <= o < starts[i] + sizes[i] and o not in is_sink
    )
    budget += min(extra, len(group_matched))
    forced = (sink_offsets + group_matched)[:budget]
    taken = is_sink | set(group_matched)
    rest, rest_sizes = [], []
    for i in segments:
        members = [o for o in range(starts[i], starts[i] + sizes[i]) if o not in taken]
        rest.extend(members)
        rest_sizes.append(len(members))
    return _UpfrontGroup(budget=budget, forced=forced, rest=rest, rest_sizes=rest_sizes)


def _named_tokens(layout: PromptLayout) -> set[int]:
    """The question's tokens that stand in some of the retrieved chunks but in at most a third of them.

    In a conversation the latest earlier turn is read as part of the question: a follow-up ("… of that one?")
    names its subject there, not in its own words."""
    chunks = layout.retrieved_chunk_ids
    if not chunks:
        chunks = layout.chunk_ids
    num_segments: Counter[int] = Counter()
    for segment in chunks:
        num_segments.update(set(segment))
    limit = max(1, len(chunks) // 3)
    asked = set(layout.suffix_ids)
    if layout.num_history_segments and layout.retrieved_chunk_ids:
        asked.update(layout.chunk_ids[-1])
    return {t for t in asked if 0 < num_segments[t] <= limit}


def _named_segments(layout: PromptLayout) -> list[int]:
    """The segments holding a token the question names (`_named_tokens`), in prompt order."""
    named = _named_tokens(layout)
    return [i for i, segment in enumerate(layout.chunk_ids) if named.intersection(segment)]


def _singled_out(layout: PromptLayout, named: set[int]) -> set[int]:
    """`match_scope: one`: the one retrieved chunk holding more of the question's named tokens (distinct) than any
    other, with the conversation's earlier turns; no chunk when two or more hold the most (an open question whose
    words stand here and there). A name split into sub-word tokens ("Or" + "mont") shares a piece with other pages
    ("Ul" + "mont"), so a chunk is singled out by holding more of the pieces, not by being the only one with any."""
    num_chunks = len(layout.chunk_ids) - layout.num_history_segments
    held = [len(named.intersection(segment)) for segment in layout.chunk_ids[:num_chunks]]
    history = set(range(num_chunks, len(layout.chunk_ids)))
    if not held:
        return history
    most = max(held)
    if most == 0 or held.count(most) > 1:
        return history
    return {held.index(most)} | history


def _question_matches(
    layout: PromptLayout, window: int, ends: frozenset[int] | None = None, scope: str = "any"
) -> set[int]:
    """Context offsets of the tokens the question names, each with the `window` tokens after it, or, with `ends`
    (`engine.spans.sentence_ends`, `match_span: sentence`), with the tokens after it up to the end of its
    sentence, table row or block (that end included), at most `window` after it.

    A question token "names" something when it stands in some of the prompt's segments but in at most a third of
    them: a project's name, an identifier, a rare word, not a word every page has ("port", "the"). Its
    occurrences are where the answer's value is stated (a value follows the name it belongs to: "project Arbor
    is K56-1950", "| Arbor | 8443 |", "[project.arbor]\nversion = …"). Among similar chunks the stored KV of those
    sentences looks alike in every chunk, so the blend copies from the wrong one; recomputed, the named chunk's
    sentence sees the context as full prefill does (docs/benchmarks.md, "Exact values among similar chunks").
    A sentence span spends nothing past the value's sentence, where a fixed window runs on into the next one.
    With `scope` "one" (`match_scope`) only the chunk the question singles out (`_singled_out`) and the earlier
    turns get spans: spans in several passages of an open question pull its attention to them (nq6).
    """
    if window <= 0 or not layout.chunk_ids:
        return set()
    named = _named_tokens(layout)
    spanned: range | set[int] = range(len(layout.chunk_ids))
    if scope == "one":
        spanned = _singled_out(layout, named)
    sorted_ends = sorted(ends) if ends is not None else []
    offsets: set[int] = set()
    start = 0
    for index, segment in enumerate(layout.chunk_ids):
        for i, token in enumerate(segment):
            if token in named and index in spanned:
                stop = start + min(len(segment), i + 1 + window)  # one past the window, cut at the segment's end
                if ends is not None:
                    at = bisect.bisect_left(sorted_ends, start + i)
                    if at < len(sorted_ends):
                        stop = min(stop, sorted_ends[at] + 1)
                offsets.update(range(start + i, stop))
        start += len(segment)
    return offsets


def _select_upfront(
    selector: TokenSelector,
    layout: PromptLayout,
    config: BlendConfig,
    scores: torch.Tensor | None,
    device: torch.device,
    sentence_ends: frozenset[int] | None = None,
) -> torch.Tensor:
    """Context positions an up-front selector recomputes, ascending.

    The chunks share the budget `_upfront_budget`; with `config.history_ratio` a conversation's earlier turns
    get a budget of their own (that share of their tokens), so a follow-up's turns never compete with six
    chunks for a few rows. In each group the first `config.sink_tokens` of every segment come first (a
    segment's opening was computed behind the prefix alone, the new context changes it most), then the tokens
    the question names with `config.match_window` tokens after each (`_question_matches`; with `match_span:
    sentence`, to the end of the token's sentence in `sentence_ends`, at most that many), and the selector picks the
    rest of the group's budget (sinks beyond the budget: each segment's first token first).

    Every count is planned on the host from the layout, so on a device nothing is read back (only the
    adaptive budget of `config.attention_share` reads the scores' total once).
    """
    p, n = layout.num_prefix_tokens, layout.num_context_tokens
    sizes = [len(c) for c in layout.chunk_ids]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    num_chunks = len(sizes) - layout.num_history_segments
    num_chunk_tokens = n - layout.num_history_tokens
    if config.history_ratio is not None and layout.num_history_segments:
        chunk_scores = None if scores is None else scores[:num_chunk_tokens]
        budgets = [
            (range(num_chunks), _upfront_budget(config, num_chunk_tokens, chunk_scores)),
            (range(num_chunks, len(sizes)), num_recompute_tokens(config.history_ratio, n - num_chunk_tokens)),
        ]
    else:
        budgets = [(range(len(sizes)), _upfront_budget(config, n, scores))]
    chunk_index = _chunk_index(layout, device)
    sentence = config.match_window > 0 and config.match_span == "sentence"
    if sentence and sentence_ends is None:
        raise EngineError("match_span 'sentence' needs the context's sentence ends (Engine.prompt_pass plans them)")
    matched = _question_matches(layout, config.match_window, sentence_ends if sentence else None, config.match_scope)
    forced: list[int] = []
    picked: list[torch.Tensor] = []
    extra = num_recompute_tokens(config.match_extra, n) if matched else 0  # match_extra's rows, over all groups
    for segments, budget in budgets:
        group = _plan_group(sizes, starts, segments, budget, config.sink_tokens, matched, extra)
        extra -= group.budget - budget
        forced.extend(group.forced)
        num_rest = min(group.budget - len(group.forced), len(group.rest))
        if num_rest <= 0:
            continue
        if num_rest == len(group.rest):  # the whole rest fits: nothing to choose
            picked.append(ids_on(group.rest, device))
            continue
        rest = ids_on(group.rest, device)
        chosen = selector.select(
            SelectionInput(
                positions=rest + p,
                chunk_index=chunk_index[rest],
                num_keep=num_rest,
                scores=None if scores is None else scores[rest],
                segment_sizes=tuple(size for size in group.rest_sizes if size),
            )
        )
        picked.append(rest[chosen])
    offsets = torch.cat([ids_on(forced, device), *picked])  # (budget over all groups,)
    return offsets.sort().values + p


def _stale_key_bias(
    layout: PromptLayout,
    selected: torch.Tensor,
    bias: float,
    capacity: int,
    tf: Transformer,
    scope: StaleKeyScope = "all",
) -> torch.Tensor | None:
    """(capacity,) the working cache's key bias: −bias at the context keys that keep their stored KV (not
    recomputed, not in the exact first segment), 0 elsewhere. With `scope` "unnamed" the segments the question
    names (`_named_segments`) keep 0 too, and a question that names none gets no bias (None).

    A stored key was computed behind the prefix alone, as if its segment opened the document; in a prompt of
    several chunks the question pays such keys more attention than it pays the same keys in full prefill
    (SmolLM2 on nq6: the chunk nearest the question 1.7× its share, the exact first chunk half of it), so a
    passage far from the question loses the attention it should get. Recomputed keys are exact and keep 0.
    """
    p, n = layout.num_prefix_tokens, layout.num_context_tokens
    spared: list[int] = []
    if scope == "unnamed":
        # Among similar chunks the stale keys of the other chunks' identical sentences draw 1.5-2x the attention
        # they draw in full prefill, and the answer copies their values; the chunk the question names keeps its.
        spared = _named_segments(layout)
        if not spared:
            return None
    key_bias = torch.zeros(capacity, dtype=tf.dtype, device=tf.device)
    key_bias[p + _exact_first_segment(layout) : p + n] = -bias
    sizes = [len(c) for c in layout.chunk_ids]
    for i in spared:
        start = p + sum(sizes[:i])
        key_bias[start : start + sizes[i]] = 0.0
    key_bias[selected] = 0.0
    return key_bias


def _exact_first_segment(layout: PromptLayout) -> int:
    """Tokens of the first segment whose stored KV is exact here: computed behind this very prefix."""
    return len(layout.chunk_ids[0]) if layout.chunk_ids and layout.segments_behind_prefix else 0


def _fresh_positions(mode: Mode, layout: PromptLayout, selected: torch.Tensor | None) -> torch.Tensor | range:
    """Rows computed fresh from layer 0 on. `selected`: context positions an up-front selector chose."""
    p, n, total = layout.num_prefix_tokens, layout.num_context_tokens, layout.num_tokens
    if mode == "full":
        return range(0, total)
    if mode == "prefix":  # prefix + chunk 1 were computed exactly in this order at ingest
        return range(p + _exact_first_segment(layout), total)
    if mode == "reuse":
        return range(p + n, total)
    if selected is None:  # blend with a check-layer selector: every non-prefix row until the check layer
        return range(p, total)
    suffix = torch.arange(p + n, total, device=selected.device)
    return torch.cat([selected, suffix])


@torch.no_grad()
def prompt_pass(
    tf: Transformer,
    layout: PromptLayout,
    kv_source: LayerKVSource | None,
    mode: Mode,
    config: BlendConfig,
    prefix: PrefixKV | None,
    capacity: int,
    *,
    between_layers: Callable[[], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    sentence_ends: frozenset[int] | None = None,
    cache_pool: WorkingCachePool | None = None,
) -> PromptResult:
    """The prompt pass of any mode; returns last-token logits and the working cache decode continues.

    Every mode computes some rows fresh and keeps the stored KV of the others (module docstring);
    `config` only matters in mode `blend`. `capacity` sizes the working cache (prompt + decode room).
    At every layer boundary `between_layers()` runs, then `cancelled()` is asked (`LayerBoundary`).
    `sentence_ends`: the context offsets ending a sentence (`engine.spans.sentence_ends`), which a blend with
    `match_span: sentence` needs. `cache_pool`: where the working cache comes from (its size class's, reused;
    engine/cache_pool.py); None: allocated for this pass.
    """
    boundary = LayerBoundary(between_layers, cancelled)
    t0 = time.perf_counter()
    cfg = tf.cfg
    p, n_ctx, total = layout.num_prefix_tokens, layout.num_context_tokens, layout.num_tokens
    if kv_source is None or n_ctx == 0:
        mode = "full" if kv_source is None else mode
    if mode != "full":
        _check_reused_kv(layout, kv_source, prefix, cfg.num_layers)
    if mode == "blend" and not config.upfront and config.check_layers[-1] >= cfg.num_layers:
        raise EngineError(f"check layer {config.check_layers[-1]} ≥ num_layers {cfg.num_layers}")
    selector = make_selector(config) if mode == "blend" and n_ctx else None

    if cache_pool is not None:
        cache = cache_pool.acquire(max(capacity, total))
    else:
        cache = WorkingCache.allocate(
            cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max(capacity, total), tf.dtype, tf.device
        )
    stored = None
    if mode != "full":
        cache.k[:, 0, :, :p] = prefix.k  # type: ignore[union-attr]  # exact: reused as a true prefix
        cache.v[:, 0, :, :p] = prefix.v  # type: ignore[union-attr]
        first_chunk = _exact_first_segment(layout)
        stored = _StoredContext(tf, kv_source, cache, p, p + (first_chunk if mode == "prefix" else n_ctx))  # type: ignore[arg-type]

    try:
        # 1. Select (up-front selectors): the context rows that are fresh in every layer.
        selected = None
        if selector is not None and selector.upfront:
            scores = score_context(tf, layout, cache, stored, config, boundary) if selector.name == "query" else None  # type: ignore[arg-type]
            selected = _select_upfront(selector, layout, config, scores, tf.device, sentence_ends)
            if config.stale_key_bias > 0:
                cache.key_bias = _stale_key_bias(
                    layout, selected, config.stale_key_bias, cache.capacity, tf, config.stale_key_scope
                )
        select_s = time.perf_counter() - t0

        # 2. The layer loop over the fresh rows; every other row's K/V comes from the prefix or the store.
        rows = tf.rows(_fresh_positions(mode, layout, selected), kv_len=total, key_bias=cache.key_bias)
        h = tf.embed(_ids(tf, layout.all_ids())[rows.positions])[None]  # (1, rows, hidden)
        first_layer = 0
        if selector is not None and not selector.upfront:
            h, rows = _check_layers(tf, layout, h, rows, cache, stored, config, selector, boundary)  # type: ignore[arg-type]
            first_layer = config.check_layers[-1] + 1
            select_s = time.perf_counter() - t0
        for layer in range(first_layer, cfg.num_layers):
            boundary()
            if stored is not None:
                stored.fill(layer)
            h, _, _ = tf.layer(layer, h, rows, cache)
    finally:
        if stored is not None:  # no background read outlives the pass (a cancelled one included)
            stored.wait_for_background()

    logits = tf.logits(h[0, -1])  # the last row is always the last suffix token
    # The rows are ascending: the prefix's (full mode only), the recomputed context's, the suffix's. Their
    # counts are known here, so the context rows are a slice (on a device, no value is read back).
    first_ctx_row = p if mode == "full" else 0
    num_ctx_rows = rows.num_rows - len(layout.suffix_ids) - first_ctx_row
    selected_positions = rows.positions[first_ctx_row : first_ctx_row + num_ctx_rows]
    cache.length = total
    total_s = time.perf_counter() - t0
    return PromptResult(
        logits=logits,
        cache=cache,
        mode=mode,
        num_prompt_tokens=total,
        num_context_tokens=n_ctx,
        num_recomputed_tokens=num_ctx_rows,
        selected_positions=selected_positions,
        selector=selector.name if selector is not None else None,
        timings=PromptTimings(total_s=total_s, kv_wait_s=stored.wait_s if stored else 0.0, select_s=select_s),
    )


def _check_layers(
    tf: Transformer,
    layout: PromptLayout,
    h: torch.Tensor,
    rows: Rows,
    cache: WorkingCache,
    stored: _StoredContext,
    config: BlendConfig,
    selector: TokenSelector,
    boundary: LayerBoundary,
) -> tuple[torch.Tensor, Rows]:
    """Layers 0…last check layer of a check-layer selector (CacheBlend): every non-prefix row is fresh until
    the first check layer; at each check layer the selector keeps its share of the context rows (plus all
    suffix rows) for the layers after it. Returns the hidden states and rows that continue."""
    p, n_ctx, total = layout.num_prefix_tokens, layout.num_context_tokens, layout.num_tokens
    check_at = dict(zip(config.check_layers, config.ratios(), strict=True))
    chunk_index = _chunk_index(layout, tf.device)
    all_rows_fresh = True  # until a check layer drops rows, the stored KV only serves the deviation
    num_ctx_rows = n_ctx  # the rows are the context rows still recomputed (ascending), then the suffix rows
    for layer in range(config.check_layers[-1] + 1):
        boundary()
        if all_rows_fresh or layer in check_at:
            stored_k, stored_v = stored.read(layer)
            if not all_rows_fresh:
                stored.write(layer, stored_k, stored_v)
        else:
            stored.fill(layer)
        if layer not in check_at:
            h, _, _ = tf.layer(layer, h, rows, cache)
            continue
        # Check layer: K/V of every current row are computed (and kept: they are fresh), then only the rows
        # that stay selected go through attention and the MLP: the others' hidden states are never used.
        q, k_pre, v = tf.project_qkv(layer, h, rows, cache)
        on_k = config.deviation_on == "k"
        with serial(tf.device.type == "cpu"):  # many small ops: one thread (engine/threads.py)
            keep = _select_at_check_layer(
                layer,
                check_at[layer],
                selector,
                rows.positions,
                num_ctx_rows,
                chunk_index,
                k_pre if on_k else v,
                stored_k if on_k else stored_v,
                p,
                n_ctx,
            )
        if keep is not None:
            h, q = h[:, keep], q[:, :, keep]
            rows = tf.rows(rows.positions[keep], kv_len=total)
            num_ctx_rows = keep.shape[0] - len(layout.suffix_ids)
            all_rows_fresh = False  # from the next layer on, unselected rows use the stored KV
        h = tf.attend_and_mlp(layer, h, q, rows, cache)
    return h, rows


def _check_reused_kv(
    layout: PromptLayout, kv_source: LayerKVSource | None, prefix: PrefixKV | None, num_layers: int
) -> None:
    """The stored KV a mode other than `full` reuses fits the layout: its prefix, then its context."""
    n_ctx = layout.num_context_tokens
    if prefix is None or prefix.token_ids != tuple(layout.prefix_ids):
        raise EngineError("the prompt pass needs the PrefixKV of this layout's prefix")
    if kv_source is not None and (kv_source.num_tokens != n_ctx or kv_source.num_layers != num_layers):
        raise EngineError(
            f"KV source has {kv_source.num_tokens} tokens × {kv_source.num_layers} layers, layout needs "
            f"{n_ctx} × {num_layers}"
        )


def _select_at_check_layer(
    layer: int,
    ratio: float,
    selector: TokenSelector,
    positions: torch.Tensor,
    num_ctx_rows: int,
    chunk_index: torch.Tensor,
    fresh: torch.Tensor,
    stored: torch.Tensor,
    p: int,
    n_ctx: int,
) -> torch.Tensor | None:
    """Row indices (into the current rows) that stay fresh after this check layer; None keeps all.

    The current rows are the `num_ctx_rows` context rows still recomputed (ascending), then the suffix rows
    (always kept): every count is on the host, only the choice among the context rows is on the device."""
    num_keep = min(num_ctx_rows, num_recompute_tokens(ratio, n_ctx))
    if num_keep == num_ctx_rows:
        return None
    ctx_pos = positions[:num_ctx_rows]
    inp = SelectionInput(
        layer=layer,
        positions=ctx_pos,
        chunk_index=chunk_index[ctx_pos - p],
        fresh=fresh[0][:, :num_ctx_rows],
        cached=stored[:, ctx_pos - p],
        num_keep=num_keep,
    )
    kept = selector.select(inp)  # ascending indices into the context rows
    suffix_rows = torch.arange(num_ctx_rows, positions.shape[0], device=positions.device)
    return torch.cat([kept, suffix_rows])


# ------------------------------------------------------------------------------------------- decode
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
    h = tf.embed(_ids(tf, token_ids))[None]  # (1, n, hidden)
    for layer in range(tf.cfg.num_layers):
        h, _, _ = tf.layer(layer, h, rows, cache)
    cache.length = start + n
    return tf.logits(h[0] if all_logits else h[0, -1])


def decode(tf: Transformer, cache: WorkingCache, token_id: int) -> torch.Tensor:
    """One token through the prompt pass's layer path: the next-token logits (vocab,) float32. The engine
    decodes with `batched_decode.decode_batch`; this is the reference its tests compare against (and what
    `bench decode --kernels` times as the step before it)."""
    return extend(tf, cache, [token_id])
