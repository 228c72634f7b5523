"""Where a sentence, a table row or a block of the context ends, in token offsets, planned on the host.

A blend with `match_span: sentence` recomputes a name the question matches together with the rest of its
sentence (engine.blend.named.question_matches): the value a look-up asks for follows its name in the same sentence
("The access code of project Kalorn is K56-1950."), table row ("| Kalorn worker | 9847 | search |") or config block
("service: kalorn-api\\nrelease: 2021.03.4"), and a fixed window after the name either stops inside a long value or
spends the budget on the next sentence. The ends are found in the text the tokens spell, so every tokenizer is
read the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

# The last character of a sentence end: '.', '!' or '?' before white space or the end of the segment (not the
# '.' inside "4,123.50" or "2.10.5"); the line break closing a table row ('|' then a line break); a blank line
# (which ends a paragraph and a fenced code block's last line alike).
_END = re.compile(r"[.!?](?=\s|$)|\|[ \t]*\n|\n[ \t]*\n")


def sentence_ends(segments: Sequence[Sequence[int]], piece: Callable[[int], str]) -> frozenset[int]:
    """Offsets (into the concatenated segments) of the tokens holding the last character of a sentence end.

    `piece(token_id)` is the text one token spells; a segment's text is its tokens' pieces in order, and a token
    ends a sentence when an end (`_END`) finishes inside its piece. The last token of every segment ends one too.
    """
    ends: set[int] = set()
    start = 0
    for segment in segments:
        pieces = [piece(t) for t in segment]
        bounds, size = [], 0
        for p in pieces:
            size += len(p)
            bounds.append(size)  # one past the token's last character
        text = "".join(pieces)
        token = 0
        for match in _END.finditer(text):
            last = match.end() - 1
            while bounds[token] <= last:
                token += 1
            ends.add(start + token)
        if segment:
            ends.add(start + len(segment) - 1)
        start += len(segment)
    return frozenset(ends)
