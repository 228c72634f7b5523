"""Which source each answer sentence draws on: a cheap attribution by shared words.

The prompt cannot make the built-in 135M model cite reliably, so citations are computed after the answer:
for every sentence, the source whose text shares the most of the sentence's distinctive words (weighted by
how rare each word is among the sources, so "the" or the question's own subject weigh little), if the share
is high enough to mean something. The JSON answer and the `done` event carry them as `citations`; the chat
page shows each as an [n] mark that opens source n. It is lexical, so a paraphrase with no shared
words gets no mark; it never invents one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

MIN_SHARE = 0.34  # of the sentence's weighted content words found in the source
MIN_SHARED_WORDS = 2
MIN_SENTENCE_WORDS = 3

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_FENCE = re.compile(r"^ {0,3}(```|~~~).*?(?:^ {0,3}\1[^\n]*$|\Z)", re.MULTILINE | re.DOTALL)
# A sentence ends at . ! ? (with closing quotes/brackets) before white space, or at a line break.
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?=\s)|\n+")
# fmt: off
_STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "been", "but", "by", "can", "could", "did", "do", "does", "for",
    "from", "had", "has", "have", "how", "i", "if", "in", "into", "is", "it", "its", "of", "on", "or", "our", "so",
    "such", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this", "to", "was", "we",
    "were", "what", "when", "where", "which", "who", "why", "will", "with", "would", "you", "your", "not", "no",
    "yes", "also", "more", "most", "other", "some", "any", "each", "all", "may", "might", "must", "should", "one",
    "two", "use", "used", "using",
))
# fmt: on


@dataclass(frozen=True)
class Citation:
    """Answer characters [start, end) (one sentence) draw on the source ranked `rank` (1-based)."""

    start: int
    end: int
    rank: int
    score: float  # the weighted share of the sentence's content words found in that source


@dataclass(frozen=True)
class SourceText:
    rank: int
    text: str


def content_words(text: str) -> list[str]:
    return [w for w in (m.group(0).lower() for m in _WORD.finditer(text)) if w not in _STOPWORDS and len(w) > 1]


def sentences(answer: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence outside fenced code blocks, white space trimmed."""
    spans: list[tuple[int, int]] = []
    position = 0
    for fence in [*_FENCE.finditer(answer), None]:
        stop = fence.start() if fence is not None else len(answer)
        start = position
        for end_match in _SENTENCE_END.finditer(answer, position, stop):
            spans.append((start, end_match.end() if answer[end_match.start()] != "\n" else end_match.start()))
            start = end_match.end()
        spans.append((start, stop))
        position = fence.end() if fence is not None else len(answer)
    trimmed = []
    for start, end in spans:
        text = answer[start:end]
        left = len(text) - len(text.lstrip())
        right = len(text.rstrip())
        if right > left:
            trimmed.append((start + left, start + right))
    return trimmed


def attribute(answer: str, sources: Sequence[SourceText]) -> list[Citation]:
    """One citation per answer sentence that shares enough distinctive words with one source."""
    if not sources or not answer.strip():
        return []
    vocabularies = [set(content_words(s.text)) for s in sources]
    num_sources = len(sources)

    def weight(word: str) -> float:
        document_frequency = sum(word in vocabulary for vocabulary in vocabularies)
        return math.log((num_sources + 1) / (document_frequency + 0.5)) + 0.1

    citations: list[Citation] = []
    for start, end in sentences(answer):
        words = set(content_words(answer[start:end]))
        if len(words) < MIN_SENTENCE_WORDS:
            continue
        total = sum(weight(w) for w in words)
        best: tuple[float, int] | None = None
        for source, vocabulary in zip(sources, vocabularies, strict=True):
            shared = words & vocabulary
            if len(shared) < MIN_SHARED_WORDS:
                continue
            share = sum(weight(w) for w in shared) / total
            if best is None or share > best[0] or (share == best[0] and source.rank < best[1]):
                best = (share, source.rank)
        if best is not None and best[0] >= MIN_SHARE:
            citations.append(Citation(start, end, best[1], round(best[0], 4)))
    return citations
