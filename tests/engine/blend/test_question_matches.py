"""`match_window`: the context tokens the question names, and the tokens after each, are recomputed first
(engine/blend/named.py `question_matches`)."""

from __future__ import annotations

import pytest
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


# A vocabulary for `match_labels` (the text each token spells).
PIECES = {
    1: "In", 2: " which", 3: " rack", 4: " position", 5: " is", 6: " the", 7: " Elisk", 8: " appliance", 9: "?",
    20: "- Rack", 21: ":", 22: " R47", 23: "-U39", 24: "\n", 25: " Serial", 26: " number", 27: " A5Y", 28: " The",
    29: " Plaenz", 30: " renewal", 31: " renewed", 32: " 2028",
}  # fmt: skip


def _piece(token: int) -> str:
    return PIECES.get(token, f"<{token}>")


def test_labels_in_the_singled_out_chunk_get_spans_beside_the_name() -> None:
    question = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # "In which rack position is the Elisk appliance?"
    asked = [28, 7, 8, 24, 20, 4, 21, 22, 23, 24, 25, 26, 21, 27, 24, 28, 7, 8, 8]  # the Elisk page, at offset 0
    other = [28, 29, 8, 24, 20, 4, 21, 22, 24]  # a similar page: its label gets no span (not singled out)
    # Every page has the label and the kind of thing (" position", " appliance": no names), as one template's do.
    chunks = [asked, other, *([20, 4, 21, 8, 60 + i] for i in range(4))]
    layout = _layout(chunks, question)
    names_only = question_matches(layout, 3, scope="one")
    assert names_only == {1, 2, 3, 4, 16, 17, 18}  # " Elisk" at 1 and 16 with three tokens after (to the end)
    with_labels = question_matches(layout, 3, scope="one", piece=_piece)
    # "- Rack" (rack, case-blind) at 4 and " position" at 5 start spans over the asked value (7, 8); " appliance"
    # stands three times on the page, so it is the page's subject, not a label; " Serial number" is not asked.
    assert with_labels == names_only | {4, 5, 6, 7, 8}
    # Only within scope "one": with "any" the rule has no chunk to keep to and labels get no span.
    assert question_matches(layout, 3, scope="any", piece=_piece) == question_matches(layout, 3, scope="any")


def test_label_words_match_case_blind_and_by_a_five_letter_stem() -> None:
    from engine.blend.named import label_tokens

    layout = _layout([[30]], [31, 4])  # asked "renewed position"; the page says "renewal"
    assert label_tokens(layout, [30, 4, 20], _piece) == {30, 4}
    assert label_tokens(_layout([[1]], [6, 5, 9]), [6, 5, 28], _piece) == set()  # "the", "is": not label words


def test_label_spans_need_the_tokens_text_and_the_engine_gives_it(tiny_engine) -> None:
    from engine.blend.plan import plan_blend
    from engine.types import EngineError

    chunks = random_chunks([30, 30, 30], seed=5)
    layout = tiny_engine.prompt.layout(chunks, "which port does it use?")
    config = BlendConfig(recompute_ratio=0.2, match_labels=True)
    with pytest.raises(EngineError, match="match_labels"):
        plan_blend(layout, "blend", config, tiny_engine.num_layers, frozenset({89}))
    assert tiny_engine.plan(layout, "blend", config).num_context_tokens == 90
