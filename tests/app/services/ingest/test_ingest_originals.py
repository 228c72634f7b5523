"""A duplicate shares its original's outcome (app/services/ingest/originals.py): the same file sent three times
at once reports the one parse's failure three times, or its success; a job waits for a pending original
without holding a thread, is cancelled at once while it waits, waits again after a restart, and fails with a
reason where nothing will ingest the original."""

from __future__ import annotations

from pathlib import Path

from slow_pdf import NEVER_S, wait_for, write_slow_pdf

from app.build import Services, new_ingest
from app.catalog import DocumentStatus, JobStatus
from app.catalog.records import JobRecord
from app.services.ingest import IngestService, IngestSource


def upload(path: Path) -> IngestSource:
    return IngestSource(kind="file", title=path.name, path=str(path), source_path=f"upload:{path.name}")


def job(service: IngestService, job_id: str) -> JobRecord:
    found = service.get_job(job_id)
    assert found is not None
    return found


def sent_three_times(services: Services, path: Path) -> tuple[IngestService, list[str], str]:
    """The same file submitted three times before the worker starts (so all three are accepted while the
    first one's document is pending), then the worker started. Returns the service, the job ids and the
    first job's document id."""
    service = new_ingest(services)
    submitted = [service.submit([upload(path)]) for _ in range(3)]
    original = submitted[0].document_ids[0]
    assert [s.document_ids for s in submitted] == [[original]] * 3  # the 202s name the one document
    service.recover()
    service.start()
    return service, [s.job_id for s in submitted], original


def test_the_same_pdf_sent_three_times_fails_three_times_with_its_parse_error(
    make_fast_settings, make_fast_services, tmp_path: Path
) -> None:
    services = make_fast_services(make_fast_settings(ingest={"max_parse_seconds": 1.0}))
    service, job_ids, original = sent_three_times(services, write_slow_pdf(tmp_path / "report.pdf"))
    try:
        wait_for("the three jobs end", lambda: all(job(service, j).status.finished for j in job_ids))
    finally:
        service.stop()
    message = "parsing took longer than 1 s, the limit (ingest.max_parse_seconds)"
    first, *duplicates = (job(service, j) for j in job_ids)
    assert (first.status, first.errors) == (
        JobStatus.FAILED,
        [{"source": "upload:report.pdf", "error": message, "code": "parse_time_limit"}],
    )
    for duplicate in duplicates:
        assert (duplicate.status, duplicate.errors, duplicate.duplicate_ids) == (
            JobStatus.FAILED,
            [{"source": "upload:report.pdf", "error": message, "code": "parse_time_limit", "document_id": original}],
            [original],
        )
    assert services.catalog.get_document(original).status == DocumentStatus.FAILED


def test_the_same_file_sent_three_times_is_stored_once_and_succeeds_three_times(
    make_fast_settings, make_fast_services, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\nThe kite festival is in May, on the hill.\n")
    services = make_fast_services(make_fast_settings())
    service, job_ids, original = sent_three_times(services, notes)
    try:
        wait_for("the three jobs end", lambda: all(job(service, j).status.finished for j in job_ids))
    finally:
        service.stop()
    first, *duplicates = (job(service, j) for j in job_ids)
    assert (first.status, first.errors, first.document_ids) == (JobStatus.SUCCEEDED, [], [original])
    for duplicate in duplicates:
        assert (duplicate.status, duplicate.errors, duplicate.document_ids) == (
            JobStatus.SUCCEEDED,
            [
                {
                    "source": "upload:notes.md",
                    "error": f"duplicate of document {original}",
                    "code": "duplicate",
                    "document_id": original,
                }
            ],
            [],
        )
    assert services.catalog.get_document(original).status == DocumentStatus.READY
    assert services.catalog.list_documents()[1] == 1


def test_duplicates_wait_for_a_slow_original_and_share_its_cancel(
    make_fast_settings, make_fast_services, tmp_path: Path
) -> None:
    services = make_fast_services(make_fast_settings(ingest={"max_parse_seconds": NEVER_S}))
    service, (first, second, third), original = sent_three_times(services, write_slow_pdf(tmp_path / "big.pdf"))
    try:
        waiting = [(JobStatus.RUNNING, "waiting")] * 2
        wait_for(
            "the duplicates wait",
            lambda: [(job(service, j).status, job(service, j).stage) for j in (second, third)] == waiting,
        )
        assert (job(service, first).status, job(service, first).stage) == (JobStatus.RUNNING, "parse")
        # No thread runs a waiting job: a cancel ends it at once.
        assert service.cancel(third).status == JobStatus.CANCELLED
        service.cancel(first)
        wait_for("the original's cancel reaches its duplicate", lambda: job(service, second).status.finished)
    finally:
        service.stop()
    assert [job(service, j).status for j in (first, second, third)] == [
        JobStatus.CANCELLED,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
    ]
    assert job(service, second).errors == [
        {"source": "upload:big.pdf", "error": "ingest cancelled", "code": "cancelled", "document_id": original}
    ]


def test_a_job_waiting_when_the_server_stopped_waits_again_after_the_restart(
    make_fast_settings, make_fast_services, tmp_path: Path
) -> None:
    services = make_fast_services(make_fast_settings(ingest={"max_parse_seconds": NEVER_S}))
    service, (first, second, third), original = sent_three_times(services, write_slow_pdf(tmp_path / "big.pdf"))
    try:
        # Each was queued twice (at submit, then by recover): the second time finds it waiting, and leaves it so.
        wait_for("the duplicates wait", lambda: [job(service, j).stage for j in (second, third)] == ["waiting"] * 2)
    finally:
        service.stop()
    assert (job(service, first).status, job(service, second).status) == (JobStatus.RUNNING, JobStatus.RUNNING)
    restarted = new_ingest(services)
    assert restarted.recover() == [first]  # run again; the waiting jobs are not, they wait again
    restarted.start()
    try:
        wait_for("the original parses again", lambda: job(restarted, first).stage == "parse")
        assert (job(restarted, second).status, job(restarted, second).stage) == (JobStatus.RUNNING, "waiting")
        restarted.cancel(first)
        wait_for("the duplicate ends", lambda: job(restarted, second).status.finished)
    finally:
        restarted.stop()
    assert job(restarted, second).errors == [
        {"source": "upload:big.pdf", "error": "ingest cancelled", "code": "cancelled", "document_id": original}
    ]


def test_a_duplicate_of_a_document_nothing_is_ingesting_fails_instead_of_waiting(
    services: Services, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\nThe kite festival is in May.\n")
    service = new_ingest(services)  # as `blendrag ingest` beside a job an earlier server left unfinished
    left = service.submit([upload(notes)], enqueue=False)
    again = service.submit([upload(notes)], enqueue=False)
    finished = service.run_job(again.job_id)
    original = left.document_ids[0]
    assert (finished.status, finished.errors) == (
        JobStatus.FAILED,
        [
            {
                "source": "upload:notes.md",
                "error": f"duplicate of document {original}, whose ingest (job {left.job_id}) has not finished and "
                "is not running here: it resumes when the server starts; send this source again after that",
                "code": "duplicate_unsettled",
                "document_id": original,
            }
        ],
    )
