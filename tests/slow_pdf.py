"""A real PDF that is slow to parse, for the ingest tests: every page shares one content stream of many path
operators and one line of text, so pypdf parses the whole stream again for each page's text (issue 62: such
a file runs to the parse time limit). Its time does not depend on luck: 2,000 pages of 20,000 operators (600 KB)
took 0.5 s a page on a 2-core AMX CPU (17 minutes), so a test may treat it as a parse that never ends by
itself (a CPU ten times as fast still needs over a minute and a half)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

PAGE_TEXT = "Slow."


def write_slow_pdf(path: Path, num_pages: int = 2000, num_operators: int = 20_000) -> Path:
    """A valid PDF of `num_pages` pages, each drawing `num_operators` lines and the text PAGE_TEXT."""
    content = f"BT /F1 12 Tf 72 720 Td ({PAGE_TEXT}) Tj ET\n".encode() + b"0 0 m 1 1 l S\n" * num_operators
    font = 4 + num_pages
    kids = " ".join(f"{4 + n} 0 R" for n in range(num_pages))
    page = (
        f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R "
        f"/Resources << /Font << /F1 {font} 0 R >> >> >>"
    ).encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {num_pages} >>".encode(),
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        *([page] * num_pages),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path.write_bytes(bytes(out))
    return path


# What the tests that race a small job against slow PDFs wait for.
WAIT_S = 120.0  # generous: what a loaded 2-core machine may need for a small job's own work
NEVER_S = 600.0  # a parse limit the slow PDFs never reach within a test (they are cancelled first)


def wait_for(what: str, done: Callable[[], bool]) -> None:
    """Poll `done` until it holds; fail naming `what` after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        time.sleep(0.05)
