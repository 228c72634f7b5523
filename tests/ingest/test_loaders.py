"""Loaders: every format on small files made here, the typed errors, and folder walking."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import docx
import pytest
from pypdf import PdfReader, PdfWriter

from ingest import (
    DocumentTooLarge,
    EmptyDocument,
    EncryptedDocument,
    IngestSettings,
    LoadedDocument,
    Section,
    UnreadableDocument,
    UnsupportedFormat,
    content_hash,
    detect_format,
    iter_load,
    iter_paths,
    load_bytes,
    load_path,
    load_text,
    normalize_text,
)
from ingest.errors import TooManyRecords
from ingest.loaders import iter_documents

HTML_PAGE = b"""<!doctype html>
<html lang="en"><head><title>  Solar   Power </title>
<meta name="description" content="How panels work">
<style>p { color: red }</style><script>var tracking = "SCRIPT-TEXT";</script></head>
<body>
<header><div>SITE-BANNER</div></header>
<nav><a href="/">NAV-HOME</a><a href="/about">NAV-ABOUT</a></nav>
<main>
<h1>How solar panels work</h1>
<p>Panels turn   <b>sunlight</b>
into electricity.</p>
<!-- COMMENT-TEXT -->
<ul><li>Silicon cells</li><li>An <i>inverter</i></li></ul>
<table><tr><th>Part</th><th>Cost</th></tr><tr><td>Panel</td><td>200</td></tr></table>
<p>First line<br>second line</p>
<div hidden>HIDDEN-TEXT</div>
<pre>def f(x):
    return x</pre>
</main>
<aside>ASIDE-ADS</aside><footer>FOOTER-TEXT</footer><noscript>NOSCRIPT-TEXT</noscript>
</body></html>"""

HTML_TEXT = (
    "How solar panels work\n\n"
    "Panels turn sunlight into electricity.\n\n"
    "- Silicon cells\n"
    "- An inverter\n\n"
    "Part | Cost\n"
    "Panel | 200\n\n"
    "First line\n"
    "second line\n\n"
    "def f(x):\n"
    "    return x"
)


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def only(documents: list[LoadedDocument]) -> LoadedDocument:
    assert len(documents) == 1
    return documents[0]


# -- settings ------------------------------------------------------------------------------------------


def test_settings_defaults_and_validation() -> None:
    settings = IngestSettings()
    assert (settings.chunk_tokens, settings.chunk_overlap, settings.json_text_field) == (512, 64, "text")
    assert settings.allowed_extensions == sorted(
        ["txt", "text", "md", "markdown", "html", "htm", "xhtml", "pdf", "docx", "json", "jsonl", "ndjson"]
    )
    assert IngestSettings(allowed_extensions=[".PDF", "txt"]).allowed_extensions == ["pdf", "txt"]
    with pytest.raises(ValueError, match="chunk_overlap"):
        IngestSettings(chunk_tokens=64, chunk_overlap=64)
    with pytest.raises(ValueError, match="no loader"):
        IngestSettings(allowed_extensions=["exe"])
    with pytest.raises(ValueError, match="extra"):
        IngestSettings(chunk_size=3)


# -- text and markdown ---------------------------------------------------------------------------------


def test_txt_is_normalized_and_hashed(tmp_path: Path) -> None:
    raw = b"\xef\xbb\xbfHello\xc2\xa0world  \r\n\r\n\r\n\r\nSecond\tpara\x07.\n"
    path = write(tmp_path / "notes.txt", raw)
    document = only(load_path(path))
    assert document.text == "Hello world\n\nSecond\tpara."
    assert document.sections == [Section("Hello world\n\nSecond\tpara.", None)]
    assert (document.title, document.format, document.mime_type) == ("notes.txt", "txt", "text/plain")
    assert document.source_path == str(path)
    assert document.content_hash == content_hash("Hello world\n\nSecond\tpara.")
    assert len(document.content_hash) == 64


def test_txt_falls_back_to_cp1252(tmp_path: Path) -> None:
    path = write(tmp_path / "legacy.txt", "Café – naïve".encode("cp1252"))
    assert only(load_path(path)).text == "Café – naïve"


def test_same_text_same_hash_across_formats(tmp_path: Path) -> None:
    plain = only(load_path(write(tmp_path / "a.txt", "Alpha beta.\n\nGamma.")))
    page = "<html><body><p>Alpha beta.</p><p>Gamma.</p></body></html>"
    html = only(load_path(write(tmp_path / "a.html", page)))
    assert plain.content_hash == html.content_hash


def test_markdown_front_matter_becomes_metadata(tmp_path: Path) -> None:
    source = "---\ntitle: Release notes\nversion: 3\ntags: [a, b]\n---\n# Heading\n\nBody text.\n"
    document = only(load_path(write(tmp_path / "notes.md", source)))
    assert document.title == "Release notes"
    assert document.text == "# Heading\n\nBody text."
    assert document.metadata == {"title": "Release notes", "version": 3}
    assert (document.format, document.mime_type) == ("md", "text/markdown")

    kept = only(load_path(tmp_path / "notes.md", IngestSettings(md_strip_front_matter=False)))
    assert kept.text == source.strip()
    assert kept.title == "Heading"


def test_markdown_heading_attribute_lists_are_stripped(tmp_path: Path) -> None:
    source = (
        "# Query Parameters { #query-parameters }\n\nUse `q`.\n\n"
        '## Defaults {.note data-x="a b" #defaults}\n\nSet {#not-a-heading} in text.\n\n'
        "### Sets { of things }\n"
    )
    document = only(load_path(write(tmp_path / "params.md", source)))
    assert document.title == "Query Parameters"
    assert document.text == (
        "# Query Parameters\n\nUse `q`.\n\n## Defaults\n\nSet {#not-a-heading} in text.\n\n### Sets { of things }"
    )  # only real attribute lists, only on headings


def test_markdown_title_is_the_first_h1_outside_code_fences(tmp_path: Path) -> None:
    # The httpx docs' index.md: a `#` shell comment inside a fence came before the real heading.
    source = (
        "```bash\n# The command line client is an optional dependency.\n$ pip install 'httpx[cli]'\n```\n\n"
        "~~~~\n# still code\n~~~\n# still code, the fence needs four tildes\n~~~~\n\n"
        "## Features\n\n# HTTPX {#top}\n\nA client.\n\n# Second H1\n"
    )
    assert only(load_path(write(tmp_path / "index.md", source))).title == "HTTPX"


def test_markdown_setext_h1_and_no_h1_falls_back_to_the_file_name(tmp_path: Path) -> None:
    assert only(load_path(write(tmp_path / "a.md", "Intro text\n\nGuide\n=====\n\nBody.\n"))).title == "Guide"
    # README.md with only lower-level headings was titled "Features"; a file name says more.
    readme = "Some text.\n\n## Features\n\n* fast\n\n### Install\n"
    assert only(load_path(write(tmp_path / "README.md", readme))).title == "README.md"
    assert only(load_path(write(tmp_path / "nav.html", "<ul><li>Home</li></ul>"))).title == "nav.html"


def test_markdown_horizontal_rule_is_not_front_matter(tmp_path: Path) -> None:
    source = "---\nJust a rule, then some prose.\n---\nMore."
    # The block is a YAML *string*, not a mapping: it stays in the text.
    document = only(load_path(write(tmp_path / "rule.md", source)))
    assert document.text == source
    assert document.title == "rule.md"


# -- html ------------------------------------------------------------------------------------------------


def test_html_keeps_readable_text_only(tmp_path: Path) -> None:
    document = only(load_path(write(tmp_path / "page.html", HTML_PAGE)))
    assert document.text == HTML_TEXT
    assert document.title == "Solar Power"
    assert document.metadata == {"language": "en", "description": "How panels work"}
    for dropped in ("SCRIPT", "BANNER", "NAV-", "COMMENT", "HIDDEN", "ASIDE", "FOOTER", "NOSCRIPT", "color"):
        assert dropped not in document.text


def test_html_title_falls_back_to_h1_and_charset_is_honoured(tmp_path: Path) -> None:
    page = '<html><head><meta charset="iso-8859-1"></head><body><h1>Größe</h1><p>Maß</p></body></html>'
    document = only(load_path(write(tmp_path / "x.htm", page.encode("iso-8859-1"))))
    assert (document.title, document.text) == ("Größe", "Größe\n\nMaß")


def test_html_deep_nesting_does_not_recurse(tmp_path: Path) -> None:
    page = "<html><body>" + "<div>" * 3000 + "deep" + "</div>" * 3000 + "</body></html>"
    assert only(load_path(write(tmp_path / "deep.html", page))).text == "deep"


def test_html_without_text_is_empty(tmp_path: Path) -> None:
    path = write(tmp_path / "blank.html", "<html><body><script>x()</script><nav>menu</nav></body></html>")
    with pytest.raises(EmptyDocument):
        load_path(path)


# -- pdf -------------------------------------------------------------------------------------------------


def test_pdf_pages_become_sections(tmp_path: Path, make_pdf) -> None:
    data = make_pdf([["Page one, first line.", "Second line (in parens)."], ["Page two text."]], title="Annual Report")
    assert len(PdfReader(io.BytesIO(data)).pages) == 2
    document = only(load_path(write(tmp_path / "report.pdf", data)))
    assert document.sections == [
        Section("Page one, first line.\nSecond line (in parens).", page=1),
        Section("Page two text.", page=2),
    ]
    assert document.text == "Page one, first line.\nSecond line (in parens).\n\nPage two text."
    assert document.title == "Annual Report"
    assert document.metadata == {"num_pages": 2}
    assert (document.format, document.mime_type) == ("pdf", "application/pdf")


def test_pdf_blank_pages_keep_numbering(tmp_path: Path, make_pdf) -> None:
    document = only(load_path(write(tmp_path / "gaps.pdf", make_pdf([[], ["Only page two."], []]))))
    assert document.sections == [Section("Only page two.", page=2)]
    assert document.metadata == {"num_pages": 3}
    assert document.title == "gaps.pdf"


def test_pdf_without_text_layer_is_empty(tmp_path: Path, make_pdf) -> None:
    with pytest.raises(EmptyDocument, match="no text layer"):
        load_path(write(tmp_path / "scan.pdf", make_pdf([[], []])))


def _encrypt(data: bytes, user_password: str, owner_password: str | None = None) -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    writer.encrypt(user_password=user_password, owner_password=owner_password, algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_pdf_with_user_password_is_encrypted_error(tmp_path: Path, make_pdf) -> None:
    path = write(tmp_path / "secret.pdf", _encrypt(make_pdf([["Top secret."]]), "hunter2"))
    with pytest.raises(EncryptedDocument) as caught:
        load_path(path)
    assert caught.value.path == str(path)
    assert caught.value.code == "encrypted_document"
    assert "password" in str(caught.value)


def test_pdf_with_owner_password_only_opens(tmp_path: Path, make_pdf) -> None:
    path = write(tmp_path / "restricted.pdf", _encrypt(make_pdf([["Readable anyway."]]), "", "owner"))
    assert only(load_path(path)).sections == [Section("Readable anyway.", page=1)]


def test_corrupt_pdf_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(UnreadableDocument):
        load_path(write(tmp_path / "broken.pdf", b"%PDF-1.4\nthis is not a pdf at all"))


# -- docx ------------------------------------------------------------------------------------------------


def _docx_bytes() -> bytes:
    document = docx.Document()
    document.add_heading("Project plan", level=1)
    document.add_paragraph("We build the thing in two phases.")
    document.add_paragraph("")
    table = document.add_table(rows=2, cols=2)
    for row, values in zip(table.rows, [("Phase", "Weeks"), ("Design", "3")], strict=True):
        for cell, value in zip(row.cells, values, strict=True):
            cell.text = value
    document.add_paragraph("Then we ship.")
    document.core_properties.author = "Ada"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_docx_paragraphs_and_tables_in_order(tmp_path: Path) -> None:
    document = only(load_path(write(tmp_path / "plan.docx", _docx_bytes())))
    assert document.text == (
        "Project plan\n\nWe build the thing in two phases.\n\nPhase | Weeks\nDesign | 3\n\nThen we ship."
    )
    assert document.title == "Project plan"
    assert document.metadata == {"author": "Ada"}
    assert document.format == "docx"


def test_docx_that_is_not_a_zip_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(UnreadableDocument, match="DOCX"):
        load_path(write(tmp_path / "fake.docx", b"plain text pretending"))


def test_password_protected_docx_is_encrypted(tmp_path: Path) -> None:
    # Office writes protected files as an OLE container with an "EncryptedPackage" stream.
    ole = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 100 + "EncryptedPackage".encode("utf-16-le")
    with pytest.raises(EncryptedDocument):
        load_path(write(tmp_path / "locked.docx", ole))


# -- json / jsonl ----------------------------------------------------------------------------------------


def test_json_records_become_documents(tmp_path: Path) -> None:
    records = [
        {"id": "a1", "title": "Alpha", "text": "First record.", "score": 0.5, "nested": {"x": 1}},
        {"text": "   "},
        {"title": "No text here"},
        {"text": "Second record.", "lang": "en"},
        "A bare string record.",
    ]
    documents = load_path(write(tmp_path / "data.json", json.dumps(records)))
    assert [(d.title, d.text, d.metadata) for d in documents] == [
        ("Alpha", "First record.", {"id": "a1", "score": 0.5, "record_index": 0}),
        ("data #4", "Second record.", {"lang": "en", "record_index": 3}),
        ("data #5", "A bare string record.", {"record_index": 4}),
    ]
    assert all(d.format == "json" and d.source_path == str(tmp_path / "data.json") for d in documents)


def test_jsonl_line_holding_raw_line_separators_is_one_record(tmp_path: Path) -> None:
    """Valid JSON Lines: U+2028, U+2029 and U+0085 are allowed raw inside a JSON string."""
    line = '{"title": "Q3\u2028report", "text": "Revenue\u2029grew\x85by four percent."}'
    documents = load_path(write(tmp_path / "raw.jsonl", line + "\r\n" + '{"text": "two"}'))
    assert [d.title for d in documents] == ["Q3\u2028report", "raw #2"]
    assert documents[0].text.split() == ["Revenue", "grew", "by", "four", "percent."]


def test_json_single_object_and_custom_fields(tmp_path: Path) -> None:
    settings = IngestSettings(json_text_field="body.content", json_title_field="headline")
    path = write(tmp_path / "one.json", json.dumps({"headline": "Hi", "body": {"content": "Nested text."}}))
    document = only(load_path(path, settings))
    assert (document.title, document.text) == ("Hi", "Nested text.")


def test_jsonl_lines_and_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.jsonl", '{"text": "one", "title": "T1"}\n\n{"text": "two"}\n')
    assert [(d.title, d.text, d.format) for d in load_path(path)] == [
        ("T1", "one", "jsonl"),
        ("rows #2", "two", "jsonl"),
    ]
    bad = write(tmp_path / "bad.jsonl", '{"text": "ok"}\n{"text": broken}\n')
    with pytest.raises(UnreadableDocument, match="line 2"):
        load_path(bad)
    with pytest.raises(EmptyDocument, match="'text'"):
        load_path(write(tmp_path / "none.jsonl", '{"body": "x"}\n'))
    with pytest.raises(UnreadableDocument, match="line 1 column"):
        load_path(write(tmp_path / "bad.json", "{not json"))


def test_json_array_records_stream_one_at_a_time(tmp_path: Path) -> None:
    # Record 3 is broken: the two before it come out first, parsed on their own.
    path = write(tmp_path / "big.json", '[ {"text": "one"} ,\n {"text": "two"},\n {"text": oops} ]')
    stream = iter_documents(path)
    assert [next(stream).text, next(stream).text] == ["one", "two"]
    with pytest.raises(UnreadableDocument, match="line 3 column 11"):
        next(stream)
    for bad, where in (
        ('[{"text": "a"} {"text": "b"}]', "line 1 column 16: expected ',' or ']'"),
        ('[{"text": "a"}] x', "line 1 column 17: extra data after the array"),
    ):
        with pytest.raises(UnreadableDocument, match=re.escape(where)):
            load_path(write(tmp_path / "bad.json", bad))
    with pytest.raises(EmptyDocument):
        load_path(write(tmp_path / "ws.json", " \n[\n]\n"))


def test_records_over_the_per_file_cap_are_refused_early(tmp_path: Path) -> None:
    settings = IngestSettings(max_records_per_file=3)
    rows = "".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(5))
    path = write(tmp_path / "rows.jsonl", rows)
    stream = iter_documents(path, settings)
    assert [next(stream).text for _ in range(3)] == ["row 0", "row 1", "row 2"]
    with pytest.raises(TooManyRecords, match=r"more than 3 records \(ingest.max_records_per_file\)") as caught:
        next(stream)
    assert caught.value.code == "too_many_records" and caught.value.path == str(path)
    assert len(load_path(path, IngestSettings(max_records_per_file=5))) == 5
    with pytest.raises(ValueError, match="max_records_per_file"):
        IngestSettings(max_records_per_file=0)


# -- errors, bytes, text -----------------------------------------------------------------------------------


def test_empty_file_is_empty_document(tmp_path: Path) -> None:
    for name in ("empty.txt", "blank.md", "empty.pdf", "empty.json"):
        path = write(tmp_path / name, b"  \n\n" if name == "blank.md" else b"")
        with pytest.raises(EmptyDocument) as caught:
            load_path(path)
        assert caught.value.path == str(path)


def test_unsupported_extensions(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedFormat, match=r"\.png"):
        load_path(write(tmp_path / "image.png", b"\x89PNG"))
    with pytest.raises(UnsupportedFormat, match="legacy Word"):
        load_path(write(tmp_path / "old.doc", b"x"))
    with pytest.raises(UnsupportedFormat, match="no extension"):
        load_path(write(tmp_path / "README", b"x"))
    with pytest.raises(UnsupportedFormat, match="disabled"):
        load_path(write(tmp_path / "a.md", b"x"), IngestSettings(allowed_extensions=["txt"]))
    assert detect_format("X.MARKDOWN") == "md"


def test_binary_missing_and_too_large(tmp_path: Path) -> None:
    with pytest.raises(UnreadableDocument, match="binary"):
        load_path(write(tmp_path / "bin.txt", b"abc\x00\x01\x02"))
    with pytest.raises(UnreadableDocument, match="no such file"):
        load_path(tmp_path / "missing.txt")
    with pytest.raises(DocumentTooLarge):
        load_path(write(tmp_path / "big.txt", b"x" * 101), IngestSettings(max_file_bytes=100))
    with pytest.raises(DocumentTooLarge):
        load_bytes(b"x" * 101, "big.txt", IngestSettings(max_file_bytes=100))


def test_load_bytes_uses_filename_for_format_and_title() -> None:
    document = only(load_bytes(b"<p>Hello</p>", "upload.html", source_path="uploads/42"))
    assert (document.text, document.title, document.source_path, document.format) == (
        "Hello",
        "upload.html",
        "uploads/42",
        "html",
    )


def test_load_text_direct() -> None:
    document = load_text("  Body line one.\r\nline two  ", title=" Pasted ", metadata={"origin": "ui"})
    assert (document.title, document.text, document.metadata) == (
        "Pasted",
        "Body line one.\nline two",
        {"origin": "ui"},
    )
    assert (document.format, document.source_path, document.sections[0].page) == ("txt", None, None)
    assert load_text("First line is the title\nrest").title == "First line is the title"
    assert load_text("x" * 100).title == "x" * 79 + "…"
    with pytest.raises(EmptyDocument):
        load_text(" \n ")


def test_normalize_text_rules() -> None:
    assert normalize_text("a\u200bb\u00adc \n\n\n\nd\x0ce\r\nf\u00a0g\x07") == "abc\n\nd\ne\nf g"
    assert normalize_text("e\u0301") == "\u00e9"  # NFC


# -- folders -------------------------------------------------------------------------------------------------


def test_iter_paths_recursive_sorted_skips_hidden(tmp_path: Path) -> None:
    for name in (
        "b.txt",
        "a.md",
        "sub/z.txt",
        "sub/deeper/y.pdf",
        ".hidden.txt",
        ".git/config.txt",
        "sub/.secret.md",
        "image.png",
    ):
        write(tmp_path / "docs" / name, b"x")
    explicit = write(tmp_path / "extra.png", b"x")
    found = list(iter_paths([tmp_path / "docs", explicit, tmp_path / "docs" / "a.md"]))
    rel = [str(path.relative_to(tmp_path)) for path in found]
    assert rel == ["docs/a.md", "docs/b.txt", "docs/image.png", "docs/sub/deeper/y.pdf", "docs/sub/z.txt", "extra.png"]
    filtered = list(iter_paths([tmp_path / "docs"], extensions={"txt", "md"}))
    assert [str(p.relative_to(tmp_path)) for p in filtered] == ["docs/a.md", "docs/b.txt", "docs/sub/z.txt"]


def test_iter_load_reports_each_failure_and_continues(tmp_path: Path, make_pdf) -> None:
    write(tmp_path / "in" / "1-good.txt", "Good text.")
    write(tmp_path / "in" / "2-empty.txt", "")
    write(tmp_path / "in" / "3-locked.pdf", _encrypt(make_pdf([["x"]]), "pw"))
    write(tmp_path / "in" / "4-records.jsonl", '{"text": "r1"}\n{"text": "r2"}\n')
    write(tmp_path / "in" / "5-photo.jpg", b"\xff\xd8")  # not an allowed extension: skipped in folders
    named = write(tmp_path / "named.xyz", b"x")  # named explicitly: reported
    results = list(iter_load([tmp_path / "in", named]))
    summary = [(r.path.name, r.ok, [d.text for d in r.documents], r.error and r.error.code) for r in results]
    assert summary == [
        ("1-good.txt", True, ["Good text."], None),
        ("2-empty.txt", False, [], "empty_document"),
        ("3-locked.pdf", False, [], "encrypted_document"),
        ("4-records.jsonl", True, ["r1", "r2"], None),
        ("named.xyz", False, [], "unsupported_format"),
    ]
