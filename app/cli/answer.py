"""How `blendrag ask` prints an answer: streamed as it is generated on a terminal, with the [n] citation
marks the chat page shows (after each sentence the server attributed to source n)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Any, TextIO

_CLOSING_PUNCTUATION = re.compile(r"[.!?]+[\"')\]]*$")


def with_citation_marks(answer: str, citations: Iterable[dict[str, Any]]) -> str:
    """`answer` with " [n]" before the closing punctuation of each cited sentence (as the chat page does),
    unless the model already cited it there."""
    out: list[str] = []
    position = 0
    for c in sorted(citations, key=lambda c: c["end"]):
        start, end, rank = int(c["start"]), int(c["end"]), int(c["rank"])
        sentence = answer[start:end]
        if f"[{rank}]" in sentence or end < position:
            continue
        punct = _CLOSING_PUNCTUATION.search(sentence)
        at = end - len(punct.group(0)) if punct else end
        out.append(answer[position:at] + f" [{rank}]")
        position = at
    return "".join(out) + answer[position:]


class AnswerPrinter:
    """On a terminal the answer streams live, and is shown again with its marks when it has any; into a
    pipe or file it is written once, when done, with its marks."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self.text = ""

    def token(self, text: str) -> None:
        self.text += text
        if self.live:
            self.stream.write(text)
            self.stream.flush()

    def done(self, answer: str | None, citations: Iterable[dict[str, Any]]) -> None:
        answer = self.text if answer is None else answer
        marked = with_citation_marks(answer, citations)
        if not self.live:
            self.stream.write(marked)
        elif marked != answer:
            self.stream.write(f"\n\nwith citations:\n{marked}")
        self.stream.flush()
