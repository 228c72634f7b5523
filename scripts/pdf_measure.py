"""PDF tables and scans (issue 64): `python scripts/pdf_measure.py WORKDIR [--model M]`.

OCR: generated A4 scans at 200 dpi (DejaVu Sans; a short paragraph at 12 pt, a dense page of 400 words at 11 and
9 pt), read by `parse_pdf` with `pdf_ocr` auto: character error rate against the rendered text and seconds per
page (median of 3, after one warm-up page). Tables: a two-page PDF of 60 weather stations (fpdf2) and the same
table in Markdown, each ingested (MiniLM, the served retrieval) and asked 180 value questions: how often the
best chunk (and the best 3) holds the value's row with the column headers.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import textwrap
import time
from pathlib import Path

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
SHORT = (
    "Quintaro is the capital of the planet Zorblat. Its rivers run purple in spring, and every May the kite "
    "festival fills the sky above the violet hills. The harbor master records 1,284 ships a year; most carry "
    "copper, amber and granite to the markets of the southern delta. Tickets for the festival cost 12 crowns."
)
HEADER = ["Station", "Rainfall January (mm)", "Rainfall July (mm)", "Sunshine July (h)"]


def scan(text: str, px: int, lead: float) -> bytes:
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (1654, 2339), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.truetype(FONT, px)
    for n, line in enumerate(textwrap.wrap(text, int(1350 / (px * 0.55)))):
        draw.text((150, 150 + int(px * lead) * n), line, font=font, fill=0)
    out = io.BytesIO()
    image.save(out, "PDF", resolution=200.0)
    return out.getvalue()


def cer(found: str, truth: str) -> float:
    a, b = " ".join(found.split()), " ".join(truth.split())
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1] / len(b)


def measure_ocr() -> None:
    from ingest.loaders.pdf import parse_pdf

    rng = random.Random(7)
    words = [
        "river",
        "kite",
        "planet",
        "bread",
        "flour",
        "harbor",
        "signal",
        "copper",
        "orbit",
        "garden",
        "the",
        "of",
        "and",
        "a",
        "to",
        "in",
        "is",
        "was",
        "for",
    ]
    dense = " ".join(rng.choice(words) for _ in range(400)).capitalize() + "."
    parse_pdf(scan("warm up", 34, 1.5), "warm.pdf", ocr="auto")  # the reader is made once per process
    for name, text, px, lead in (
        ("short paragraph, 12 pt", SHORT, 34, 1.75),
        ("dense page, 11 pt", dense, 30, 1.3),
        ("dense page, 9 pt", dense, 26, 1.25),
    ):
        data, times = scan(text, px, lead), []
        for _ in range(3):
            started = time.perf_counter()
            _, sections, _ = parse_pdf(data, "scan.pdf", ocr="auto")
            times.append(time.perf_counter() - started)
        found = "\n".join(s.text for s in sections)
        sys.stdout.write(f"OCR {name}: CER {cer(found, text):.4f}, {sorted(times)[1]:.2f} s a page\n")


def station_rows() -> list[list[str]]:
    names = [f"Station {n}" for n in ("Aldgate", "Birchmoor", "Coldharbour", "Dunmere", "Elmstead")]
    names += [f"Station S{i:02d}" for i in range(55)]
    return [HEADER] + [[name, str(40 + i), str(20 + 2 * i), str(150 + 3 * i)] for i, name in enumerate(names)]


def table_files(work: Path) -> tuple[Path, Path]:
    import fpdf

    rows = station_rows()
    pdf = fpdf.FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=9)
    pdf.multi_cell(0, 5, "Weather stations of the northern valley: rainfall and sunshine by month.")
    pdf.ln(3)
    with pdf.table() as table:
        for cells in rows:
            row = table.row()
            for cell in cells:
                row.cell(cell)
    pdf_path, md_path = work / "stations.pdf", work / "stations.md"
    pdf_path.write_bytes(bytes(pdf.output()))
    lines = ["| " + " | ".join(r) + " |" for r in [rows[0], ["---"] * 4, *rows[1:]]]
    intro = "# Weather stations\n\nWeather stations of the northern valley: rainfall and sunshine by month.\n\n"
    md_path.write_text(intro + "\n".join(lines) + "\n")
    return pdf_path, md_path


def measure_tables(work: Path, model: str) -> None:
    from app.build import build_services
    from app.services.ingest import IngestSource
    from app.settings import load_settings

    header = "| " + " | ".join(HEADER) + " |"
    rows = station_rows()
    questions = [
        (f"What is the {HEADER[col].lower()} at {r[0]}?", "| " + " | ".join(r) + " |")
        for r in rows[1:]
        for col in (1, 2, 3)
    ]
    for name, path in zip(("PDF", "Markdown"), table_files(work), strict=True):
        settings = load_settings(data_dir=work / f"data-{name}", engine={"model": model})
        services = build_services(settings, {"ingest"}, role="worker")
        try:
            assert services.ingest is not None and services.retriever is not None
            source = IngestSource(kind="file", title=path.name, path=str(path), source_path=path.name)
            services.ingest.run_job(services.ingest.submit([source], enqueue=False).job_id)
            top1 = top3 = 0
            for question, row in questions:
                hits = [h.text for h in services.retriever.search(question, top_k=3)]
                top1 += row in hits[0] and header in hits[0]
                top3 += any(row in h and header in h for h in hits)
            n = len(questions)
            sys.stdout.write(f"tables, {name}: the value's row with the headers in the best chunk {top1}/{n}, ")
            sys.stdout.write(f"in the best 3 {top3}/{n}\n")
        finally:
            services.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--model", default="smollm2-135m", help="engine.model (its tokenizer chunks the tables)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    measure_ocr()
    measure_tables(args.workdir, args.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
