"""Plain text and markdown: decode, normalize, optionally lift YAML front matter into metadata."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import yaml

from ingest.errors import UnreadableDocument
from ingest.loaders.markup import clean_markup
from ingest.normalize import normalize_text
from ingest.types import MetadataValue

logger = logging.getLogger(__name__)

_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?\n)?(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)
# A level-1 heading line: up to three spaces of indent, one `#`, then the title (closing #s dropped).
_ATX_H1 = re.compile(r"^ {0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_SETEXT_H1_UNDERLINE = re.compile(r"^ {0,3}=+[ \t]*$")
# A fenced code block opens and closes with 3+ backticks or tildes (CommonMark): `#` lines inside are code.
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_NUL_PROBE_BYTES = 8192


def decode_text(data: bytes, path: str | None) -> str:
    """UTF-8 (with or without BOM), UTF-16 with BOM, else Windows-1252; binary data is refused."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise UnreadableDocument(f"invalid UTF-16 text: {exc}", path) from exc
    if b"\x00" in data[:_NUL_PROBE_BYTES]:
        raise UnreadableDocument("file looks binary (NUL bytes), not text", path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        # Legacy 8-bit text is far more common than anything else that is not UTF-8; cp1252 leaves
        # a few bytes undefined, so fall back to latin-1 which never fails.
        try:
            return data.decode("cp1252")
        except UnicodeDecodeError:
            return data.decode("latin-1")


def split_front_matter(text: str) -> tuple[dict[str, MetadataValue], str]:
    """Remove a leading `---` YAML block; return its scalar keys and the remaining text.

    Text that merely starts with a horizontal rule is left alone: the block must parse as a YAML
    mapping (or be empty) to count as front matter.
    """
    match = _FRONT_MATTER.match(text)
    if match is None:
        return {}, text
    try:
        parsed = yaml.safe_load(match.group(1) or "")
    except yaml.YAMLError:
        return {}, text
    if parsed is None:
        parsed = {}
    if not isinstance(parsed, dict):
        return {}, text
    metadata: dict[str, MetadataValue] = {
        str(key): value for key, value in parsed.items() if isinstance(value, str | int | float | bool)
    }
    return metadata, text[match.end() :]


def outside_fences(text: str) -> Iterator[tuple[int, str | None]]:
    """(offset, line) of every line of markdown `text`, None in place of the lines of fenced code blocks (their
    fences included): lines inside a fence are code, a shell comment `# install it` in a ```bash block is no
    heading. Titles (`markdown_title`) and sections (app/services/sections.py) read headings through it."""
    fence: str | None = None  # the opening fence's characters while inside a fenced block
    offset = 0
    for line in text.split("\n"):
        opening = _FENCE.match(line)
        if fence is not None:
            # A fence closes with the same character, at least as long, and nothing else on the line.
            marker = opening.group(1) if opening else ""
            if marker[:1] == fence[0] and len(marker) >= len(fence) and not line.strip().strip(fence[0]):
                fence = None
            yield offset, None
        elif opening:
            fence = opening.group(1)
            yield offset, None
        else:
            yield offset, line
        offset += len(line) + 1


def markdown_title(text: str) -> str | None:
    """The first real level-1 heading (`# Title` or a `===`-underlined line) outside fenced code, or None.
    Lower-level headings (`## Features`) never title a document."""
    previous = ""
    for _, line in outside_fences(text):
        if line is None:
            previous = ""
            continue
        heading = _ATX_H1.match(line)
        if heading and heading.group(1).strip():
            return heading.group(1).strip()
        if previous.strip() and _SETEXT_H1_UNDERLINE.match(line):
            return previous.strip()
        previous = line
    return None


def parse_text(data: bytes, path: str | None) -> str:
    return normalize_text(decode_text(data, path))


def parse_markdown(data: bytes, path: str | None, strip_front_matter: bool) -> tuple[str | None, str, dict]:
    """(title or None, normalized text, metadata from front matter)."""
    raw = decode_text(data, path).replace("\r\n", "\n").lstrip("\ufeff")
    metadata: dict[str, MetadataValue] = {}
    if strip_front_matter:
        metadata, raw = split_front_matter(raw)
    # Heading anchors, reference links, admonition markers …: what the page's reader never sees (markup.py).
    text = normalize_text(clean_markup(raw))
    title = metadata.get("title")
    title = title if isinstance(title, str) and title.strip() else markdown_title(text)
    return title, text, metadata
