"""Pages without a text layer read by OCR: RapidOCR (PP-OCRv4 detection and recognition on onnxruntime), whose
models ship inside its PyPI package (rapidocr-onnxruntime): nothing is downloaded. Pages are rendered with
pdfium (pypdfium2). Runs in the parse process (`ingest/parse_child.py`) under its time and memory limits; the
reader is made once per process, on the first page that needs it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ingest.errors import UnreadableDocument

logger = logging.getLogger(__name__)

RENDER_DPI = 200  # PP-OCR reads body text best at 150-300 dpi; more only costs time
MAX_RENDER_PIXELS = 40_000_000  # a page rendered larger is scaled down (an A0 poster at 200 dpi is 70 Mpx)
MIN_SCORE = 0.5  # recognitions less sure than this are noise (specks, ruling lines)
# Measured on generated scans (tests/ingest/test_pdf_ocr.py): the detector's default box padding (1.6) crops lines
# so tight that the recognizer drops the spaces between words, and its default 2000 px long side shrinks an A4
# page at 200 dpi; 2.0 and 2400 px read every line with its spaces (CER 0-2% against 5-16%).
UNCLIP_RATIO = 2.0
MAX_SIDE_PX = 2400


@dataclass(frozen=True)
class _Line:
    top: float
    bottom: float
    boxes: list[tuple[float, str]]  # (left, text)


@lru_cache(maxsize=1)
def _reader() -> Any:
    try:
        from rapidocr_onnxruntime import RapidOCR
    except ImportError as exc:  # the dependency is declared; a trimmed install may lack it
        raise UnreadableDocument(
            "this PDF page has no text layer and OCR needs rapidocr-onnxruntime: pip install rapidocr-onnxruntime "
            "(or set ingest.pdf_ocr to off)",
            None,
        ) from exc
    reader = RapidOCR()
    reader.max_side_len = MAX_SIDE_PX
    return reader


def render_page(pdf: Any, index: int) -> Any:
    """Page `index` of a pypdfium2 document as an RGB numpy array at RENDER_DPI (less for a huge page)."""
    import numpy as np

    page = pdf[index]
    width, height = page.get_size()  # points
    scale = RENDER_DPI / 72
    pixels = width * height * scale * scale
    if pixels > MAX_RENDER_PIXELS:
        scale *= (MAX_RENDER_PIXELS / pixels) ** 0.5
    image = page.render(scale=scale).to_pil().convert("RGB")
    return np.asarray(image)


def ocr_image(image: Any) -> str:
    """The text of an image, line by line in reading order (top to bottom, left to right)."""
    # No angle classifier: a rendered page is upright, and the classifier turned whole lines upside down.
    result, _ = _reader()(image, use_cls=False, unclip_ratio=UNCLIP_RATIO)
    lines: list[_Line] = []
    for box, text, score in sorted(result or [], key=lambda r: min(p[1] for p in r[0])):
        if float(score) < MIN_SCORE or not str(text).strip():
            continue
        top, bottom = min(p[1] for p in box), max(p[1] for p in box)
        left = min(p[0] for p in box)
        line = lines[-1] if lines else None
        # The same line when the boxes overlap vertically by half the smaller one's height.
        if line is not None and min(bottom, line.bottom) - max(top, line.top) > 0.5 * min(
            bottom - top, line.bottom - line.top
        ):
            line.boxes.append((left, str(text)))
            lines[-1] = _Line(min(top, line.top), max(bottom, line.bottom), line.boxes)
        else:
            lines.append(_Line(top, bottom, [(left, str(text))]))
    return "\n".join(" ".join(t for _, t in sorted(line.boxes)) for line in lines)
