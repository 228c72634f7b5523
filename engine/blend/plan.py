"""The blend's plan, made once on the host before the prompt pass: which rows are fresh in which layers, which
stored keys get a bias. The prompt pass (engine/prompt_pass.py) carries a plan out and decides nothing.

Layout of positions (all absolute, no gaps):

    0 … P-1        prefix (system prompt + template opening), exact KV computed once per engine
    P … P+N-1      context: the stored segments (retrieved chunks, then earlier turns), K before RoPE
    P+N … T-1      suffix (question + template close), always computed fresh

Modes differ only in which rows each layer computes fresh; every other row keeps its stored KV, rotated to its
real position:

    full     rows 0…T-1 at every layer (no reuse at all)
    prefix   rows after the first segment (prefix + segment 1 were computed exactly in this order at ingest)
    reuse    suffix rows only (r = 0)
    blend    up-front selectors (query, first_k, random): per group, the forced rows (segment sinks, the spans
             around the tokens the question names) and the selector's pick among the other rows, plus the suffix,
             fresh in every layer (`query` picks by a scoring pass of the suffix rows alone: engine/blend/scoring.py);
             check-layer selector (deviation): every non-prefix row up to the first check layer, then at each
             check layer the context rows with the largest KV deviation plus all suffix rows.

Everything here is known from the layout and the config, except what the selector picks (scores, deviations)
and an adaptive budget (`attention_share`), which `engine.blend.select` completes from the scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.blend.config import BlendConfig, SelectorName
from engine.blend.named import named_segments, question_matches
from engine.blend.selectors import num_recompute_tokens
from engine.types import EngineError, Mode, PromptLayout


@dataclass(frozen=True)
class AdaptiveBudget:
    """`attention_share`: the fewest top-scored tokens holding `share` of the question's attention to the group's
    first `num_scored` context tokens, within [num_min, num_max] (engine.blend.selectors.adaptive_num_keep)."""

    share: float
    num_min: int
    num_max: int
    num_scored: int


@dataclass(frozen=True)
class UpfrontGroup:
    """One budget of an up-front selection: the retrieved chunks, or (with `history_ratio`) the earlier turns.
    Offsets are context offsets 0…N-1."""

    num_budget: int | None  # the selector's budget; None: adaptive (`adaptive`), read from the scores
    adaptive: AdaptiveBudget | None
    num_extra: int  # match_extra's rows recomputed on top of the budget (matched offsets only)
    priority: tuple[int, ...]  # forced first, as far as the budget goes: segment sinks (rank order), then matches
    candidates: tuple[int, ...]  # the group's other offsets, ascending: the selector picks among them
    candidate_sizes: tuple[int, ...]  # how many candidates each segment of the group holds, in order

    def num_rows(self, num_budget: int) -> int:
        """Context rows this group recomputes with a budget of `num_budget`."""
        return num_budget + self.num_extra

    def forced(self, num_budget: int) -> tuple[int, ...]:
        return self.priority[: self.num_rows(num_budget)]

    def num_pick(self, num_budget: int) -> int:
        """How many candidates the selector keeps (the rest of the rows after the forced ones)."""
        return max(0, min(self.num_rows(num_budget) - len(self.forced(num_budget)), len(self.candidates)))


@dataclass(frozen=True)
class KeyBiasPlan:
    """`stale_key_bias`: −`value` on the attention logits at the stored context keys in `ranges` (absolute
    positions, [start, stop)) that the pass does not recompute; 0 everywhere else (engine/blend/key_bias.py)."""

    value: float
    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class CheckLayer:
    layer: int
    num_keep: int  # context rows kept fresh after this layer (the suffix rows always are)


@dataclass(frozen=True)
class BlendPlan:
    """What a prompt pass does, decided on the host. `fresh` rows are computed in every layer from layer 0;
    an up-front blend's context rows are `groups`' forced rows plus the selector's pick; a check-layer blend's
    are narrowed at `checks`."""

    mode: Mode
    num_prefix_tokens: int
    num_context_tokens: int
    num_tokens: int
    num_stored_tokens: int  # context tokens whose stored KV is read: all, the first segment (prefix), 0 (full)
    segment_sizes: tuple[int, ...]
    fresh: range | None  # None: an up-front blend (its context rows are chosen, then the suffix rows)
    selector: SelectorName | None = None  # which selector picks (mode blend with context)
    score_layers: tuple[int, ...] = ()  # query: the scoring pass's layers; empty: no scoring pass
    groups: tuple[UpfrontGroup, ...] = ()
    checks: tuple[CheckLayer, ...] = ()
    key_bias: KeyBiasPlan | None = None

    @property
    def suffix(self) -> range:
        return range(self.num_prefix_tokens + self.num_context_tokens, self.num_tokens)

    @property
    def upfront(self) -> bool:
        return self.fresh is None


def plan_blend(
    layout: PromptLayout,
    mode: Mode,
    config: BlendConfig,
    num_layers: int,
    sentence_ends: frozenset[int] | None = None,
    token_piece: Callable[[int], str] | None = None,
) -> BlendPlan:
    """The plan of a prompt pass of `mode` over `layout` (`config` only matters in mode blend).

    `sentence_ends`: the context offsets ending a sentence (engine.blend.spans.sentence_ends), which a blend with
    `match_span: sentence` needs. Raises EngineError for a plan the model cannot carry out (a check layer past
    its last layer, sentence spans without sentence ends). `token_piece`: the text a token spells, which
    `match_labels` needs (engine.blend.named.label_tokens).
    """
    p, n, total = layout.num_prefix_tokens, layout.num_context_tokens, layout.num_tokens
    sizes = tuple(len(c) for c in layout.chunk_ids)
    exact_first = exact_first_segment(layout)
    common = {"mode": mode, "num_prefix_tokens": p, "num_context_tokens": n, "num_tokens": total}
    common["segment_sizes"] = sizes  # type: ignore[assignment]
    if mode == "full":
        return BlendPlan(**common, num_stored_tokens=0, fresh=range(0, total))  # type: ignore[arg-type]
    if mode == "prefix":  # prefix + segment 1 were computed exactly in this order at ingest
        return BlendPlan(**common, num_stored_tokens=exact_first, fresh=range(p + exact_first, total))  # type: ignore[arg-type]
    if mode == "reuse" or n == 0:
        return BlendPlan(**common, num_stored_tokens=n, fresh=range(p + n, total))  # type: ignore[arg-type]
    if not config.upfront:
        if config.check_layers[-1] >= num_layers:
            raise EngineError(f"check layer {config.check_layers[-1]} ≥ num_layers {num_layers}")
        checks = tuple(
            CheckLayer(layer, num_recompute_tokens(ratio, n))
            for layer, ratio in zip(config.check_layers, config.ratios(), strict=True)
        )
        return BlendPlan(**common, num_stored_tokens=n, fresh=range(p, total), selector=config.selector, checks=checks)  # type: ignore[arg-type]
    sentence = config.reads_sentence_ends
    if sentence and sentence_ends is None:
        raise EngineError(f"match_span {config.match_span!r} needs the context's sentence ends (engine.blend.spans)")
    if config.match_labels and token_piece is None:
        raise EngineError("match_labels needs the text of the context's tokens (a token_piece)")
    matched = question_matches(
        layout,
        config.match_window,
        sentence_ends if sentence else None,
        config.match_scope,
        token_piece if config.match_labels else None,
        whole=config.match_span == "whole_sentence",
    )
    score_layers = ()
    if config.selector == "query":
        score_layers = tuple(sorted({min(layer, num_layers - 1) for layer in config.score_layers}))
    return BlendPlan(
        **common,  # type: ignore[arg-type]
        num_stored_tokens=n,
        fresh=None,
        selector=config.selector,
        score_layers=score_layers,
        groups=_upfront_groups(layout, config, matched),
        key_bias=_key_bias(layout, config),
    )


def exact_first_segment(layout: PromptLayout) -> int:
    """Tokens of the first segment whose stored KV is exact here: computed behind this very prefix."""
    return len(layout.chunk_ids[0]) if layout.chunk_ids and layout.segments_behind_prefix else 0


def _upfront_groups(layout: PromptLayout, config: BlendConfig, matched: set[int]) -> tuple[UpfrontGroup, ...]:
    """The chunks share one budget; with `config.history_ratio` a conversation's earlier turns get a budget of
    their own (that share of their tokens), so a follow-up's turns never compete with six chunks for a few rows.
    match_extra's rows (a share of all context tokens) go to the groups in order, as far as each has matches."""
    n = layout.num_context_tokens
    sizes = [len(c) for c in layout.chunk_ids]
    num_chunks = len(sizes) - layout.num_history_segments
    num_chunk_tokens = n - layout.num_history_tokens
    if config.history_ratio is not None and layout.num_history_segments:
        budgets = [
            (range(num_chunks), *_budget(config, num_chunk_tokens)),
            (range(num_chunks, len(sizes)), num_recompute_tokens(config.history_ratio, n - num_chunk_tokens), None),
        ]
    else:
        budgets = [(range(len(sizes)), *_budget(config, n))]
    extra = num_recompute_tokens(config.match_extra, n) if matched else 0
    groups = []
    for segments, num_budget, adaptive in budgets:
        group = _group(sizes, segments, num_budget, adaptive, config.sink_tokens, matched, extra)
        extra -= group.num_extra
        groups.append(group)
    return tuple(groups)


def _budget(config: BlendConfig, num_tokens: int) -> tuple[int | None, AdaptiveBudget | None]:
    """An up-front group's budget: recompute_ratio · N, or the adaptive budget of `attention_share` (query)."""
    if config.attention_share is None or config.selector != "query":
        return num_recompute_tokens(config.recompute_ratio, num_tokens), None
    adaptive = AdaptiveBudget(
        share=config.attention_share,
        num_min=num_recompute_tokens(config.ratio_min, num_tokens),
        num_max=num_recompute_tokens(config.ratio_max, num_tokens),
        num_scored=num_tokens,
    )
    return None, adaptive


def _group(
    sizes: list[int],
    segments: range,
    num_budget: int | None,
    adaptive: AdaptiveBudget | None,
    sink_tokens: int,
    matched: set[int],
    extra: int,
) -> UpfrontGroup:
    """The first `sink_tokens` of every segment come first (over budget: every segment's first token before any
    segment's second, …), then the `matched` offsets in prompt order; the rest are the selector's candidates.
    `extra` more rows (`match_extra`) go to matched offsets on top of the budget, so the selector keeps what they
    would have taken."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    sinks = [(rank, starts[i] + rank) for i in segments for rank in range(min(sink_tokens, sizes[i]))]
    sink_offsets = [offset for _, offset in sorted(sinks)]
    is_sink = set(sink_offsets)
    group_matched = sorted(
        o for i in segments for o in matched if starts[i] <= o < starts[i] + sizes[i] and o not in is_sink
    )
    taken = is_sink | set(group_matched)
    candidates: list[int] = []
    candidate_sizes: list[int] = []
    for i in segments:
        members = [o for o in range(starts[i], starts[i] + sizes[i]) if o not in taken]
        candidates.extend(members)
        candidate_sizes.append(len(members))
    return UpfrontGroup(
        num_budget=num_budget,
        adaptive=adaptive,
        num_extra=min(extra, len(group_matched)),
        priority=tuple(sink_offsets + group_matched),
        candidates=tuple(candidates),
        candidate_sizes=tuple(candidate_sizes),
    )


def _key_bias(layout: PromptLayout, config: BlendConfig) -> KeyBiasPlan | None:
    """`stale_key_bias` over the stored context keys after the exact first segment; with `stale_key_scope:
    unnamed` the segments the question names keep none, and a question naming none gets no bias at all.

    A stored key was computed behind the prefix alone, as if its segment opened the document; in a prompt of
    several chunks the question pays such keys more attention than it pays the same keys in full prefill (SmolLM2
    on nq6: the chunk nearest the question 1.7× its share, the exact first chunk half of it), so a passage far
    from the question loses the attention it should get. Among similar chunks the stale keys of the other chunks'
    identical sentences draw 1.5-2× the attention they draw in full prefill, and the answer copies their values;
    the chunk the question names keeps its (`unnamed`)."""
    if config.stale_key_bias <= 0:
        return None
    p = layout.num_prefix_tokens
    spared: set[int] = set()
    if config.stale_key_scope == "unnamed":
        spared = set(named_segments(layout))
        if not spared:
            return None
    ranges: list[tuple[int, int]] = []
    start = p
    for i, segment in enumerate(layout.chunk_ids):
        stop = start + len(segment)
        biased_from = max(start, p + exact_first_segment(layout))
        if i not in spared and biased_from < stop:
            if ranges and ranges[-1][1] == biased_from:
                ranges[-1] = (ranges[-1][0], stop)
            else:
                ranges.append((biased_from, stop))
        start = stop
    return KeyBiasPlan(value=config.stale_key_bias, ranges=tuple(ranges))
