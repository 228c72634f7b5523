"""`match_span: sentence`: a matched name is recomputed with the rest of its sentence, table row or block
(engine/blend/spans.py `sentence_ends`, engine/blend/named.py `question_matches`)."""

from __future__ import annotations

import pytest

from engine.blend.named import question_matches
from engine.blend.spans import sentence_ends
from engine.config import EngineSettings
from engine.types import BlendConfig, EngineError, PromptLayout
from kvcache.types import InMemoryLayerReader


def test_sentence_ends_are_read_from_the_text_the_tokens_spell() -> None:
    prose = ["The", " code", " is", " 4", ",", "123", ".", "50", ".", " Next", " one", "."]
    # '.' of "123.50" is no end (a digit follows); '.' before " Next" is; the segment's last token is.
    table = ["| Kalorn", " | ", "98", " |\n", "| Bevex", " |", " 1", " |\n\n", "```yaml\n", "a: 1\n", "```"]
    # each row ends at its '|' + line break (" |\n", " |\n\n"), the block at the segment's end
    pieces = {i: p for i, p in enumerate(prose + table)}
    segments = [list(range(len(prose))), list(range(len(prose), len(prose) + len(table)))]
    assert sentence_ends(segments, pieces.__getitem__) == {8, 11, 12 + 3, 12 + 7, 12 + 10}
    # a blank line ends a paragraph; '!' and '?' end sentences; a segment's offsets follow the ones before it
    pieces = {0: "Hi", 1: "!", 2: " Ok", 3: "?\n", 4: "\n", 5: "x", 6: "y"}
    assert sentence_ends([[0, 1, 2], [3, 4, 5, 6]], pieces.__getitem__) == {1, 2, 3, 4, 6}


def test_a_sentence_span_stops_at_the_first_end_after_the_name_and_within_the_window() -> None:
    chunks = [[10, 11, 77, 12, 13, 14, 15, 16], [20, 21, 22], [30, 31, 32]]
    layout = PromptLayout(prefix_ids=[1], chunk_ids=chunks, suffix_ids=[5, 77])
    ends = frozenset({1, 5, 7, 10, 13})
    assert question_matches(layout, 8, ends) == {2, 3, 4, 5}  # 77 at offset 2, to the end at 5 (included)
    assert question_matches(layout, 2, ends) == {2, 3, 4}  # the window is the longest a span runs
    assert question_matches(layout, 8) == {2, 3, 4, 5, 6, 7}  # a window: to the segment's end
    assert question_matches(layout, 8, frozenset()) == {2, 3, 4, 5, 6, 7}  # no end in the segment


def test_a_whole_sentence_span_runs_back_to_the_sentence_start_within_the_window_and_the_segment() -> None:
    # The answer can stand before the words the question shares ("Introduced tilapia are the main fish …").
    chunks = [[10, 11, 12, 13, 14, 77, 15, 16, 17, 18], [20, 21, 77, 22], [30, 31, 32], [40], [50], [60]]
    layout = PromptLayout(prefix_ids=[1], chunk_ids=chunks, suffix_ids=[5, 77])  # 77 in 2 of 6 chunks: a name
    ends = frozenset({1, 7, 9, 13})  # 77 at offset 5: its sentence is 2…7; in the second chunk at 12: 10…13
    assert question_matches(layout, 8, ends, whole=True) == {*range(2, 8), *range(10, 14)}
    assert question_matches(layout, 8, ends) == {5, 6, 7, 12, 13}  # forward only, as before
    assert question_matches(layout, 2, ends, whole=True) == {3, 4, 5, 6, 7, 10, 11, 12, 13}  # the window both ways
    # no end before it in the segment: back to the segment's start, never into the chunk before
    assert question_matches(layout, 8, frozenset({7, 13}), whole=True) == {*range(0, 8), *range(10, 14)}
    assert question_matches(layout, 8, None, whole=True) == question_matches(layout, 8)  # a window is forward only


def _layout(tiny_engine) -> tuple[PromptLayout, list[list[int]]]:
    """Three segments of one-character tokens; 'Z' (the name) stands in the first and in the question."""
    tok = tiny_engine.tokenizer
    a, b, c, z, dot, space, one, two, three = (
        tok.convert_tokens_to_ids(t) for t in ("a", "b", "c", "Z", ".", "Ġ", "1", "2", "3")
    )
    first = [a] * 5 + [b] * 5 + [z, a, one, two, dot, three, three, dot, space, b] + [c, a] * 10  # 40 tokens
    # 'Z' at 10; the '.' at 14 stands between digits, the '.' at 17 before a space ends the sentence
    second = [a, b, c, dot, space] * 6  # 30 tokens
    third = [c, b, a] * 10  # 30 tokens
    chunks = [first, second, third]
    prefix = tiny_engine.prompt.layout(chunks, "q").prefix_ids
    return PromptLayout(prefix, chunks, [a, z, b, c]), chunks


@pytest.mark.parametrize(
    ("span", "forced"),
    [
        # the name and its sentence (offsets 10…17), then first_k's 12 rows: the first 4 candidates of each chunk
        ("sentence", [*range(0, 4), *range(10, 18), *range(40, 44), *range(70, 74)]),
        # a window of 16: offsets 10…26, then the first candidate of each chunk
        ("window", [0, *range(10, 27), 40, 70]),
        # the whole sentence: back to offset 0 (no end before 'Z' in the segment) and on to 17, then first_k's
        # two rows: the next candidate of the first chunk and the first of the second
        ("whole_sentence", [*range(0, 19), 40]),
    ],
)
def test_the_blend_recomputes_the_sentence_of_the_name_within_the_budget(tiny_engine, span, forced) -> None:
    layout, chunks = _layout(tiny_engine)
    stored = tiny_engine.precompute_chunks(chunks)
    config = BlendConfig(
        recompute_ratio=0.2, selector="first_k", match_window=16, match_span=span, match_extra=0.0, match_scope="any"
    )
    res = tiny_engine.prompt_pass(layout, InMemoryLayerReader(stored), "blend", config)
    p = layout.num_prefix_tokens
    assert res.selected_positions.tolist() == [p + o for o in forced]
    assert res.num_recomputed_tokens == 20  # round(0.2 · 100), the same rows either way


def test_a_sentence_span_without_the_ends_is_refused_and_a_bad_span_is_a_clear_error(tiny_engine) -> None:
    from engine.blend.plan import plan_blend

    layout, _ = _layout(tiny_engine)
    config = BlendConfig(recompute_ratio=0.2, selector="first_k", match_window=16, match_span="sentence")
    with pytest.raises(EngineError, match="sentence ends"):
        plan_blend(layout, "blend", config, tiny_engine.num_layers)
    with pytest.raises(ValueError, match="match_span"):
        BlendConfig(match_span="line")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="match_span"):
        EngineSettings(match_span="line")  # type: ignore[arg-type]
    assert EngineSettings(match_span="sentence").blend_config().match_span == "sentence"
    whole = config.model_copy(update={"match_span": "whole_sentence"})
    with pytest.raises(EngineError, match="'whole_sentence' needs the context's sentence ends"):
        plan_blend(layout, "blend", whole, tiny_engine.num_layers)


def test_a_follow_up_names_its_subject_in_the_earlier_turn() -> None:
    # three retrieved chunks and one earlier turn; 77 (a name) stands in the second chunk and in the turn only
    chunks = [[10, 11, 12], [20, 77, 21, 22], [30, 31, 32], [90, 77, 91]]
    follow_up = PromptLayout(prefix_ids=[1], chunk_ids=chunks, suffix_ids=[5, 6], num_history_segments=1)
    assert question_matches(follow_up, 1) == {4, 5} | {11, 12}  # in the chunk, and in the turn itself
    # the same prompt as a question with no history names nothing (77 is in no question token)
    alone = PromptLayout(prefix_ids=[1], chunk_ids=chunks, suffix_ids=[5, 6])
    assert question_matches(alone, 1) == set()


def test_match_extra_recomputes_the_span_on_top_of_the_budget(tiny_engine) -> None:
    layout, chunks = _layout(tiny_engine)
    stored = tiny_engine.precompute_chunks(chunks)
    p = layout.num_prefix_tokens
    # the sentence's 8 rows come on top of round(0.2 · 100) = 20: the selector keeps all 20 for itself
    config = BlendConfig(
        recompute_ratio=0.2,
        selector="first_k",
        match_window=16,
        match_span="sentence",
        match_extra=0.1,
        match_scope="any",
    )
    res = tiny_engine.prompt_pass(layout, InMemoryLayerReader(stored), "blend", config)
    assert res.num_recomputed_tokens == 28
    # first_k's 20 rows: 7, 7 and 6 of the three chunks' candidates, as without a span
    forced = [*range(0, 7), *range(10, 18), *range(40, 47), *range(70, 76)]
    assert res.selected_positions.tolist() == [p + o for o in forced]
    # a cap below the span: 3 rows on top (round(0.03 · 100)), the rest of the span out of the budget
    config = BlendConfig(
        recompute_ratio=0.2,
        selector="first_k",
        match_window=16,
        match_span="sentence",
        match_extra=0.03,
        match_scope="any",
    )
    res = tiny_engine.prompt_pass(layout, InMemoryLayerReader(stored), "blend", config)
    assert res.num_recomputed_tokens == 23
    # a question naming nothing: no rows on top
    no_name = PromptLayout(layout.prefix_ids, chunks, layout.suffix_ids[:1])
    res = tiny_engine.prompt_pass(no_name, InMemoryLayerReader(stored), "blend", config)
    assert res.num_recomputed_tokens == 20
    with pytest.raises(ValueError, match="match_extra"):
        BlendConfig(recompute_ratio=0.2, match_extra=1.5)
