"""PDF pages as sections with their 1-based page numbers: the text layer via pypdf; tables as Markdown tables
(pdfplumber, `pdf_tables.py`) on pages that have them; pages without a text layer read by OCR (`ocr.py`) as
`ingest.pdf_ocr` says (off, auto: pages with no text, on: every page)."""

from __future__ import annotations

import io
import logging
from typing import Any, Literal

from pypdf import PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, PdfReadError, WrongPasswordError

from ingest.errors import EmptyDocument, EncryptedDocument, UnreadableDocument
from ingest.normalize import normalize_text
from ingest.types import MetadataValue, Section

logger = logging.getLogger(__name__)


def _open(data: bytes, path: str | None) -> PdfReader:
    try:
        reader = PdfReader(io.BytesIO(data))
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        raise UnreadableDocument(f"not a readable PDF: {exc}", path) from exc
    if reader.is_encrypted:
        # Many PDFs are "encrypted" only with an owner password (printing/copy restrictions) and an
        # empty user password: those open fine. A real user password means we cannot read the text.
        try:
            opened = reader.decrypt("")
        except DependencyError as exc:
            raise EncryptedDocument(
                f"PDF uses AES encryption, which needs the 'cryptography' package to open ({exc})", path
            ) from exc
        except (WrongPasswordError, FileNotDecryptedError, NotImplementedError) as exc:
            raise EncryptedDocument(f"PDF is password protected ({exc})", path) from exc
        if not opened:
            raise EncryptedDocument("PDF is password protected", path)
    return reader


OcrMode = Literal["off", "auto", "on"]


def parse_pdf(
    data: bytes, path: str | None, *, tables: bool = True, ocr: OcrMode = "off", table_block_chars: int = 512
) -> tuple[str | None, list[Section], dict[str, MetadataValue]]:
    """(title from the PDF info or None, non-empty pages as sections, metadata). `tables`: tables as Markdown, in
    blocks of about `table_block_chars` that each repeat the header; `ocr`: which pages are read by OCR."""
    reader = _open(data, path)
    try:
        pages = list(reader.pages)
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        raise UnreadableDocument(f"PDF page tree is damaged: {exc}", path) from exc
    if not pages:
        raise EmptyDocument("PDF has no pages", path)
    sections: list[Section] = []
    failed_pages: list[int] = []
    ocr_pages: list[int] = []
    num_tables = 0
    layout = _Layout(data, path, table_block_chars) if tables or ocr != "off" else None
    for page_number, page in enumerate(pages, start=1):
        try:
            text = normalize_text(page.extract_text() or "") if ocr != "on" else ""
        except Exception as exc:  # pypdf raises many kinds of errors on damaged content streams
            logger.warning("%s: cannot extract text of page %d: %s", path, page_number, exc)
            text = ""
            if ocr == "off":
                failed_pages.append(page_number)
                continue
        if layout is not None and text and tables:
            with_tables = layout.tables(page_number - 1)
            if with_tables is not None:
                text = normalize_text(with_tables.text) or text
                num_tables += with_tables.num_tables
        if not text and layout is not None and (ocr == "on" or (ocr == "auto" and _has_images(page))):
            text = normalize_text(layout.ocr(page_number - 1))
            ocr_pages.append(page_number)
        if text:
            sections.append(Section(text=text, page=page_number))
    if layout is not None:
        layout.close()
    if not sections:
        if failed_pages:
            raise UnreadableDocument(f"text extraction failed on every page ({len(failed_pages)})", path)
        if ocr_pages:
            raise EmptyDocument(f"OCR found no text on the PDF's {len(ocr_pages)} page(s) without a text layer", path)
        raise EmptyDocument("PDF has no text layer (scanned pages are read by OCR with ingest.pdf_ocr auto)", path)

    metadata: dict[str, MetadataValue] = {"num_pages": len(pages)}
    if failed_pages:
        metadata["unreadable_pages"] = ",".join(map(str, failed_pages))
    if ocr_pages:
        metadata["ocr_pages"] = ",".join(map(str, ocr_pages))
    if num_tables:
        metadata["num_tables"] = num_tables
    title: str | None = None
    try:
        info = reader.metadata
    except Exception:  # a broken info dictionary must not cost the text
        info = None
    if info is not None:
        if isinstance(info.title, str) and info.title.strip():
            title = info.title.strip()
        if isinstance(info.author, str) and info.author.strip():
            metadata["author"] = info.author.strip()
    return title, sections, metadata


def _has_images(page: Any) -> bool:
    """Whether a page draws an image (a page without one and without text is blank: nothing for OCR)."""
    try:
        return len(page.images) > 0
    except Exception:  # a damaged resource dictionary: let OCR look at the rendered page
        return True


class _Layout:
    """What pypdf does not read: tables (pdfplumber) and page images for OCR (pdfium), each opened on first use.
    A table that cannot be read leaves the page's plain text; a page OCR cannot render is a page without text."""

    def __init__(self, data: bytes, path: str | None, block_chars: int) -> None:
        self._data = data
        self._path = path
        self._block_chars = block_chars
        self._plumber: Any = None
        self._pdfium: Any = None

    def tables(self, index: int) -> Any:
        from ingest.loaders.pdf_tables import page_with_tables

        try:
            if self._plumber is None:
                import pdfplumber

                self._plumber = pdfplumber.open(io.BytesIO(self._data))
            found = page_with_tables(self._plumber.pages[index], self._block_chars)
        except MemoryError:
            raise
        except Exception as exc:  # pdfminer fails in many ways on odd files: the text layer stands
            logger.warning("%s: tables of page %d not read: %s: %s", self._path, index + 1, type(exc).__name__, exc)
            return None
        if found is not None and found.tables_skipped:
            logger.info("%s: page %d has too many ruling lines to look for tables", self._path, index + 1)
            return None
        return found

    def ocr(self, index: int) -> str:
        from ingest.loaders.ocr import ocr_image, render_page

        try:
            if self._pdfium is None:
                import pypdfium2

                self._pdfium = pypdfium2.PdfDocument(self._data)
            image = render_page(self._pdfium, index)
        except MemoryError:
            raise
        except Exception as exc:
            logger.warning("%s: page %d not rendered for OCR: %s: %s", self._path, index + 1, type(exc).__name__, exc)
            return ""
        return ocr_image(image)

    def close(self) -> None:
        for doc in (self._plumber, self._pdfium):
            if doc is not None:
                try:
                    doc.close()
                except Exception as exc:  # noqa: BLE001 - closing only frees memory
                    logger.debug("closing a PDF reader: %s", exc)
