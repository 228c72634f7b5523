"""Files parsed in a killable child process (app/services/ingest/parse_process.py): the same documents and
errors as a parse in the calling thread, and a cancel, the time limit or the memory cap end the child."""

from __future__ import annotations

import io
import json
from pathlib import Path

import docx
import pytest

from app.services.ingest import parse_process
from app.services.ingest.parse_process import iter_file_documents
from ingest import IngestSettings, UnreadableDocument
from ingest.errors import DocumentTooLarge, Interrupted, ParseTimeLimit
from ingest.loaders import iter_documents

IN_CHILD = IngestSettings(parse_in_subprocess=True)


def write_docx(path: Path) -> Path:
    document = docx.Document()
    document.add_heading("Project plan", level=1)
    document.add_paragraph("We build the thing in two phases.")
    document.core_properties.author = "Ada"
    out = io.BytesIO()
    document.save(out)
    path.write_bytes(out.getvalue())
    return path


def child_pid() -> int | None:
    """The parse server's process id (None: none running)."""
    process = parse_process._SERVER._process
    return process.pid if process is not None and process.poll() is None else None


def test_a_child_parses_what_the_thread_parses(tmp_path: Path) -> None:
    plan = write_docx(tmp_path / "plan.docx")
    records = tmp_path / "notes.jsonl"
    records.write_text("\n".join(json.dumps({"title": f"n{i}", "text": f"note {i}"}) for i in range(3)))
    for path in (plan, records):
        in_child = list(iter_file_documents(path, IN_CHILD))
        assert in_child == list(iter_documents(path, IN_CHILD))
    assert [d.title for d in iter_file_documents(records, IN_CHILD)] == ["n0", "n1", "n2"]
    kept = child_pid()
    assert kept is not None  # one parse server, kept for the next file
    list(iter_file_documents(plan, IN_CHILD))
    assert child_pid() == kept


def test_a_childs_loader_error_arrives_as_itself(tmp_path: Path) -> None:
    fake = tmp_path / "fake.docx"
    fake.write_bytes(b"plain text pretending")
    with pytest.raises(UnreadableDocument) as in_thread:
        list(iter_documents(fake, IN_CHILD))
    with pytest.raises(UnreadableDocument) as in_child:
        list(iter_file_documents(fake, IN_CHILD))
    assert (in_child.value.message, in_child.value.path, in_child.value.code) == (
        in_thread.value.message,
        str(fake),
        "unreadable_document",
    )


def test_a_cancel_kills_the_child(tmp_path: Path) -> None:
    plan = write_docx(tmp_path / "plan.docx")

    def cancelled() -> None:
        raise Interrupted()

    list(iter_file_documents(plan, IN_CHILD))
    assert child_pid() is not None
    with pytest.raises(Interrupted):
        list(iter_file_documents(plan, IN_CHILD, check=cancelled))
    assert child_pid() is None  # killed; the next file starts another
    assert [d.title for d in iter_file_documents(plan, IN_CHILD)] == ["Project plan"]


def test_the_time_limit_ends_the_parse_in_the_child_and_from_outside(tmp_path: Path) -> None:
    plan = write_docx(tmp_path / "plan.docx")
    hurried = IngestSettings(parse_in_subprocess=True, max_parse_seconds=1e-9)
    message = "parsing took longer than 1e-09 s, the limit (ingest.max_parse_seconds)"
    # A DOCX looks at the clock itself: the child stops and says why.
    with pytest.raises(ParseTimeLimit) as stopped:
        list(iter_file_documents(plan, hurried))
    assert (stopped.value.message, stopped.value.code) == (message, "parse_time_limit")
    # Without the grace a child has to stop by itself, the waiting side kills it.
    with pytest.raises(ParseTimeLimit) as killed:
        list(iter_file_documents(plan, hurried, grace_s=0))
    assert killed.value.message == message
    assert child_pid() is None


def test_the_memory_cap_fails_the_document(tmp_path: Path) -> None:
    text = tmp_path / "long.txt"
    text.write_bytes(b"word " * (9 * 1024 * 1024))  # 45 MiB read, then decoded and normalized: over 64 MiB
    tight = IngestSettings(parse_in_subprocess=True, max_parse_memory_bytes=64 * 1024 * 1024)
    with pytest.raises(DocumentTooLarge) as refused:
        list(iter_file_documents(text, tight))
    assert refused.value.message == (
        f"parsing needed more than {64 * 1024 * 1024} bytes of memory, the limit (ingest.max_parse_memory_bytes)"
    )
