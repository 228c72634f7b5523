"""DOCX, read as a stream: body paragraphs and tables in document order, with every limit applied while the XML
is read.

A DOCX is a zip of XML parts. Building the whole tree first (python-docx) let a 277 KB file whose
document.xml inflates to 95 MB of whitespace-only paragraphs hold the ingest queue for minutes and ~2 GB of
memory before any limit ran. Here `word/document.xml` is read with lxml's `iterparse` straight from the zip
member's stream, each element dropped once it ends (memory stays bounded by one table row or paragraph, and
that is capped too), and after every block:

- the character cap: a block counts its text, and a block without text (an empty or whitespace paragraph, an
  empty table row) counts the size of its markup, so a flood of empty paragraphs reaches the cap as fast as
  their bytes would;
- the caller's `check` (a cancelled job, a stopping server);
- the `deadline` (`ingest.max_parse_seconds`), looked at every few hundred elements as well.

Text follows python-docx's reading: a paragraph's runs (w:t, tabs, breaks), tables row by row with cells
joined by " | ", text boxes and drawings left out; a vertically merged cell's text is given once (python-docx
repeats it in every row it spans).
"""

from __future__ import annotations

import io
import posixpath
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO

from lxml import etree

from ingest.errors import DocumentTooLarge, EncryptedDocument, ParseTimeLimit, UnreadableDocument
from ingest.normalize import normalize_text
from ingest.types import MetadataValue

_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
# Password-protected OOXML files are OLE containers holding a stream with this (UTF-16LE) name.
_ENCRYPTED_STREAM = "EncryptedPackage".encode("utf-16-le")
_TITLE_STYLES = ("title", "heading 1")  # style names (lower case, as styles.xml writes built-in ones)

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_REL = "{http://schemas.openxmlformats.org/package/2006/relationships}Relationship"
_OFFICE_DOCUMENT = "/officeDocument"
_STYLES = "/styles"
_DC = "{http://purl.org/dc/elements/1.1/}"
_MC_ALTERNATE = "{http://schemas.openxmlformats.org/markup-compatibility/2006}AlternateContent"

_BODY = _W + "body"
_P, _TBL, _TR, _TC = _W + "p", _W + "tbl", _W + "tr", _W + "tc"
_TEXT = {_W + "t": None, _W + "tab": "\t", _W + "ptab": "\t", _W + "br": "\n", _W + "cr": "\n"}
_TEXT[_W + "noBreakHyphen"] = "-"
# Content inside a paragraph that python-docx does not read as its text (and that repeats it: a text box's
# paragraphs are written twice, in DrawingML and in its VML fallback).
_SKIPPED = frozenset({_W + "drawing", _W + "pict", _W + "object", _MC_ALTERNATE, _W + "delText"})
_DEADLINE_EVERY = 512  # elements between two looks at the clock

Check = Callable[[], None]


def _parser_options() -> dict[str, object]:
    # No DTDs, no entities, no network: a package's XML is data, never instructions to the parser.
    return {"resolve_entities": False, "load_dtd": False, "no_network": True, "huge_tree": False}


def _name_bytes(qualified: str) -> int:
    """Bytes of a name as written: "{namespace}p" is written "w:p"."""
    return len(qualified) - qualified.index("}") + 1 if qualified.startswith("{") else len(qualified)


def _markup_bytes(element: etree._Element) -> int:
    """About the bytes `element`'s own markup takes in the file: its tags, attributes and text (its
    children count themselves)."""
    tag = element.tag if isinstance(element.tag, str) else "?"
    attributes = sum(_name_bytes(k) + len(v) + 4 for k, v in element.attrib.items())
    return 2 * _name_bytes(tag) + 5 + attributes + len(element.text or "")


class _Clock:
    """The time budget of one parse: `over()` raises ParseTimeLimit once it is spent."""

    def __init__(self, max_seconds: float | None, path: str | None) -> None:
        self.max_seconds, self.path = max_seconds, path
        self.deadline = None if max_seconds is None else time.monotonic() + max_seconds

    def over(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            assert self.max_seconds is not None
            raise ParseTimeLimit.after(self.max_seconds, self.path)


def _drop(element: etree._Element) -> None:
    """Free an element that has been read (and its place in its parent)."""
    parent = element.getparent()
    element.clear()
    if parent is not None:
        parent.remove(element)


@dataclass
class _Block:
    """The body-level block being read: a paragraph, or a table (read row by row)."""

    is_table: bool
    text: list[str] = field(default_factory=list)  # a paragraph's pieces, or the current cell's paragraphs' pieces
    style_id: str | None = None
    num_markup_bytes: int = 0  # of the paragraph, or of the current row
    num_pending_chars: int = 0  # text read of the paragraph, or of the current row
    rows: list[str] = field(default_factory=list)
    cells: list[str] = field(default_factory=list)
    cell_paragraphs: list[str] = field(default_factory=list)


class _BodyReader:
    """Blocks of `word/document.xml` as they end, with the limits applied (see the module docstring)."""

    def __init__(self, max_chars: int, path: str | None, check: Check | None, clock: _Clock) -> None:
        self.max_chars, self.path, self.check, self.clock = max_chars, path, check, clock
        self.num_chars = 0
        self.num_markup_chars = 0  # of num_chars, counted for blocks without text
        self.blocks: list[str] = []
        self.title_style_paragraphs: list[tuple[int, str | None]] = []  # (block index, style id)

    def charge(self, num: int, *, markup: bool = False) -> None:
        self.num_chars += num
        self.num_markup_chars += num if markup else 0
        if self.num_chars > self.max_chars:
            raise self.over_cap()

    def over_cap(self) -> DocumentTooLarge:
        if not self.num_markup_chars:
            return DocumentTooLarge.text_over_cap(self.max_chars, self.path)
        return DocumentTooLarge(
            f"document has more than {self.max_chars} characters of text and empty-paragraph markup (paragraphs and "
            f"table rows without text count the bytes of their markup: {self.num_markup_chars} here), more than its "
            "token cap allows (ingest.max_document_tokens)",
            self.path,
        )

    def read(self, stream: IO[bytes]) -> None:
        stack: list[str] = []  # tags from the root down to the element being read
        skip_depth = 0  # > 0 inside content that is not read as text
        block: _Block | None = None
        num_events = 0
        for event, element in etree.iterparse(stream, events=("start", "end"), **_parser_options()):
            num_events += 1
            if num_events % _DEADLINE_EVERY == 0:
                self.clock.over()
            tag = element.tag
            if event == "start":
                stack.append(tag)
                depth = len(stack)
                if skip_depth or tag in _SKIPPED:
                    skip_depth += 1
                elif depth == 3 and stack[1] == _BODY and tag in (_P, _TBL):
                    if self.check is not None:
                        self.check()
                    block = _Block(is_table=tag == _TBL)
                continue
            # "end"
            depth = len(stack)
            stack.pop()
            if skip_depth:
                skip_depth -= 1
            elif block is not None:
                block = self._end_in_block(block, element, tag, depth, stack)
            _drop(element)  # memory holds the open elements only, never the document

    def _end_in_block(
        self, block: _Block, element: etree._Element, tag: str, depth: int, stack: list[str]
    ) -> _Block | None:
        block.num_markup_bytes += _markup_bytes(element)
        if block.is_table:
            return self._end_in_table(block, element, tag, depth, stack)
        if depth == 3:  # the paragraph itself
            text = "".join(block.text).strip()
            if text:
                self.title_style_paragraphs.append((len(self.blocks), block.style_id))
                self.blocks.append(text)
                self.charge(len(text))
            else:
                self.charge(block.num_markup_bytes, markup=True)
            return None
        if tag in _TEXT:
            self._piece(block, element, tag)
        elif depth == 5 and tag == _W + "pStyle" and stack[3] == _W + "pPr":
            block.style_id = element.get(_W + "val")
        self._bound_open_block(block)
        return block

    def _end_in_table(
        self, block: _Block, element: etree._Element, tag: str, depth: int, stack: list[str]
    ) -> _Block | None:
        # stack (without this element): document, body, tbl, tr, tc, p, …
        if depth == 3:  # the table
            if block.rows:
                self.blocks.append("\n".join(block.rows))
            return None
        if depth == 4 and tag == _TR:
            row = [" ".join(cell.split()) for cell in block.cells]
            if any(row):
                text = " | ".join(row)
                block.rows.append(text)
                self.charge(len(text) + 1)
            else:
                self.charge(block.num_markup_bytes, markup=True)
            block.cells, block.num_markup_bytes, block.num_pending_chars = [], 0, 0
        elif depth == 5 and tag == _TC:
            block.cells.append("\n".join(block.cell_paragraphs))
            block.cell_paragraphs = []
        elif depth == 6 and tag == _P and stack[4] == _TC:
            block.cell_paragraphs.append("".join(block.text))
            block.text = []
        elif tag in _TEXT and len(stack) >= 6 and stack[4] == _TC and stack[5] == _P:
            self._piece(block, element, tag)
        self._bound_open_block(block)
        return block

    @staticmethod
    def _piece(block: _Block, element: etree._Element, tag: str) -> None:
        piece = _TEXT[tag]
        text = element.text or "" if piece is None else piece
        block.text.append(text)
        block.num_pending_chars += len(text)

    def _bound_open_block(self, block: _Block) -> None:
        """A block still open must not run past the cap either (one paragraph of 95 MB of text, a row of a
        million empty runs): its text so far against what is left, its markup against the whole cap."""
        if self.num_chars + block.num_pending_chars > self.max_chars:
            raise self.over_cap()
        if block.num_markup_bytes > self.max_chars:
            self.num_markup_chars += block.num_markup_bytes
            raise self.over_cap()


def _check_unpacked_size(package: zipfile.ZipFile, path: str | None, max_unpacked_bytes: int) -> None:
    """Refuse a package whose parts together unpack to more than `max_unpacked_bytes`, before any is
    inflated. The sizes are the zip's own declarations, and they hold: Python's zip reader stops at a
    part's declared size (more data fails its CRC), so a lie cannot inflate past the cap either."""
    num_bytes = sum(info.file_size for info in package.infolist())
    if num_bytes > max_unpacked_bytes:
        raise DocumentTooLarge(
            f"DOCX unpacks to {num_bytes} bytes; the limit is {max_unpacked_bytes} (ingest.max_unpacked_bytes)", path
        )


def _elements(package: zipfile.ZipFile, name: str, tags: tuple[str, ...], clock: _Clock) -> Iterator[etree._Element]:
    """The elements of a part (relationships, styles, properties) with one of `tags`, streamed and every element
    dropped once read, on the parse's clock; none when the part is absent."""
    try:
        stream = package.open(name)
    except KeyError:
        return
    with stream:
        for num_events, (_, element) in enumerate(etree.iterparse(stream, events=("end",), **_parser_options())):
            if num_events % _DEADLINE_EVERY == 0:
                clock.over()
            if element.tag in tags:
                yield element
            _drop(element)


def _relationship(package: zipfile.ZipFile, rels: str, kind: str, base: str, clock: _Clock) -> str | None:
    """The part a package's (or a part's) relationships name for `kind`, as a zip member name."""
    for element in _elements(package, rels, (_REL,), clock):
        if (element.get("Type") or "").endswith(kind) and element.get("TargetMode") != "External":
            target = element.get("Target") or ""
            return posixpath.normpath(target.lstrip("/") if target.startswith("/") else posixpath.join(base, target))
    return None


def _title_style_ids(package: zipfile.ZipFile, styles: str | None, clock: _Clock) -> set[str]:
    """The ids of the paragraph styles named Title or Heading 1 (python-docx's title styles)."""
    if styles is None:
        return {"Title", "Heading1"}  # no styles part: the built-in ids
    found: set[str] = set()
    for element in _elements(package, styles, (_W + "name",), clock):
        style = element.getparent()  # still open: a style's name ends before the style does
        style_id = style.get(_W + "styleId") if style is not None and style.tag == _W + "style" else None
        if style_id and (element.get(_W + "val") or "").strip().lower() in _TITLE_STYLES:
            found.add(style_id)
    return found


def _core_properties(package: zipfile.ZipFile, clock: _Clock) -> tuple[str | None, str | None]:
    """(title, author) of docProps/core.xml, each None when blank or absent."""
    name = _relationship(package, "_rels/.rels", "/metadata/core-properties", "", clock) or "docProps/core.xml"
    title = author = None
    for element in _elements(package, name, (_DC + "title", _DC + "creator"), clock):
        text = (element.text or "").strip() or None
        if element.tag == _DC + "title":
            title = title or text
        else:
            author = author or text
    return title, author


def parse_docx(
    data: bytes,
    path: str | None,
    *,
    max_unpacked_bytes: int,
    max_chars: int,
    check: Check | None = None,
    max_seconds: float | None = None,
) -> tuple[str | None, str, dict[str, MetadataValue]]:
    """(title or None, normalized text with one paragraph per block, metadata). The package may unpack to
    `max_unpacked_bytes` and hold `max_chars` (counted as the module docstring says) and take `max_seconds`
    to read (DocumentTooLarge, ParseTimeLimit past them); `check` is called between blocks (it may raise)."""
    clock = _Clock(max_seconds, path)
    if data.startswith(_OLE_MAGIC):
        if _ENCRYPTED_STREAM in data:
            raise EncryptedDocument("DOCX is password protected", path)
        raise UnreadableDocument("this is a legacy Word (.doc) file, not DOCX; save it as .docx", path)
    try:
        package = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise UnreadableDocument(f"not a readable DOCX package: {exc}", path) from exc
    with package:
        _check_unpacked_size(package, path, max_unpacked_bytes)
        try:
            main = _relationship(package, "_rels/.rels", _OFFICE_DOCUMENT, "", clock) or "word/document.xml"
            part_dir = posixpath.dirname(main)
            rels = posixpath.join(part_dir, "_rels", posixpath.basename(main) + ".rels")
            title_styles = _title_style_ids(package, _relationship(package, rels, _STYLES, part_dir, clock), clock)
            reader = _BodyReader(max_chars, path, check, clock)
            try:
                stream = package.open(main)
            except KeyError as exc:
                raise UnreadableDocument(f"not a readable DOCX package: no {main}", path) from exc
            with stream:
                reader.read(stream)
            core_title, author = _core_properties(package, clock)
        except (zipfile.BadZipFile, etree.XMLSyntaxError, EOFError) as exc:
            raise UnreadableDocument(f"not a readable DOCX package: {exc}", path) from exc
    title = core_title
    if title is None:
        title = next((reader.blocks[i] for i, style in reader.title_style_paragraphs if style in title_styles), None)
    metadata: dict[str, MetadataValue] = {"author": author} if author else {}
    return title, normalize_text("\n\n".join(reader.blocks)), metadata
