"""Submission: one duplicate rule, the job and document rows it writes, and JobError's row form."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from app.build import Services
from app.catalog import DocumentStatus
from app.catalog.records import DocumentRecord, NewDocument
from app.services.ingest import IngestSource, IngestTooLarge, JobError
from app.services.ingest.submission import check_caps, create_job, find_duplicate

TEXT_A = "Quintaro is the capital of Zorblat. It has purple rivers."


def stored(services: Services, job_id: str | None, title: str = "stored") -> DocumentRecord:
    return services.catalog.add_document(NewDocument(title=title, job_id=job_id))


def test_a_stored_document_of_another_job_goes_before_an_earlier_one_of_this_job(services: Services) -> None:
    other = stored(services, "job-1")
    assert find_duplicate(other, "earlier-id", "job-2") == other.id
    assert find_duplicate(None, "earlier-id", "job-2") == "earlier-id"
    # This job's own document is never a stored original: the earlier one of the job is.
    own = dataclasses.replace(other, job_id="job-2")
    assert find_duplicate(own, "earlier-id", "job-2") == "earlier-id"
    assert find_duplicate(own, None, "job-2") is None
    assert find_duplicate(None, None, "job-2") is None


def test_duplicates_in_a_request_are_answered_with_the_first_or_the_stored_id(
    services: Services, tmp_path: Path
) -> None:
    documents = services.documents
    (tmp_path / "n.md").write_text("# N\n\n" + TEXT_A)
    file = IngestSource(kind="file", title="n.md", path=str(tmp_path / "n.md"), source_path="n.md")
    first = create_job(services.catalog, documents, [file, file, IngestSource(kind="text", title="t", text=TEXT_A)])
    n_id, t_id = first.document_ids[0], first.document_ids[2]
    assert first.document_ids == [n_id, n_id, t_id]
    job = services.catalog.get_job(first.job_id)
    duplicate = {"source": "n.md", "error": f"duplicate of document {n_id}", "code": "duplicate", "document_id": n_id}
    assert (job.document_ids, job.duplicate_ids, job.errors) == ([n_id, t_id], [n_id], [duplicate])
    assert job.spec["duplicates"] == [duplicate]
    assert [s["title"] for s in job.spec["sources"]] == ["n.md", "t"]
    digest = hashlib.sha256((tmp_path / "n.md").read_bytes()).hexdigest()
    assert services.catalog.get_document(n_id).metadata == {"file_sha256": digest}
    assert job.progress == {s: {"done": 0, "total": 0} for s in ("parse", "chunk", "embed", "kv", "commit")}
    # The same bytes in a later request: the stored (pending) document answers.
    again = create_job(services.catalog, documents, [file])
    assert again.document_ids == [n_id]
    assert services.catalog.get_job(again.job_id).document_ids == []


def test_a_retry_of_failed_content_replaces_the_failed_document(services: Services, tmp_path: Path) -> None:
    documents = services.documents
    (tmp_path / "n.md").write_text(TEXT_A)
    file = IngestSource(kind="file", title="n.md", path=str(tmp_path / "n.md"))
    failed_id = create_job(services.catalog, documents, [file]).document_ids[0]
    services.catalog.set_document_status(failed_id, DocumentStatus.FAILED, error="it broke")
    retry = create_job(services.catalog, documents, [file])
    assert retry.document_ids != [failed_id]
    assert services.catalog.get_document(failed_id) is None
    assert services.catalog.list_documents()[1] == 1


def test_the_caps_refuse_a_request_before_anything_is_stored(services: Services) -> None:
    limits = services.settings.ingest.model_copy(update={"max_document_tokens": 5, "max_job_tokens": 8})

    def count(text: str) -> int:
        return len(text.split())

    check_caps([IngestSource(kind="text", title="a", text="one two three four")], limits, count)
    with pytest.raises(
        IngestTooLarge, match=r"^document 'a' has 6 tokens; the limit is 5 \(ingest.max_document_tokens\)$"
    ):
        check_caps([IngestSource(kind="text", title="a", text="1 2 3 4 5 6")], limits, count)
    two = [IngestSource(kind="text", title=t, text="1 2 3 4 5") for t in "ab"]
    with pytest.raises(IngestTooLarge, match=r"^the documents have 10 tokens together; the limit per request is 8"):
        check_caps(two, limits, count)
    assert services.catalog.list_documents()[1] == 0


def test_job_errors_keep_the_rows_the_api_shows() -> None:
    failed = JobError(source="a.md", error="document has no text to index", code="empty_document")
    assert failed.to_row() == {"source": "a.md", "error": "document has no text to index", "code": "empty_document"}
    assert list(JobError.duplicate("b.md", "d1").to_row()) == ["source", "error", "code", "document_id"]
    for error in (failed, JobError.duplicate("b.md", "d1"), JobError(source=None, error="disk", code="storage")):
        assert JobError.from_row(error.to_row()) == error
    assert JobError.duplicate("b.md", "d1").is_duplicate and not failed.is_duplicate
