"""Parsing and chunking are bounded: a DOCX zip bomb is refused before it inflates, text far over the token
cap stops while it is read (and while it is tokenized), paragraphs without text count their markup, a DOCX
stops at its time limit, and a caller's check stops a parse or a chunking between two steps."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import docx
import pytest
from docx_bomb import EMPTY_PARAGRAPH, WHITESPACE_PARAGRAPH, write_docx_bomb

from ingest import Chunker, DocumentTooLarge, IngestSettings, UnreadableDocument, load_path, load_text
from ingest.chunker import OverTokenCap
from ingest.errors import Interrupted, ParseTimeLimit
from ingest.loaders import iter_documents

PARAGRAPH = "Boom goes the paragraph."  # 24 characters
BLOCK_BYTES = len(f"<w:p><w:r><w:t>{PARAGRAPH}</w:t></w:r></w:p>".encode()) * 1024


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Under a MiB on disk, 256 MiB of document.xml inflated."""
    return write_docx_bomb(tmp_path_factory.mktemp("bomb") / "bomb.docx", 256 * 1024 * 1024, PARAGRAPH)


def unpacked_bytes(path: Path) -> int:
    with zipfile.ZipFile(path) as package:
        return sum(info.file_size for info in package.infolist())


def test_a_docx_zip_bomb_is_refused_before_it_inflates(bomb: Path) -> None:
    settings = IngestSettings()
    assert bomb.stat().st_size < 1024 * 1024 < 256 * 1024 * 1024 < unpacked_bytes(bomb)
    with pytest.raises(DocumentTooLarge) as refused:
        list(iter_documents(bomb, settings))
    assert refused.value.message == (
        f"DOCX unpacks to {unpacked_bytes(bomb)} bytes; the limit is {100 * 1024 * 1024} (ingest.max_unpacked_bytes)"
    )


def test_a_docx_that_lies_about_its_sizes_inflates_no_further_than_it_says(tmp_path: Path) -> None:
    path = write_docx_bomb(tmp_path / "liar.docx", 4 * 1024 * 1024, PARAGRAPH)
    data = bytearray(path.read_bytes())
    # Rewrite document.xml's central-directory entry (where the reader takes sizes from) to claim 1,000
    # unpacked bytes: the zip reader stops there and the CRC check fails, so the package is unreadable.
    header = data.index(b"word/document.xml", data.index(b"PK\x01\x02")) - 46
    assert data[header : header + 4] == b"PK\x01\x02"
    data[header + 24 : header + 28] = struct.pack("<I", 1000)
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as package:
        assert package.getinfo("word/document.xml").file_size == 1000
    with pytest.raises(UnreadableDocument, match="not a readable DOCX package|parser failed"):
        load_path(path, IngestSettings())


def test_docx_text_over_the_token_cap_stops_while_it_is_read(tmp_path: Path) -> None:
    path = write_docx_bomb(tmp_path / "long.docx", 2 * 1024 * 1024, PARAGRAPH)  # ~43k paragraphs
    settings = IngestSettings(max_document_tokens=1000)  # 16,000 characters of text
    num_checks = 0

    def check() -> None:
        nonlocal num_checks
        num_checks += 1

    with pytest.raises(DocumentTooLarge) as refused:
        load_path(path, settings, check=check)
    assert refused.value.message == (
        "document has more than 16000 characters of text, more than its token cap allows (ingest.max_document_tokens)"
    )
    # Stopped at the paragraph that passed 16,000 characters, not at the end of the 43k.
    assert num_checks == 16000 // len(PARAGRAPH) + 1


@pytest.mark.parametrize(
    ("block_xml", "markup_bytes"),
    [(WHITESPACE_PARAGRAPH, len(WHITESPACE_PARAGRAPH)), (EMPTY_PARAGRAPH, 11)],  # <w:p/> counts as <w:p></w:p>
)
def test_paragraphs_without_text_count_their_markup_toward_the_cap(
    tmp_path: Path, block_xml: str, markup_bytes: int
) -> None:
    """95 MB of whitespace-only (or empty) paragraphs held the queue for minutes: none of them counted."""
    path = write_docx_bomb(tmp_path / "blank.docx", 2 * 1024 * 1024, block_xml=block_xml)
    num_checks = 0

    def check() -> None:
        nonlocal num_checks
        num_checks += 1

    with pytest.raises(DocumentTooLarge) as refused:
        load_path(path, IngestSettings(max_document_tokens=1000), check=check)
    num_paragraphs = 16000 // markup_bytes + 1  # the one that passed 16,000
    assert num_checks == num_paragraphs
    assert refused.value.message == (
        "document has more than 16000 characters of text and empty-paragraph markup (paragraphs and table rows "
        f"without text count the bytes of their markup: {num_paragraphs * markup_bytes} here), more than its "
        "token cap allows (ingest.max_document_tokens)"
    )


def test_a_docx_parse_stops_at_its_time_limit(tmp_path: Path) -> None:
    path = write_docx_bomb(tmp_path / "long.docx", 1024 * 1024, PARAGRAPH)
    with pytest.raises(ParseTimeLimit) as stopped:
        load_path(path, IngestSettings(max_parse_seconds=1e-9))  # spent before the first element is read
    assert stopped.value.message == "parsing took longer than 1e-09 s, the limit (ingest.max_parse_seconds)"
    assert stopped.value.code == "parse_time_limit"


def test_a_docx_table_is_read_row_by_row_and_counted(tmp_path: Path) -> None:
    document = docx.Document()
    document.add_paragraph("Before.")
    table = document.add_table(rows=3, cols=2)
    for row, values in zip(table.rows, [("Phase", "Weeks"), ("", ""), ("Design", "3")], strict=True):
        for cell, value in zip(row.cells, values, strict=True):
            cell.text = value
    table.cell(0, 0).add_paragraph("kick-off")  # a second paragraph in a cell joins its first
    path = tmp_path / "table.docx"
    document.save(str(path))
    [loaded] = load_path(path, IngestSettings())
    assert loaded.text == "Before.\n\nPhase kick-off | Weeks\nDesign | 3"
    # "Before." (7) + the first row (21) + its newline fit 29 characters; the empty row's markup does not.
    with pytest.raises(DocumentTooLarge):
        load_path(path, IngestSettings(max_document_tokens=2))


def test_plain_text_over_the_character_cap_is_refused_at_parse(tmp_path: Path) -> None:
    path = tmp_path / "long.txt"
    path.write_text("word " * 4000)
    with pytest.raises(DocumentTooLarge, match="more than 16000 characters"):
        load_path(path, IngestSettings(max_document_tokens=1000))
    assert len(load_path(path, IngestSettings(max_document_tokens=2000))[0].text) == 19999


def test_a_check_that_raises_stops_a_docx_parse_and_passes_through(tmp_path: Path) -> None:
    path = write_docx_bomb(tmp_path / "long.docx", 1024 * 1024, PARAGRAPH)
    num_checks = 0

    def check() -> None:
        nonlocal num_checks
        num_checks += 1
        if num_checks == 3:
            raise Interrupted()

    with pytest.raises(Interrupted):
        load_path(path, IngestSettings(), check=check)
    assert num_checks == 3


class CountingTokenizer:
    """The real tokenizer, counting the characters it is asked to encode."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.num_chars = 0

    def encode(self, text: str, **kwargs):
        self.num_chars += len(text)
        return self._tokenizer.encode(text, **kwargs)


def test_chunking_stops_once_a_document_passes_its_token_cap(smollm2_tokenizer) -> None:
    text = "\n\n".join(f"Paragraph {i} says something short." for i in range(2000))
    tokenizer = CountingTokenizer(smollm2_tokenizer)
    chunker = Chunker(tokenizer, chunk_tokens=64, chunk_overlap=8)
    with pytest.raises(OverTokenCap) as over:
        chunker.chunk_document(load_text(text), max_tokens=500)
    assert over.value.max_tokens == 500
    assert tokenizer.num_chars < len(text) // 10  # stopped near the cap, not after tokenizing it all
    # Under the cap: the same chunks as without one.
    short = load_text("\n\n".join(f"Paragraph {i} says something short." for i in range(20)))
    assert chunker.chunk_document(short, max_tokens=500) == chunker.chunk_document(short)


def test_a_check_that_raises_stops_chunking_between_paragraphs(smollm2_tokenizer) -> None:
    document = load_text("\n\n".join(f"Paragraph {i} says something short." for i in range(200)))
    num_checks = 0

    def check() -> None:
        nonlocal num_checks
        num_checks += 1
        if num_checks == 5:
            raise Interrupted()

    with pytest.raises(Interrupted):
        Chunker(smollm2_tokenizer, chunk_tokens=64, chunk_overlap=8).chunk_document(document, check=check)
    assert num_checks == 5
