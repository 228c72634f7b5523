"""`match_window`: the context tokens the question names, and the tokens after each, are recomputed first
(engine/blend/named.py `question_matches`)."""

from __future__ import annotations

from enginetest_tiny import random_chunks

from engine.blend.named import question_matches
from engine.blend.selectors import num_recompute_tokens
from engine.types import BlendConfig, PromptLayout
from kvcache.types import InMemoryLayerReader


def _layout(chunks: list[list[int]], suffix: list[int]) -> PromptLayout:
    return PromptLayout(prefix_ids=[1, 2], chunk_ids=chunks, suffix_ids=suffix)


def test_a_question_token_in_few_segments_is_matched_with_the_window_after_it() -> None:
    chunks = [[10, 11, 12, 13, 14], [20, 21, 77, 22, 23, 24], [30, 31, 32], [40, 10, 41], [50, 51], [60, 61]]
    # 77 stands in one segment of six (a name): matched with 2 tokens after it, cut at the segment's end.
    # 10 stands in two: at most a third of six, matched too. 31 is not in the question.
    layout = _layout(chunks, [5, 77, 10, 6])
    starts = [0, 5, 11, 14, 17, 19]
    assert question_matches(layout, 2) == {starts[1] + 2, starts[1] + 3, starts[1] + 4} | {0, 1, 2} | {
        starts[3] + 1,
        starts[3] + 2,
    }
    assert question_matches(layout, 0) == set()


def test_scope_one_spans_only_the_chunk_the_question_singles_out() -> None:
    chunks = [[10, 11, 12, 13, 14], [20, 21, 77, 22, 23, 24], [30, 31, 32], [40, 10, 41], [50, 51], [60, 61]]
    # 77 (one segment) and 10 (two others): the question's names stand in three chunks, no span at all
    assert question_matches(_layout(chunks, [5, 77, 10, 6]), 2, scope="one") == set()
    # 77 alone: one chunk singled out, its span as with scope "any"
    assert question_matches(_layout(chunks, [5, 77, 6]), 2, scope="one") == {7, 8, 9}
    assert question_matches(_layout(chunks, [5, 77, 6]), 2, scope="any") == {7, 8, 9}
    # 77 and 20 in the second chunk, 10 in two others: the chunk holding more of the names is singled out, and
    # only its occurrences get spans (20 at 5 and 77 at 7, two tokens after each)
    assert question_matches(_layout(chunks, [77, 20, 10]), 2, scope="one") == {5, 6, 7, 8, 9}
    # an earlier turn (the last segment, a history segment) naming the same token does not count as a chunk
    turn = PromptLayout(prefix_ids=[1, 2], chunk_ids=[*chunks, [77, 88]], suffix_ids=[5, 6], num_history_segments=1)
    assert question_matches(turn, 2, scope="one") == {7, 8, 9, 21, 22}  # the turn starts at offset 21


def test_a_token_every_page_has_is_not_a_name() -> None:
    chunks = [[9, 1 + i, 2 + i] for i in range(0, 18, 3)]  # 9 in all six segments
    assert question_matches(_layout(chunks, [9, 4]), 8) == {4, 5}  # 4: the second segment's second token, to its end
    assert question_matches(_layout(chunks, [9]), 8) == set()


def test_matched_tokens_are_recomputed_within_the_budget(tiny_engine) -> None:
    chunks = random_chunks([40, 35, 45], seed=3)
    name = 300  # a token the question and the second chunk share, no other chunk
    for c in chunks:
        c[:] = [t if t != name else 299 for t in c]
    chunks[1][10] = name
    layout = tiny_engine.prompt.layout(chunks, "what is the code?")
    layout = PromptLayout(layout.prefix_ids, layout.chunk_ids, [*layout.suffix_ids[:3], name, *layout.suffix_ids[3:]])
    stored = tiny_engine.precompute_chunks(chunks)
    config = BlendConfig(
        recompute_ratio=0.2, score_layers=(1,), match_window=6, match_span="window", match_extra=0.0, match_scope="any"
    )
    res = tiny_engine.prompt_pass(layout, InMemoryLayerReader(stored), "blend", config)
    p = layout.num_prefix_tokens
    window = set(range(p + 40 + 10, p + 40 + 17))  # the name and the 6 tokens after it
    assert window <= set(res.selected_positions.tolist())
    assert res.num_recomputed_tokens == num_recompute_tokens(0.2, 120)  # within the budget, not on top
