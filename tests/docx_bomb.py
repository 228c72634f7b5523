"""A real DOCX zip bomb for the ingest tests: a valid package whose `word/document.xml` inflates to many
times its size on disk (repeated paragraphs deflate ~1000:1), written part by part so building it never
holds the inflated XML in memory."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import docx

_BODY_OPEN = b"<w:body>"
_BODY_CLOSE = b"</w:body>"
# Optional parts of python-docx's template left out (32 KB packed), so a bomb is as small as an attacker's.
_LEFT_OUT = ("docProps/thumbnail.jpeg", "word/stylesWithEffects.xml")
_RELS = ("_rels/.rels", "word/_rels/document.xml.rels")


# The three shapes of issue 54 (each deflates ~1000:1): paragraphs of text, of one space, and empty ones.
WHITESPACE_PARAGRAPH = "<w:p><w:r><w:t> </w:t></w:r></w:p>"
EMPTY_PARAGRAPH = "<w:p/>"


def text_paragraph(text: str) -> str:
    return f"<w:p><w:r><w:t>{text}</w:t></w:r></w:p>"


def write_docx_bomb(
    path: Path, inflated_bytes: int, paragraph: str = "Boom goes the paragraph.", *, block_xml: str | None = None
) -> Path:
    """A DOCX at `path` whose document.xml holds at least `inflated_bytes` bytes of paragraphs of `paragraph`
    (or of `block_xml`, body markup repeated as it is)."""
    template = io.BytesIO()
    document = docx.Document()
    document.add_paragraph(paragraph)
    document.save(template)
    with zipfile.ZipFile(template) as source:
        xml = source.read("word/document.xml")
        head, tail = xml.split(_BODY_OPEN, 1)
        _, tail = tail.split(_BODY_CLOSE, 1)
        unit = (block_xml or text_paragraph(paragraph)).encode()
        block = unit * max(1, 16 * 1024 // len(unit))  # repeats within deflate's 32 KiB window
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as bomb:
            for info in source.infolist():
                if info.filename in _LEFT_OUT:
                    continue
                if info.filename != "word/document.xml":
                    content = source.read(info.filename)
                    if info.filename in _RELS:  # no relationship to the parts left out
                        content = re.sub(rb"<Relationship [^>]*(?:stylesWithEffects|thumbnail)[^>]*/>", b"", content)
                    bomb.writestr(info, content)
                    continue
                with bomb.open("word/document.xml", "w", force_zip64=inflated_bytes >= 1 << 31) as part:
                    part.write(head + _BODY_OPEN)
                    for _ in range(-(-inflated_bytes // len(block))):
                        part.write(block)
                    part.write(_BODY_CLOSE + tail)
    return path
