"""A value in a PDF table is retrieved with its row and column headers: a generated PDF with a long table (two pages)
ingested on the fast stand-ins, every chunk that holds a value's row holds the header row too, even under the toy
tokenizer's one token a character (how well a question finds that chunk is MiniLM's: measured, not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.build import Services
from app.services.ingest import IngestSource

fpdf = pytest.importorskip("fpdf", reason="fpdf2 (a dev dependency) writes the test PDFs")

HEADER = ["Station", "Rainfall January (mm)", "Rainfall July (mm)", "Sunshine July (h)"]
STATIONS = [f"Station {name}" for name in ("Aldgate", "Birchmoor", "Coldharbour", "Dunmere", "Elmstead")]


def rows() -> list[list[str]]:
    # 60 stations: the table is longer than one chunk, so it is cut into blocks.
    names = STATIONS + [f"Station S{i:02d}" for i in range(55)]
    return [HEADER] + [[name, str(40 + i), str(20 + 2 * i), str(150 + 3 * i)] for i, name in enumerate(names)]


def table_pdf(path: Path) -> Path:
    pdf = fpdf.FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=9)
    pdf.multi_cell(0, 5, "Weather stations of the northern valley: rainfall and sunshine by month.")
    pdf.ln(3)
    with pdf.table() as table:
        for cells in rows():
            row = table.row()
            for cell in cells:
                row.cell(cell)
    path.write_bytes(bytes(pdf.output()))
    return path


def test_a_table_value_comes_with_its_headers(fast_services: Services, tmp_path: Path) -> None:
    services = fast_services
    assert services.ingest is not None and services.retriever is not None
    path = table_pdf(tmp_path / "stations.pdf")
    sources = [
        IngestSource(kind="file", title="stations.pdf", path=str(path), source_path="stations.pdf"),
        IngestSource(kind="text", title="Notes", text="Rainfall in the valley is measured every morning by hand."),
    ]
    job = services.ingest.run_job(services.ingest.submit(sources, enqueue=False).job_id)
    assert job.status.value == "succeeded", job.errors
    header_line = "| " + " | ".join(HEADER) + " |"
    assert services.catalog is not None
    doc = next(d for d in services.catalog.all_documents() if d.source_path == "stations.pdf")
    chunks = [c.text for c in services.catalog.chunks_of(doc.id)]
    assert len(chunks) > 2  # the table is cut into several chunks
    for i, name in enumerate(r[0] for r in rows()[1:]):
        row = f"| {name} | {40 + i} | {20 + 2 * i} | {150 + 3 * i} |"
        holding = [c for c in chunks if row in c]
        assert holding and all(header_line in c for c in holding), (row, holding)
