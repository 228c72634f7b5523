"""Token-aware chunking on the LLM's own tokenizer.

Contract with the engine: `Chunk.token_ids` are exactly the ids placed in the prompt for that chunk
(the engine never re-tokenizes), and they always equal `encode_chunk_text(tokenizer, chunk.text)`:
the chunk text's tokens followed by the tokens of the "\\n\\n" separator. Benchmarks therefore build
identical chunks from raw passages with `encode_chunk_text` alone.

How a section is cut:
1. It is split into *atoms* — paragraphs, then sentences; a sentence that alone exceeds the budget is
   split at line breaks, then at spaces, and a single giant "word" at character positions. Each atom
   records how strong the boundary before it is (paragraph > sentence > line > word > character).
   Atoms are exact, whitespace-trimmed slices of the text, so no text is ever dropped; only the
   whitespace *between* two chunks may belong to neither.
2. Atoms are packed greedily up to the budget; the chunk then ends at the strongest boundary that
   still leaves it at least half full, so paragraph breaks win over sentence breaks and so on.
3. The real token count of the chosen text is checked (tokenizing a join is not the sum of its parts);
   if it is over budget, the chunk gives up atoms until it fits. Hence `len(token_ids) <= chunk_tokens`.
4. The next chunk starts `chunk_overlap` tokens (or fewer) before the end, at the strongest boundary.

Chunks never cross sections, so a chunk's page is the page it starts (and ends) on. Deterministic.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ingest.config import IngestSettings
from ingest.types import LoadedDocument

CHUNK_SEPARATOR = "\n\n"

# Strength of the boundary *before* an atom.
CHAR, WORD, LINE, SENTENCE, PARAGRAPH = range(5)
_SECTION_END = 5
# A chunk may end at a weaker boundary only if no stronger one leaves it at least this full.
_MIN_FILL = 0.5
# First guess of characters per token when cutting a giant whitespace-free run.
_INITIAL_CHARS_PER_TOKEN = 3

_PARAGRAPH_GAP = re.compile(r"\n[ \t]*\n\s*")
_LINE_GAP = re.compile(r"[ \t]*\n\s*")
_WORD_GAP = re.compile(r"\s+")
# Sentence end: terminal punctuation, optional closing quotes/brackets, then whitespace (the gap).
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’»)\]]*(\s+)")
_CJK_SENTENCE_END = re.compile(r"[。！？]()")
# A line that starts a list item or a markdown heading begins a new sentence even without punctuation.
_LIST_LINE = re.compile(r"\n(?=[ \t]*(?:[-*•+]|\d{1,3}[.)]|#{1,6})[ \t])")
_ABBREVIATIONS = frozenset(
    {
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "st",
        "sr",
        "jr",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "inc",
        "ltd",
        "co",
        "no",
        "fig",
        "al",
        "approx",
        "dept",
        "est",
        "vol",
        "pp",
        "cf",
    }
)


class OverTokenCap(Exception):  # noqa: N818 - a document's verdict, not a fault
    """A document's text holds more than the `max_tokens` a caller allowed; chunking stopped there."""

    def __init__(self, max_tokens: int) -> None:
        super().__init__(f"more than {max_tokens} tokens")
        self.max_tokens = max_tokens


class TokenizerLike(Protocol):
    """The part of a Hugging Face tokenizer the chunker needs."""

    def encode(self, text: str, add_special_tokens: bool = ..., **kwargs: Any) -> list[int]: ...


def encode_text(tokenizer: TokenizerLike, text: str) -> list[int]:
    """Token ids of document text, with special-token strings kept as plain text.

    By default a Hugging Face tokenizer turns the *string* "<|im_end|>" inside a document into the real
    control token, which would let document content close the chat turn and inject instructions.
    `split_special_tokens=True` tokenizes such strings as ordinary characters. Tokenizers that do not
    know the option (non-HF) are called without it.
    """
    try:
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    except TypeError:
        return list(tokenizer.encode(text, add_special_tokens=False))


def encode_chunk_text(tokenizer: TokenizerLike, text: str) -> list[int]:
    """The prompt token ids of a chunk: tokens of `text` (see `encode_text`), then the tokens of the
    "\\n\\n" separator, encoded separately so a chunk's ids never depend on what follows it."""
    return encode_text(tokenizer, text) + encode_text(tokenizer, CHUNK_SEPARATOR)


@dataclass(frozen=True)
class Chunk:
    """A slice of a document: `text == document.text[char_start:char_end]`."""

    index: int
    text: str
    token_ids: list[int]  # == encode_chunk_text(tokenizer, text); what the engine precomputes and places in the prompt
    page: int | None
    char_start: int
    char_end: int

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class _Atom:
    start: int
    end: int
    level: int  # boundary strength before this atom
    num_tokens: int


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _split_at_gaps(text: str, start: int, end: int, gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Non-empty trimmed spans of text[start:end] between the (sorted, disjoint) gaps."""
    spans: list[tuple[int, int]] = []
    position = start
    for gap_start, gap_end in [*gaps, (end, end)]:
        if gap_start < position:
            continue
        span = _trimmed(text, position, gap_start)
        if span[0] < span[1]:
            spans.append(span)
        position = gap_end
    return spans


def _regex_spans(pattern: re.Pattern[str]) -> Callable[[str, int, int], list[tuple[int, int]]]:
    def split(text: str, start: int, end: int) -> list[tuple[int, int]]:
        gaps = [match.span() for match in pattern.finditer(text, start, end)]
        return _split_at_gaps(text, start, end, gaps)

    return split


def _is_sentence_end(text: str, punctuation_start: int) -> bool:
    """Reject '.' after common abbreviations and single-letter initials ("J. R. R. Tolkien").

    A following lower-case letter is deliberately not required to reject: lower-cased corpora exist.
    """
    if text[punctuation_start] != ".":
        return True
    word_start = punctuation_start
    while word_start > 0 and not text[word_start - 1].isspace():
        word_start -= 1
    word = text[word_start:punctuation_start].lstrip("(\"'“‘").lower()
    return not (word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()))


def _sentence_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    gaps: list[tuple[int, int]] = []
    for match in _SENTENCE_END.finditer(text, start, end):
        if _is_sentence_end(text, match.start()):
            gaps.append(match.span(1))
    gaps.extend(match.span(1) for match in _CJK_SENTENCE_END.finditer(text, start, end))
    gaps.extend(match.span() for match in _LIST_LINE.finditer(text, start, end))
    gaps.sort()
    return _split_at_gaps(text, start, end, gaps)


_split_paragraphs = _regex_spans(_PARAGRAPH_GAP)
# Splitters for an over-long sentence, strongest first, with the level of the boundaries they make.
_FALLBACK_SPLITTERS: tuple[tuple[int, Callable[[str, int, int], list[tuple[int, int]]]], ...] = (
    (LINE, _regex_spans(_LINE_GAP)),
    (WORD, _regex_spans(_WORD_GAP)),
)


class Chunker:
    """Cuts documents into chunks of at most `chunk_tokens` prompt tokens (separator included)."""

    def __init__(self, tokenizer: TokenizerLike, chunk_tokens: int = 512, chunk_overlap: int = 64) -> None:
        self._tokenizer = tokenizer
        self._separator_ids = encode_text(tokenizer, CHUNK_SEPARATOR)
        if chunk_overlap < 0 or chunk_overlap >= chunk_tokens:
            raise ValueError("need 0 <= chunk_overlap < chunk_tokens")
        self._text_budget = chunk_tokens - len(self._separator_ids)
        if self._text_budget < 8:
            raise ValueError(f"chunk_tokens={chunk_tokens} leaves no room for text")
        self.chunk_tokens = chunk_tokens
        self.chunk_overlap = chunk_overlap

    @classmethod
    def from_settings(cls, tokenizer: TokenizerLike, settings: IngestSettings) -> Chunker:
        return cls(tokenizer, settings.chunk_tokens, settings.chunk_overlap)

    def chunk_document(
        self, document: LoadedDocument, *, max_tokens: int | None = None, check: Callable[[], None] | None = None
    ) -> list[Chunk]:
        """Chunks of every section, numbered from 0; offsets index `document.text`.

        With `max_tokens`, a document whose text tokenizes to more stops with OverTokenCap as soon as the
        count passes it (a huge text is not tokenized to the end to be refused); `check` is called between
        paragraphs (it may raise to stop: a cancel)."""
        chunks: list[Chunk] = []
        budget = _TokenBudget(max_tokens, check)
        for section, offset in zip(document.sections, document.section_offsets(), strict=True):
            for start, end, token_ids in self._chunk_spans(section.text, budget):
                chunks.append(
                    Chunk(
                        index=len(chunks),
                        text=section.text[start:end],
                        token_ids=token_ids,
                        page=section.page,
                        char_start=offset + start,
                        char_end=offset + end,
                    )
                )
        return chunks

    def chunk_text(self, text: str, page: int | None = None) -> list[Chunk]:
        """Chunks of one piece of text (taken as-is, not normalized); offsets index `text`."""
        return [
            Chunk(index=index, text=text[start:end], token_ids=token_ids, page=page, char_start=start, char_end=end)
            for index, (start, end, token_ids) in enumerate(self._chunk_spans(text))
        ]

    # -- atoms -------------------------------------------------------------------------------------

    def _count(self, text: str) -> int:
        return len(encode_text(self._tokenizer, text))

    def _atoms(self, text: str, budget: _TokenBudget | None = None) -> list[_Atom]:
        atoms: list[_Atom] = []
        for paragraph_start, paragraph_end in _split_paragraphs(text, 0, len(text)):
            num_before = len(atoms)
            for number, (start, end) in enumerate(_sentence_spans(text, paragraph_start, paragraph_end)):
                self._add_atoms(text, start, end, PARAGRAPH if number == 0 else SENTENCE, 0, atoms)
            if budget is not None:
                budget.spend(sum(atom.num_tokens for atom in atoms[num_before:]))
        return atoms

    def _add_atoms(self, text: str, start: int, end: int, level: int, depth: int, out: list[_Atom]) -> None:
        num_tokens = self._count(text[start:end])
        if num_tokens <= self._text_budget:
            out.append(_Atom(start, end, level, num_tokens))
            return
        for split_depth in range(depth, len(_FALLBACK_SPLITTERS)):
            split_level, split = _FALLBACK_SPLITTERS[split_depth]
            spans = split(text, start, end)
            if len(spans) > 1:
                for number, (part_start, part_end) in enumerate(spans):
                    part_level = level if number == 0 else split_level
                    self._add_atoms(text, part_start, part_end, part_level, split_depth + 1, out)
                return
        self._add_character_atoms(text, start, end, level, out)

    def _add_character_atoms(self, text: str, start: int, end: int, level: int, out: list[_Atom]) -> None:
        """Cut a whitespace-free run that is over budget into pieces that fit.

        With a fast tokenizer the run's token offsets propose each cut (`budget` tokens ahead), which
        a single count confirms; otherwise, or when a proposal does not fit, a search finds the cut.
        """
        token_starts = self._token_starts(text, start, end)
        guess = self._text_budget * _INITIAL_CHARS_PER_TOKEN
        while start < end:
            cut, num_tokens = 0, 0
            if token_starts is not None:
                ahead = bisect.bisect_left(token_starts, start) + self._text_budget
                cut = token_starts[ahead] if ahead < len(token_starts) else end
                num_tokens = self._count(text[start:cut]) if cut > start else 0
                if not 0 < num_tokens <= self._text_budget:
                    cut = 0
            if not cut:
                cut = self._longest_fitting_prefix(text, start, end, guess)
                num_tokens = self._count(text[start:cut])
            out.append(_Atom(start, cut, level, num_tokens))
            # Pieces of one run have similar characters per token: the next search starts from here.
            guess = cut - start
            start, level = cut, CHAR

    def _token_starts(self, text: str, start: int, end: int) -> list[int] | None:
        """Sorted absolute character positions where tokens of text[start:end] begin, when the
        tokenizer can report offsets (Hugging Face fast tokenizers); None otherwise."""
        if not callable(self._tokenizer):
            return None
        try:
            encoding = self._tokenizer(
                text[start:end], add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True
            )
            offsets = encoding["offset_mapping"]
        except (TypeError, NotImplementedError, KeyError, ValueError):
            return None
        return sorted({start + token_start for token_start, _ in offsets})

    def _longest_fitting_prefix(self, text: str, start: int, end: int, guess: int) -> int:
        """Largest cut in (start, end] with text[start:cut] within budget: gallop from `guess`, then
        bisect. Token counts grow with length, so the fitting cuts form a prefix of the range."""

        def fits(cut: int) -> bool:
            return self._count(text[start:cut]) <= self._text_budget

        low, high = start + 1, end + 1  # invariant: cut `low` fits (one character always does), `high` not
        probe = min(end, start + max(1, guess))
        step = max(1, guess // 4)
        while True:
            if fits(probe):
                low = probe
                if probe == end:
                    return end
                probe = min(end, probe + step)
                step *= 2
            else:
                high = probe
                break
        while high - low > 1:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
        return low

    # -- packing -----------------------------------------------------------------------------------

    def _chunk_spans(self, text: str, budget: _TokenBudget | None = None) -> list[tuple[int, int, list[int]]]:
        atoms = self._atoms(text, budget)
        num_atoms = len(atoms)
        # Estimated tokens of atoms[i:e] = prefix[e] - prefix[i] - boundary_cost(atoms[i]); a line or
        # paragraph break inside a chunk usually costs one newline token of its own.
        boundary_cost = [1 if atom.level >= LINE else 0 for atom in atoms]
        prefix = [0]
        for atom, cost in zip(atoms, boundary_cost, strict=True):
            prefix.append(prefix[-1] + atom.num_tokens + cost)

        def estimate(first: int, end: int) -> int:
            return prefix[end] - prefix[first] - boundary_cost[first]

        def level_at(end: int) -> int:
            return atoms[end].level if end < num_atoms else _SECTION_END

        spans: list[tuple[int, int, list[int]]] = []
        first, covered = 0, 0  # covered: atoms before this index are already in some chunk
        while first < num_atoms:
            greedy_end = first + 1
            while greedy_end < num_atoms and estimate(first, greedy_end + 1) <= self._text_budget:
                greedy_end += 1
            limit = greedy_end
            while True:
                end = self._choose_end(first, limit, estimate, level_at)
                token_ids = self._encode(text, atoms[first].start, atoms[end - 1].end)
                if len(token_ids) <= self.chunk_tokens or end == first + 1:
                    break
                limit = end - 1
            if end <= covered:
                # The overlap left no room for new text once the real count was known: restart
                # without overlap.
                first = covered
                continue
            spans.append((atoms[first].start, atoms[end - 1].end, token_ids))
            covered = end
            if end >= num_atoms:
                break
            first = self._overlap_start(first, end, estimate, level_at, atoms[end].num_tokens)
        return spans

    def _encode(self, text: str, start: int, end: int) -> list[int]:
        return encode_text(self._tokenizer, text[start:end]) + self._separator_ids

    def _choose_end(
        self, first: int, limit: int, estimate: Callable[[int, int], int], level_at: Callable[[int], int]
    ) -> int:
        """End (exclusive atom index) in (first, limit] at the strongest boundary that is full enough."""
        min_tokens = _MIN_FILL * self._text_budget
        best = limit
        best_level = -1
        for end in range(limit, first, -1):
            if estimate(first, end) < min_tokens:
                break
            if level_at(end) > best_level:
                best, best_level = end, level_at(end)
        return best

    def _overlap_start(
        self,
        first: int,
        end: int,
        estimate: Callable[[int, int], int],
        level_at: Callable[[int], int],
        next_atom_tokens: int,
    ) -> int:
        """First atom of the next chunk: repeat up to `chunk_overlap` tokens, from a strong boundary,
        leaving room for at least the next new atom."""
        room = min(self.chunk_overlap, self._text_budget - next_atom_tokens - 1)
        best, best_level = end, -1
        for start in range(end - 1, first, -1):
            if estimate(start, end) > room:
                break
            if level_at(start) >= best_level:
                best, best_level = start, level_at(start)
        return best


class _TokenBudget:
    """Tokens of a document's atoms counted as they are made, against an optional cap, with a caller's
    check between paragraphs. Atoms are what every chunk is made of, so their count is (within a token
    per join) the document's text tokens; the chunks' total adds separators and overlap on top."""

    def __init__(self, max_tokens: int | None, check: Callable[[], None] | None) -> None:
        self._max_tokens = max_tokens
        self._check = check
        self.num_tokens = 0

    def spend(self, num_tokens: int) -> None:
        self.num_tokens += num_tokens
        if self._max_tokens is not None and self.num_tokens > self._max_tokens:
            raise OverTokenCap(self._max_tokens)
        if self._check is not None:
            self._check()


def chunk_document(
    document: LoadedDocument, tokenizer: TokenizerLike, settings: IngestSettings | None = None
) -> list[Chunk]:
    """Convenience wrapper: `Chunker.from_settings(tokenizer, settings).chunk_document(document)`."""
    return Chunker.from_settings(tokenizer, settings or IngestSettings()).chunk_document(document)
