"""Which source each answer sentence draws on: a cheap attribution by shared words.

The prompt cannot make the built-in 135M model cite reliably, so citations are computed after the answer:
for every sentence, the source whose text shares the most of the sentence's distinctive words (weighted by
how rare each word is among the sources, so "the" or the question's own subject weigh little), if the share
is high enough to mean something. The JSON answer and the `done` event carry them as `citations`; the chat
page shows each as an [n] mark that opens source n. It is lexical, so a paraphrase with no shared
words gets no mark; it never invents one.

Shared words are not enough for a mark on a sentence that names code: a small model writes an invented
`exclude_if` or `Field(field_name=...)` into a sentence whose other words a source does share. So a mark
stands only where the cited passage contains every code identifier the sentence names (`code_identifiers`:
backticked spans, snake_case names, dotted names, calls); the sentence goes to the best-sharing source that
does, or gets no mark. An identifier that no source contains at all is reported (`unsupported_identifiers`):
the API's answer lists it and the chat page shows it as unsupported. Fenced code blocks are not checked: an
example's own variable names are the model's to choose.

When most of the names an answer writes are in no source (`invention_notice`: at least `MIN_UNSUPPORTED_NAMES`
distinct names unsupported, and more than half of the distinct names it writes), the answer is likely made up
around a question its sources only seemed to match: the `done` event's notice says so, which the chat page,
the CLI and /v1's `blendrag` extension show with the answer.
"""

from __future__ import annotations

import builtins
import keyword
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

MIN_SHARE = 0.34  # of the sentence's weighted content words found in the source
MIN_SHARED_WORDS = 2
MIN_SENTENCE_WORDS = 3
# One invented name in a sourced answer is common (a variable, a guess at a keyword); two or more, and more than
# half of the names written, mean the answer stands on names the sources do not have.
MIN_UNSUPPORTED_NAMES = 2

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

_BACKTICKED = re.compile(r"`([^`\n]+)`")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# Outside backticks, what reads as code in prose: a name with an underscore inside or at its start
# (`model_dump`, `__init__`), a dotted name (`BaseModel.model_dump`, `pydantic.Field`) or a name called
# (`Field(`). Plain words, capitalised or not, are prose; so are a URL's host and path (after a "/") and an
# address (after an "@").
_PROSE_CODE = re.compile(
    r"(?<![\w./@])(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+|_*[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]*"
    r"|[A-Za-z_][A-Za-z0-9_]*(?=\())"
)
# Names every Python text may use without a source saying so: keywords and builtins (`None`, `str`, `dict`).
_COMMON_NAMES = frozenset(keyword.kwlist) | frozenset(n for n in dir(builtins) if not n.startswith("_"))


@dataclass(frozen=True)
class Citation:
    """Answer characters [start, end) (one sentence) draw on the source ranked `rank` (1-based)."""

    start: int
    end: int
    rank: int
    score: float  # the weighted share of the sentence's content words found in that source


@dataclass(frozen=True)
class UnsupportedIdentifier:
    """Answer characters [start, end) name `identifier`, which none of the answer's sources contains."""

    start: int
    end: int
    identifier: str


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


def _is_identifier(name: str) -> bool:
    """A name worth checking: not a keyword or builtin, and not a dotted abbreviation such as "e.g"."""
    parts = name.split(".")
    return name not in _COMMON_NAMES and max(len(p) for p in parts) > 1


def code_identifiers(sentence: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of each code identifier `sentence` names, in order, each span once: every name
    inside a backticked span (`Field(field_name=...)` names `Field` and `field_name`), and outside
    backticks the snake_case, dotted and called names (`_PROSE_CODE`)."""
    found: list[tuple[int, int, str]] = []
    covered: list[tuple[int, int]] = []
    for span in _BACKTICKED.finditer(sentence):
        covered.append(span.span())
        for name in _NAME.finditer(span.group(1)):
            if _is_identifier(name.group(0)):
                start = span.start(1) + name.start()
                found.append((start, start + len(name.group(0)), name.group(0)))
    for name in _PROSE_CODE.finditer(sentence):
        inside = any(a <= name.start() < b for a, b in covered)
        if not inside and _is_identifier(name.group(0)):
            found.append((name.start(), name.end(), name.group(0)))
    return sorted(found)


def _source_names(text: str) -> set[str]:
    """Every name in a source and every part of its dotted names: what an identifier is looked up in."""
    names: set[str] = set()
    for match in _NAME.finditer(text):
        names.add(match.group(0))
        names.update(match.group(0).split("."))
    return names


def _contains(names: set[str], identifier: str) -> bool:
    """A name is in a source as a whole name; a dotted one also when its last part is: in `Model.model_dump`
    the attribute is the API, the object before it is often the answer's own (`user.model_dump`)."""
    return identifier in names or identifier.rsplit(".", 1)[-1] in names


def attribute(answer: str, sources: Sequence[SourceText], *, check_identifiers: bool = True) -> list[Citation]:
    """One citation per answer sentence that shares enough distinctive words with a source that also
    contains every code identifier the sentence names (`check_identifiers=False`: shared words alone, as
    before the check; `python -m bench answers` counts both)."""
    if not sources or not answer.strip():
        return []
    vocabularies = [set(content_words(s.text)) for s in sources]
    source_names = [_source_names(s.text) for s in sources]
    num_sources = len(sources)

    def weight(word: str) -> float:
        document_frequency = sum(word in vocabulary for vocabulary in vocabularies)
        return math.log((num_sources + 1) / (document_frequency + 0.5)) + 0.1

    citations: list[Citation] = []
    for start, end in sentences(answer):
        words = set(content_words(answer[start:end]))
        if len(words) < MIN_SENTENCE_WORDS:
            continue
        identifiers = {name for _, _, name in code_identifiers(answer[start:end])} if check_identifiers else set()
        total = sum(weight(w) for w in words)
        best: tuple[float, int] | None = None
        for source, vocabulary, names in zip(sources, vocabularies, source_names, strict=True):
            shared = words & vocabulary
            if len(shared) < MIN_SHARED_WORDS or not all(_contains(names, i) for i in identifiers):
                continue
            share = sum(weight(w) for w in shared) / total
            if best is None or share > best[0] or (share == best[0] and source.rank < best[1]):
                best = (share, source.rank)
        if best is not None and best[0] >= MIN_SHARE:
            citations.append(Citation(start, end, best[1], round(best[0], 4)))
    return citations


def unsupported_identifiers(answer: str, sources: Sequence[SourceText]) -> list[UnsupportedIdentifier]:
    """Each code identifier in the answer's sentences (fenced blocks aside) that no source contains. With no
    sources there is nothing to check against, and nothing is reported (the answer's notice says why)."""
    if not sources:
        return []
    names = set().union(*(_source_names(s.text) for s in sources))
    return [
        UnsupportedIdentifier(start + a, start + b, name)
        for start, end in sentences(answer)
        for a, b, name in code_identifiers(answer[start:end])
        if not _contains(names, name)
    ]


def answer_identifiers(answer: str) -> list[str]:
    """The distinct code identifiers the answer's sentences name (fenced blocks aside), in order of first use."""
    return list(
        dict.fromkeys(name for start, end in sentences(answer) for _, _, name in code_identifiers(answer[start:end]))
    )


def invention_notice(answer: str, unsupported: Sequence[UnsupportedIdentifier]) -> str | None:
    """The notice for an answer whose code names are mostly in no source (`unsupported`, from
    `unsupported_identifiers` of the same answer): at least `MIN_UNSUPPORTED_NAMES` distinct names unsupported
    and more than half of the distinct names it writes; else None."""
    missing = len({u.identifier for u in unsupported})
    named = len(answer_identifiers(answer))
    if missing < MIN_UNSUPPORTED_NAMES or 2 * missing <= named:
        return None
    return (
        f"{missing} of the {named} code names in this answer are in none of its sources: "
        "it is likely invented, not drawn from your documents"
    )
