"""Up-front selection in groups: every segment's first tokens (attention sinks) first, and a conversation's
earlier turns on a recompute budget of their own (`sink_tokens`, `history_ratio`)."""

from __future__ import annotations

import pytest
import torch
from enginetest_tiny import random_chunks
from test_query_selector import _scores

from engine.blend.selectors import num_recompute_tokens
from engine.prompt import Turn
from engine.types import BlendConfig
from kvcache.types import InMemoryLayerReader

ATOL = 1e-4
TURNS = [Turn("who holds the key?", "the keeper of the north gate."), Turn("and the code?", "it is 4471.")]


@pytest.fixture(scope="module")
def chunks() -> list[list[int]]:
    return random_chunks([31, 24, 38], seed=9)


@pytest.fixture(scope="module")
def history(tiny_engine) -> list[list[int]]:
    return [tiny_engine.prompt.turn_ids(t) for t in TURNS]


@pytest.fixture(scope="module")
def layout(tiny_engine, chunks, history):
    return tiny_engine.prompt.layout(chunks, "what is the code of the gate?", history)


@pytest.fixture(scope="module")
def stored(tiny_engine, chunks, history):
    return tiny_engine.precompute_chunks([*chunks, *history])


def _top(scores: torch.Tensor, k: int) -> list[int]:
    return torch.sort(scores, descending=True, stable=True).indices[:k].sort().values.tolist()


def test_history_budget_of_its_own(tiny_engine, layout, stored) -> None:
    cfg = BlendConfig(recompute_ratio=0.2, match_window=0, score_layers=(1,), history_ratio=0.5)
    res = tiny_engine.prompt_pass(layout, InMemoryLayerReader(stored), "blend", cfg)
    p, n = layout.num_prefix_tokens, layout.num_context_tokens
    n_chunks, n_hist = n - layout.num_history_tokens, layout.num_history_tokens
    scores = _scores(tiny_engine, layout, stored, cfg)
    # Chunks: the top round(0.2 · chunk tokens) of their own scores; turns: the top half of theirs.
    expected_chunks = _top(scores[:n_chunks], num_recompute_tokens(0.2, n_chunks))
    expected_hist = [n_chunks + i for i in _top(scores[n_chunks:], num_recompute_tokens(0.5, n_hist))]
    assert res.selected_positions.tolist() == [p + i for i in expected_chunks + expected_hist]
    assert res.num_recomputed_tokens == num_recompute_tokens(0.2, n_chunks) + num_recompute_tokens(0.5, n_hist)
    # Without the rule the turns compete with the chunks for round(0.2 · N) tokens.
    shared = tiny_engine.prompt_pass(
        layout,
        InMemoryLayerReader(stored),
        "blend",
        BlendConfig(recompute_ratio=0.2, match_window=0, score_layers=(1,)),
    )
    assert shared.selected_positions.tolist() == [p + i for i in _top(scores, num_recompute_tokens(0.2, n))]


def test_history_ratio_1_recomputes_every_turn_token_and_r1_equals_full(tiny_engine, layout, stored) -> None:
    p, n = layout.num_prefix_tokens, layout.num_context_tokens
    n_chunks = n - layout.num_history_tokens
    res = tiny_engine.prompt_pass(
        layout,
        InMemoryLayerReader(stored),
        "blend",
        BlendConfig(recompute_ratio=0.0, match_window=0, history_ratio=1.0),
    )
    assert res.selected_positions.tolist() == list(range(p + n_chunks, p + n))
    full = tiny_engine.prompt_pass(layout, None, "full")
    r1 = tiny_engine.prompt_pass(
        layout,
        InMemoryLayerReader(stored),
        "blend",
        BlendConfig(recompute_ratio=1.0, match_window=0, history_ratio=1.0, sink_tokens=3),
    )
    assert r1.num_recomputed_tokens == n
    torch.testing.assert_close(r1.logits, full.logits, atol=ATOL, rtol=0)


def test_sink_tokens_come_first_in_every_segment(tiny_engine, layout, stored) -> None:
    p, n = layout.num_prefix_tokens, layout.num_context_tokens
    cfg = BlendConfig(recompute_ratio=0.25, match_window=0, score_layers=(1,), sink_tokens=2)
    res = tiny_engine.prompt_pass(layout, InMemoryLayerReader(stored), "blend", cfg)
    starts, offset = [], 0
    for segment in layout.chunk_ids:
        starts.append(offset)
        offset += len(segment)
    sinks = [s + i for s in starts for i in range(2)]  # 5 segments × 2 = 10 tokens
    scores = _scores(tiny_engine, layout, stored, cfg)
    rest = torch.tensor([i for i in range(n) if i not in sinks])
    budget = num_recompute_tokens(0.25, n)
    chosen = rest[_top(scores[rest], budget - len(sinks))].tolist()
    assert res.selected_positions.tolist() == [p + i for i in sorted(sinks + chosen)]
    assert res.num_recomputed_tokens == budget


def test_sinks_beyond_the_budget_take_each_segment_s_first_token_first(tiny_engine, layout, stored) -> None:
    p = layout.num_prefix_tokens
    res = tiny_engine.prompt_pass(
        layout,
        InMemoryLayerReader(stored),
        "blend",
        BlendConfig(recompute_ratio=0.03, match_window=0, selector="random", sink_tokens=4),
    )
    assert num_recompute_tokens(0.03, layout.num_context_tokens) == 6
    starts = [0, 31, 55, 93, 93 + len(layout.chunk_ids[3])]  # chunks of 31, 24, 38 tokens, then two turns
    # Five segments' first tokens, then the first segment's second token.
    assert res.selected_positions.tolist() == sorted([p + s for s in starts] + [p + 1])


def test_sink_and_history_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="sink_tokens"):
        BlendConfig(sink_tokens=-1)
    with pytest.raises(ValueError, match="history_ratio"):
        BlendConfig(history_ratio=1.5)
