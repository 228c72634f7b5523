"""PDF text layer via pypdf, one section per page with its 1-based page number. No OCR."""

from __future__ import annotations

import io
import logging

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


def parse_pdf(data: bytes, path: str | None) -> tuple[str | None, list[Section], dict[str, MetadataValue]]:
    """(title from the PDF info or None, non-empty pages as sections, metadata)."""
    reader = _open(data, path)
    try:
        pages = list(reader.pages)
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        raise UnreadableDocument(f"PDF page tree is damaged: {exc}", path) from exc
    if not pages:
        raise EmptyDocument("PDF has no pages", path)
    sections: list[Section] = []
    failed_pages: list[int] = []
    for page_number, page in enumerate(pages, start=1):
        try:
            text = normalize_text(page.extract_text() or "")
        except Exception as exc:  # pypdf raises many kinds of errors on damaged content streams
            logger.warning("%s: cannot extract text of page %d: %s", path, page_number, exc)
            failed_pages.append(page_number)
            continue
        if text:
            sections.append(Section(text=text, page=page_number))
    if not sections:
        if failed_pages:
            raise UnreadableDocument(f"text extraction failed on every page ({len(failed_pages)})", path)
        raise EmptyDocument("PDF has no text layer (scanned pages need OCR, which is not supported)", path)

    metadata: dict[str, MetadataValue] = {"num_pages": len(pages)}
    if failed_pages:
        metadata["unreadable_pages"] = ",".join(map(str, failed_pages))
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
