"""Scanned PDF pages read by OCR (RapidOCR, its model inside its PyPI package): a page image of rendered text,
read within 5% character error of the text it shows, in the parse child under its memory cap; pages with a text
layer keep it; blank pages are no work for OCR; `ingest.pdf_ocr` off leaves a scan without text."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest
from pypdf import PdfReader, PdfWriter

from app.services.ingest.parse_process import iter_file_documents
from ingest.config import IngestSettings
from ingest.errors import EmptyDocument
from ingest.loaders.pdf import parse_pdf
from ingest.types import Section

pytestmark = pytest.mark.slow  # the OCR models (PP-OCRv4 detection and recognition on onnxruntime)

FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
SCANNED_TEXT = (
    "Quintaro is the capital of the planet Zorblat. Its rivers run purple in spring, and every May the kite "
    "festival fills the sky above the violet hills. The harbor master records 1,284 ships a year; most carry "
    "copper, amber and granite to the markets of the southern delta. Tickets for the festival cost 12 crowns."
)
MAX_CER = 0.05


def scanned_pdf(text: str) -> bytes:
    """One A4 page at 200 dpi that is only an image of `text` (no text layer), as a scanner makes it."""
    from PIL import Image, ImageDraw, ImageFont

    if not FONT.is_file():
        pytest.skip(f"{FONT} (Debian's fonts-dejavu-core) renders the scanned page")
    image = Image.new("L", (1654, 2339), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.truetype(str(FONT), 34)
    for n, line in enumerate(textwrap.wrap(text, 70)):
        draw.text((150, 200 + 60 * n), line, font=font, fill=0)
    out = io.BytesIO()
    image.save(out, "PDF", resolution=200.0)
    return out.getvalue()


def char_error_rate(found: str, truth: str) -> float:
    """Levenshtein distance over the characters (white space runs as one space) / the truth's length."""
    a, b = " ".join(found.split()), " ".join(truth.split())
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1] / len(b)


def test_a_scanned_page_is_read_by_ocr(tmp_path: Path, make_pdf) -> None:
    scan = scanned_pdf(SCANNED_TEXT)
    _, sections, metadata = parse_pdf(scan, "scan.pdf", ocr="auto")
    assert [s.page for s in sections] == [1]
    assert char_error_rate(sections[0].text, SCANNED_TEXT) <= MAX_CER, sections[0].text
    assert metadata == {"num_pages": 1, "ocr_pages": "1"}
    with pytest.raises(EmptyDocument, match=r"no text layer \(scanned pages are read by OCR with ingest.pdf_ocr"):
        parse_pdf(scan, "scan.pdf", ocr="off")

    # A text page, a blank page and the scan: the text layer kept, the blank page left alone, the scan read.
    writer = PdfWriter()
    for part in (make_pdf([["A page with its own text."], []]), scan):
        for page in PdfReader(io.BytesIO(part)).pages:
            writer.add_page(page)
    out = io.BytesIO()
    writer.write(out)
    _, sections, metadata = parse_pdf(out.getvalue(), "mixed.pdf", ocr="auto")
    assert sections[0] == Section("A page with its own text.", page=1)
    assert [s.page for s in sections] == [1, 3]
    assert metadata == {"num_pages": 3, "ocr_pages": "3"}


def test_ocr_runs_in_the_parse_child_under_its_memory_cap(tmp_path: Path) -> None:
    path = tmp_path / "scan.pdf"
    path.write_bytes(scanned_pdf(SCANNED_TEXT))
    settings = IngestSettings(parse_in_subprocess=True, max_parse_seconds=120)  # default memory cap
    [document] = list(iter_file_documents(path, settings))
    assert char_error_rate(document.text, SCANNED_TEXT) <= MAX_CER
    assert document.metadata["ocr_pages"] == "1"
