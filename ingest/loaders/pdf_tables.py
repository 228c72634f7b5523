"""Tables of a PDF page as Markdown tables (pdfplumber), placed where they stand among the page's text.

A table is written in blocks of rows, each block opening with the table's header row, and blocks apart by a
blank line: the chunker cuts at blank lines, so every chunk that holds a row also holds the column headers
(the row header is the row's own first cell), and a value is retrieved with what it is a value of.

Table finding looks at every pair of ruling lines, so a page drawn with thousands of them (a "table bomb", or a
vector drawing) is read as plain text instead, and so is a table with more cells than any document table has;
the parse process's time and memory limits hold whatever is left.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

MAX_PAGE_EDGES = 2000  # ruling lines and rectangle sides of one page past which no table is looked for
MAX_TABLE_CELLS = 20_000  # cells of one table past which it stays plain text
BLOCK_CHARS = 512  # a Markdown block's characters by default: under a 512-token chunk even for digits (~0.6/char)


@dataclass(frozen=True)
class PageText:
    text: str
    num_tables: int
    tables_skipped: bool  # too many ruling lines: read as plain text


def _cell(value: Any) -> str:
    text = " ".join(str(value).split()) if value is not None else ""
    return text.replace("|", "\\|")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table_markdown(rows: list[list[Any]], block_chars: int = BLOCK_CHARS) -> str:
    """Rows (the first is the header) as Markdown tables of at most `block_chars` each (one row more where a row
    alone is longer), every one with the header row; "" for a table without a cell of text."""
    cleaned = [[_cell(c) for c in row] for row in rows if row]
    cleaned = [row for row in cleaned if any(row)]
    if not cleaned:
        return ""
    width = max(len(row) for row in cleaned)
    cleaned = [row + [""] * (width - len(row)) for row in cleaned]
    header = _row(cleaned[0]) + "\n" + _row(["---"] * width)
    lines = [_row(row) for row in cleaned[1:]]
    # As few blocks as fit, of even size: a last block of one row would be a chunk of little but the header, the
    # nearest chunk to every question about the table.
    room = max(block_chars - len(header), 1)
    num_blocks = max(1, -(-sum(len(line) + 1 for line in lines) // room))
    per_block = -(-len(lines) // num_blocks) if lines else 0
    while num_blocks < len(lines) and any(
        len(header) + sum(len(line) + 1 for line in lines[i : i + per_block]) > block_chars
        for i in range(0, len(lines), per_block)
    ):
        num_blocks += 1
        per_block = -(-len(lines) // num_blocks)
    blocks = ["\n".join([header, *lines[i : i + per_block]]) for i in range(0, len(lines), per_block or 1)] or [header]
    return "\n\n".join(blocks)


def page_with_tables(page: Any, block_chars: int = BLOCK_CHARS) -> PageText | None:
    """The text of a pdfplumber page with its tables as Markdown, in reading order from the top; None when the
    page has no table (its text is read as before)."""
    if len(page.edges) > MAX_PAGE_EDGES:
        return PageText("", 0, tables_skipped=True)
    tables = []
    for table in page.find_tables():
        rows = table.extract()
        if sum(len(r) for r in rows) > MAX_TABLE_CELLS:
            logger.info("a table of %d rows left as text: over %d cells", len(rows), MAX_TABLE_CELLS)
            continue
        markdown = table_markdown(rows, block_chars)
        if markdown:
            tables.append((table.bbox, markdown))
    if not tables:
        return None
    tables.sort(key=lambda t: t[0][1])
    boxes = [bbox for bbox, _ in tables]

    def outside(obj: dict[str, Any]) -> bool:
        x, y = (obj["x0"] + obj["x1"]) / 2, (obj["top"] + obj["bottom"]) / 2
        return not any(x0 <= x <= x1 and top <= y <= bottom for x0, top, x1, bottom in boxes)

    rest = page.filter(lambda obj: obj.get("object_type") != "char" or outside(obj))
    parts: list[str] = []
    top = 0.0
    for (_, table_top, _, table_bottom), markdown in tables:
        above = _text(rest, top, table_top)
        parts += [above, markdown] if above else [markdown]
        top = max(top, table_bottom)
    below = _text(rest, top, float(page.height))
    if below:
        parts.append(below)
    return PageText("\n\n".join(parts), len(tables), tables_skipped=False)


def _text(page: Any, top: float, bottom: float) -> str:
    if bottom <= top:
        return ""
    band = page.crop((0, top, float(page.width), bottom), relative=False, strict=False)
    return (band.extract_text() or "").strip()
