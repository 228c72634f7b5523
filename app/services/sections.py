"""The section a passage sits in: the nearest Markdown heading at or before the chunk's first character.

A source shown by its document's title alone reads "models.md" three times when three passages come from one
page; the heading says which part of it each is. Chunks keep their text and their offsets in the document
(`ChunkRecord.char_start`), so the heading is found at question time from the chunk's own text and, when the
chunk does not open with one, the latest heading of the chunks before it. Headings are ATX lines (`## Field
aliases`) outside fenced code blocks (a shell or Python comment `# install it` in a fence is not one); a chunk
that starts inside a fence cannot know it, so a `#` comment line there may be read as a heading. Documents
without Markdown headings (plain text, PDF pages) have no section.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

from ingest.loaders.text import outside_fences

# Up to three spaces of indent, 1-6 `#`, the text (closing #s and an `{ #anchor }` attribute list dropped).
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?(?:[ \t]*\{[^}\n]*\})?[ \t]*$")
MAX_SECTION_CHARS = 120


class ChunkText(Protocol):
    """A chunk's text and where it starts in its document's text (a `ChunkRecord` is one)."""

    @property
    def text(self) -> str: ...

    @property
    def char_start(self) -> int: ...


def headings(text: str) -> list[tuple[int, str]]:
    """(offset in `text`, heading) of each ATX heading line outside fenced code, in order."""
    found: list[tuple[int, str]] = []
    for offset, line in outside_fences(text):
        heading = _HEADING.match(line) if line is not None else None
        if heading is not None and heading.group(1).strip("# \t"):
            found.append((offset, _shorten(heading.group(1).strip())))
    return found


def _shorten(heading: str) -> str:
    heading = heading.replace("`", "")
    return heading if len(heading) <= MAX_SECTION_CHARS else heading[: MAX_SECTION_CHARS - 1].rstrip() + "…"


def section_of(chunk: ChunkText, earlier: Iterable[ChunkText]) -> str | None:
    """The heading in force at `chunk`'s first character: one that opens the chunk, else the last one
    before that character in `earlier` (the chunks before it in the document, latest first; they overlap
    the chunk, so a heading past its start is not counted), else None."""
    lead = len(chunk.text) - len(chunk.text.lstrip())
    own = headings(chunk.text)
    if own and own[0][0] <= lead:
        return own[0][1]
    for previous in earlier:
        before = [h for off, h in headings(previous.text) if previous.char_start + off < chunk.char_start]
        if before:
            return before[-1]
    return None
