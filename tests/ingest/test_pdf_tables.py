"""PDF tables as Markdown tables: generated PDFs (fpdf2) with ruled tables, a long table cut into blocks that each
repeat the header, and a page of thousands of ruling lines (a table bomb) read as plain text."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.config import IngestSettings
from ingest.loaders import load_path
from ingest.loaders.pdf import parse_pdf
from ingest.loaders.pdf_tables import BLOCK_CHARS, MAX_PAGE_EDGES, table_markdown

fpdf = pytest.importorskip("fpdf", reason="fpdf2 (a dev dependency) writes the test PDFs")

ROWS = [
    ["Region", "Q1", "Q2", "Q3"],
    ["North", "1,204", "1,310", "1,455"],
    ["South", "987", "1,022", "1,101"],
    ["East | West", "412", "433", "470"],
]


def table_pdf(rows: list[list[str]], before: str, after: str) -> bytes:
    pdf = fpdf.FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=11)
    pdf.multi_cell(0, 6, before)
    pdf.ln(4)
    with pdf.table() as table:
        for cells in rows:
            row = table.row()
            for cell in cells:
                row.cell(cell)
    pdf.ln(4)
    pdf.multi_cell(0, 6, after)
    return bytes(pdf.output())


def test_a_table_is_a_markdown_table_between_its_text(tmp_path: Path) -> None:
    data = table_pdf(ROWS, "Quarterly revenue by region, in thousands of euros.", "The South grew least.")
    _, sections, metadata = parse_pdf(data, "revenue.pdf", tables=True)
    assert [s.page for s in sections] == [1]
    assert sections[0].text == (
        "Quarterly revenue by region, in thousands of euros.\n\n"
        "| Region | Q1 | Q2 | Q3 |\n"
        "| --- | --- | --- | --- |\n"
        "| North | 1,204 | 1,310 | 1,455 |\n"
        "| South | 987 | 1,022 | 1,101 |\n"
        "| East \\| West | 412 | 433 | 470 |\n\n"
        "The South grew least."
    )
    assert metadata == {"num_pages": 1, "num_tables": 1}
    # Off: the text layer as before.
    _, plain, metadata = parse_pdf(data, "revenue.pdf", tables=False)
    assert plain[0].text.splitlines()[1:3] == ["Region Q1 Q2 Q3", "North 1,204 1,310 1,455"]
    assert metadata == {"num_pages": 1}
    # Through the loaders, by the setting.
    (tmp_path / "revenue.pdf").write_bytes(data)
    [document] = load_path(tmp_path / "revenue.pdf", IngestSettings(pdf_tables=True))
    assert "| North | 1,204 | 1,310 | 1,455 |" in document.text


def test_a_long_table_repeats_its_header_in_every_block() -> None:
    rows = [["Item", "Price"]] + [[f"item number {i:03d}", f"{i}.00"] for i in range(100)]
    markdown = table_markdown(rows)
    blocks = markdown.split("\n\n")
    assert len(blocks) == 6  # 100 rows of 27 or 28 characters, 16 or 17 to a block of 512 with the header
    for block in blocks:
        assert block.startswith("| Item | Price |\n| --- | --- |\n| item number ")
        assert len(block) <= BLOCK_CHARS
    body = [line for b in blocks for line in b.splitlines()[2:]]
    assert body == [f"| item number {i:03d} | {i}.00 |" for i in range(100)]
    assert table_markdown([[None, ""], ["", None]]) == ""  # no text: no table
    assert table_markdown([["a"], ["b", "c"]]) == "| a |  |\n| --- | --- |\n| b | c |"  # ragged rows padded


def test_a_page_of_thousands_of_ruling_lines_is_read_as_plain_text() -> None:
    pdf = fpdf.FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=11)
    pdf.multi_cell(0, 6, "A drawing of many lines.")
    for i in range(MAX_PAGE_EDGES + 100):  # a grid far denser than any table: each line crosses the others
        x = 10 + (i % 190)
        pdf.line(x, 40, x, 280) if i % 2 else pdf.line(10, 40 + (i % 240), 200, 40 + (i % 240))
    _, sections, metadata = parse_pdf(bytes(pdf.output()), "bomb.pdf", tables=True)
    assert sections[0].text == "A drawing of many lines."
    assert metadata == {"num_pages": 1}


def test_damaged_table_pdfs_are_documents_or_loader_errors() -> None:
    """Fuzz cases: the table PDF with bytes overwritten, cut short or repeated parses or fails as a LoaderError,
    never with another exception (the same seed every run)."""
    import random

    from ingest.errors import LoaderError
    from ingest.loaders import load_bytes

    data = table_pdf(ROWS, "Quarterly revenue by region.", "The end.")
    rng = random.Random(64)
    settings = IngestSettings(pdf_tables=True, pdf_ocr="auto")
    outcomes = {"parsed": 0, "refused": 0}
    for case in range(24):
        mutated = bytearray(data)
        if case % 3 == 0:
            for _ in range(rng.randint(1, 20)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        elif case % 3 == 1:
            mutated = mutated[: rng.randrange(len(mutated))]
        else:
            start = rng.randrange(len(mutated))
            mutated[start:start] = mutated[start : start + rng.randint(1, 400)] * rng.randint(2, 50)
        try:
            load_bytes(bytes(mutated), "fuzz.pdf", settings)
            outcomes["parsed"] += 1
        except LoaderError:
            outcomes["refused"] += 1
    assert outcomes["parsed"] + outcomes["refused"] == 24
