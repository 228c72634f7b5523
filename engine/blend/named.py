"""The tokens a question names, and the context spans recomputed around them (`match_window`, `match_span`,
`match_scope`). Host-side rules over token ids: no tensor, no model.

A question token "names" something when it stands in some of the retrieved chunks but in at most a third of
them: a project's name, an identifier, a rare word, not a word every page has ("port", "the"). Its occurrences
are where the answer's value is stated (a value follows the name it belongs to: "project Arbor is K56-1950",
"| Arbor | 8443 |", "[project.arbor]\\nversion = …"). Among similar chunks the stored KV of those sentences looks
alike in every chunk, so the blend copies from the wrong one; recomputed, the named chunk's sentence sees the
context as full prefill does (docs/benchmarks.md, "Exact values among similar chunks").
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Sequence

from engine.blend.config import MatchScope
from engine.types import PromptLayout


def named_tokens(layout: PromptLayout) -> set[int]:
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


def named_segments(layout: PromptLayout) -> list[int]:
    """The segments holding a token the question names (`named_tokens`), in prompt order."""
    named = named_tokens(layout)
    return [i for i, segment in enumerate(layout.chunk_ids) if named.intersection(segment)]


def singled_out(layout: PromptLayout, named: set[int]) -> set[int]:
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


def _word(piece: str) -> str | None:
    """The word a token spells, lower-cased, when it is one a label is made of (letters only, 4 or more)."""
    word = piece.strip().lower()
    return word if len(word) >= 4 and word.isalpha() else None


def _alike(a: str, b: str) -> bool:
    """Two words read as the same label: equal, or sharing their first five letters ("renewed", "renewal")."""
    return a == b or (min(len(a), len(b)) >= 5 and a[:5] == b[:5])


def label_tokens(layout: PromptLayout, segment: Sequence[int], piece: Callable[[int], str]) -> set[int]:
    """`match_labels`: the tokens of `segment` (the chunk the question singles out) that spell one of the question's
    words, where that word stands at most twice in the segment: the label of the value asked for ("rack position",
    "serial number"), not the page's running subject ("appliance", said on every line)."""
    asked = {w for t in layout.suffix_ids if (w := _word(piece(t))) is not None}
    if not asked:
        return set()
    words = {t: w for t in set(segment) if (w := _word(piece(t))) is not None and any(_alike(w, a) for a in asked)}
    counts = Counter(words[t] for t in segment if t in words)
    return {t for t, w in words.items() if counts[w] <= 2}


def question_matches(
    layout: PromptLayout,
    window: int,
    ends: frozenset[int] | None = None,
    scope: MatchScope = "any",
    piece: Callable[[int], str] | None = None,
    whole: bool = False,
) -> set[int]:
    """Context offsets of the tokens the question names, each with the `window` tokens after it, or, with `ends`
    (`engine.blend.spans.sentence_ends`, `match_span: sentence`), with the tokens after it up to the end of its
    sentence, table row or block (that end included), at most `window` after it.

    A sentence span spends nothing past the value's sentence, where a fixed window runs on into the next one.
    With `scope` "one" (`match_scope`) only the chunk the question singles out (`singled_out`) and the earlier
    turns get spans: spans in several passages of an open question pull its attention to them (nq6). With `piece`
    (`match_labels`; the text a token spells) the singled-out chunk's tokens that spell the question's other words
    get spans too (`label_tokens`): on a page holding several values the asked one stands beside its label, on a
    line that need not say the page's name. With `whole` (`match_span: whole_sentence`, with `ends`) the span also
    runs back to the start of the sentence, at most `window` before the token: an open question's answer often
    stands before the words it shares with the question ("Introduced tilapia are the main fish …" for "what fish
    live in …").
    """
    if window <= 0 or not layout.chunk_ids:
        return set()
    named = named_tokens(layout)
    spanned: range | set[int] = range(len(layout.chunk_ids))
    labels: dict[int, set[int]] = {}
    if scope == "one":
        spanned = singled_out(layout, named)
        if piece is not None:
            num_chunks = len(layout.chunk_ids) - layout.num_history_segments
            labels = {i: label_tokens(layout, layout.chunk_ids[i], piece) for i in spanned if i < num_chunks}
    sorted_ends = sorted(ends) if ends is not None else []
    offsets: set[int] = set()
    start = 0
    for index, segment in enumerate(layout.chunk_ids):
        starts = named | labels.get(index, set())
        for i, token in enumerate(segment):
            if token in starts and index in spanned:
                first = start + i
                stop = start + min(len(segment), i + 1 + window)  # one past the window, cut at the segment's end
                if ends is not None:
                    at = bisect.bisect_left(sorted_ends, start + i)
                    if at < len(sorted_ends):
                        stop = min(stop, sorted_ends[at] + 1)
                    if whole:  # back to the token after the sentence before, within the segment and the window
                        first = max(start, start + i - window, sorted_ends[at - 1] + 1 if at > 0 else start)
                offsets.update(range(first, stop))
        start += len(segment)
    return offsets
