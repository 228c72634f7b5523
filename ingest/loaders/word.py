"""DOCX via python-docx: body paragraphs and tables in document order."""

from __future__ import annotations

import io
import zipfile

import docx
from docx.opc.exceptions import PackageNotFoundError
from docx.table import Table
from docx.text.paragraph import Paragraph

from ingest.errors import EncryptedDocument, UnreadableDocument
from ingest.normalize import normalize_text
from ingest.types import MetadataValue

_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
# Password-protected OOXML files are OLE containers holding a stream with this (UTF-16LE) name.
_ENCRYPTED_STREAM = "EncryptedPackage".encode("utf-16-le")
_TITLE_STYLES = ("Title", "Heading 1")


def _table_text(table: Table) -> str:
    rows: list[str] = []
    for row in table.rows:
        cells: list[str] = []
        previous = None
        for cell in row.cells:
            # Merged cells come back once per grid column; keep one copy.
            if previous is not None and cell._tc is previous:
                continue
            previous = cell._tc
            cells.append(" ".join(cell.text.split()))
        if any(cells):
            rows.append(" | ".join(cells))
    return "\n".join(rows)


def parse_docx(data: bytes, path: str | None) -> tuple[str | None, str, dict[str, MetadataValue]]:
    """(title or None, normalized text with one paragraph per block, metadata)."""
    if data.startswith(_OLE_MAGIC):
        if _ENCRYPTED_STREAM in data:
            raise EncryptedDocument("DOCX is password protected", path)
        raise UnreadableDocument("this is a legacy Word (.doc) file, not DOCX; save it as .docx", path)
    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise UnreadableDocument(f"not a readable DOCX package: {exc}", path) from exc

    blocks: list[str] = []
    title: str | None = None
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            text = block.text.strip()
            if not text:
                continue
            style_name = block.style.name if block.style is not None else ""
            if title is None and style_name in _TITLE_STYLES:
                title = text
            blocks.append(text)
        elif isinstance(block, Table):
            table_text = _table_text(block)
            if table_text:
                blocks.append(table_text)

    metadata: dict[str, MetadataValue] = {}
    properties = document.core_properties
    if properties.title and properties.title.strip():
        title = properties.title.strip()
    if properties.author and properties.author.strip():
        metadata["author"] = properties.author.strip()
    return title, normalize_text("\n\n".join(blocks)), metadata
