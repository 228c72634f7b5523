"""A real DOCX zip bomb for the ingest tests: a valid package whose `word/document.xml` inflates to many
times its size on disk (repeated paragraphs deflate ~1000:1), written part by part so building it never
holds the inflated XML in memory."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import docx

_BODY_OPEN = b"<w:body>"
_BODY_CLOSE = b"</w:body>"


def write_docx_bomb(path: Path, inflated_bytes: int, paragraph: str = "Boom goes the paragraph.") -> Path:
    """A DOCX at `path` whose document.xml holds at least `inflated_bytes` bytes of paragraphs of `paragraph`."""
    template = io.BytesIO()
    document = docx.Document()
    document.add_paragraph(paragraph)
    document.save(template)
    with zipfile.ZipFile(template) as source:
        xml = source.read("word/document.xml")
        head, tail = xml.split(_BODY_OPEN, 1)
        _, tail = tail.split(_BODY_CLOSE, 1)
        block = f"<w:p><w:r><w:t>{paragraph}</w:t></w:r></w:p>".encode() * 1024
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as bomb:
            for info in source.infolist():
                if info.filename != "word/document.xml":
                    bomb.writestr(info, source.read(info.filename))
                    continue
                with bomb.open("word/document.xml", "w", force_zip64=inflated_bytes >= 1 << 31) as part:
                    part.write(head + _BODY_OPEN)
                    for _ in range(-(-inflated_bytes // len(block))):
                        part.write(block)
                    part.write(_BODY_CLOSE + tail)
    return path
