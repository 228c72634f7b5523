"""DOCX via python-docx: body paragraphs and tables in document order."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable

import docx
from docx.opc.exceptions import PackageNotFoundError
from docx.table import Table
from docx.text.paragraph import Paragraph

from ingest.errors import DocumentTooLarge, EncryptedDocument, UnreadableDocument
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


def _check_unpacked_size(data: bytes, path: str | None, max_unpacked_bytes: int) -> None:
    """Refuse a package whose parts together unpack to more than `max_unpacked_bytes`, before any is
    inflated. The sizes are the zip's own declarations, and they hold: Python's zip reader stops at a
    part's declared size (more data fails its CRC), so a lie cannot inflate past the cap either."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as package:
            num_bytes = sum(info.file_size for info in package.infolist())
    except zipfile.BadZipFile as exc:
        raise UnreadableDocument(f"not a readable DOCX package: {exc}", path) from exc
    if num_bytes > max_unpacked_bytes:
        raise DocumentTooLarge(
            f"DOCX unpacks to {num_bytes} bytes; the limit is {max_unpacked_bytes} (ingest.max_unpacked_bytes)", path
        )


def parse_docx(
    data: bytes,
    path: str | None,
    *,
    max_unpacked_bytes: int,
    max_chars: int,
    check: Callable[[], None] | None = None,
) -> tuple[str | None, str, dict[str, MetadataValue]]:
    """(title or None, normalized text with one paragraph per block, metadata). The package may unpack to
    `max_unpacked_bytes` and hold `max_chars` of text (counted block by block as it is read:
    DocumentTooLarge past either); `check` is called between blocks (it may raise to stop)."""
    if data.startswith(_OLE_MAGIC):
        if _ENCRYPTED_STREAM in data:
            raise EncryptedDocument("DOCX is password protected", path)
        raise UnreadableDocument("this is a legacy Word (.doc) file, not DOCX; save it as .docx", path)
    _check_unpacked_size(data, path, max_unpacked_bytes)
    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise UnreadableDocument(f"not a readable DOCX package: {exc}", path) from exc

    blocks: list[str] = []
    title: str | None = None
    num_chars = 0
    for block in document.iter_inner_content():
        if check is not None:
            check()
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
            if not table_text:
                continue
            blocks.append(table_text)
        else:
            continue
        num_chars += len(blocks[-1])
        if num_chars > max_chars:
            raise DocumentTooLarge.text_over_cap(max_chars, path)

    metadata: dict[str, MetadataValue] = {}
    properties = document.core_properties
    if properties.title and properties.title.strip():
        title = properties.title.strip()
    if properties.author and properties.author.strip():
        metadata["author"] = properties.author.strip()
    return title, normalize_text("\n\n".join(blocks)), metadata
