"""Parsing lanes (app/services/ingest/lanes.py): small ingests finish while slow PDFs hold every files lane,
each lane's parse process keeps the time limit, and a refused document is logged with its job and name.

The slow PDFs (tests/slow_pdf.py) take many minutes to parse on any CPU, so "still parsing" below is not a
race: the tests end them with a cancel."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from slow_pdf import NEVER_S, wait_for, write_slow_pdf

from app.build import new_ingest
from app.catalog import DocumentStatus, JobStatus
from app.catalog.records import JobRecord
from app.services.ingest import IngestService, IngestSource
from app.services.ingest.lanes import Lane, lane_of, num_parse_workers
from ingest import IngestSettings


def upload(path: Path, name: str) -> IngestSource:
    return IngestSource(kind="file", title=path.name, path=str(path), source_path=name)


def jobs_of(service: IngestService, job_ids: list[str]) -> list[JobRecord]:
    jobs = [service.get_job(job_id) for job_id in job_ids]
    assert all(job is not None for job in jobs)
    return jobs  # type: ignore[return-value]


def finished(service: IngestService, job_ids: list[str]) -> bool:
    return all(job.status.finished for job in jobs_of(service, job_ids))


def test_small_ingests_finish_while_slow_pdfs_hold_every_files_lane(
    make_fast_settings, make_fast_services, tmp_path: Path
) -> None:
    settings = make_fast_settings(
        ingest={"parse_workers": 2, "max_parse_seconds": NEVER_S, "quick_parse_bytes": 64 * 1024}
    )
    services = make_fast_services(settings)
    service = new_ingest(services)
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"title": "Notes", "text": "The kite festival is in May, on the hill."}))
    service.recover()
    service.start()
    try:
        # Three slow PDFs (600 KB each, over the quick lane's 64 KiB), as three uploads.
        pdfs = [write_slow_pdf(tmp_path / f"slow-{n}.pdf", num_pages=2000 + n) for n in range(3)]
        slow = [service.submit([upload(pdf, f"upload:{pdf.name}")]).job_id for pdf in pdfs]
        two_parse = [JobStatus.RUNNING, JobStatus.RUNNING, JobStatus.QUEUED]
        wait_for("both files lanes parse a slow PDF", lambda: [j.status for j in jobs_of(service, slow)] == two_parse)
        # Posted behind them: a one-paragraph JSON ingest (inline text) and a small JSON file.
        inline = service.submit([IngestSource(kind="text", title="Kites", text="Kites fly in May on the hill.")])
        small = service.submit([upload(notes, "upload:notes.json")])
        wait_for("the small jobs finish", lambda: finished(service, [inline.job_id, small.job_id]))
        assert [j.status for j in jobs_of(service, [inline.job_id, small.job_id])] == [JobStatus.SUCCEEDED] * 2
        for doc_id in inline.document_ids + small.document_ids:
            assert services.catalog.get_document(doc_id).status == DocumentStatus.READY
        # The slow PDFs are where they were: two parsing (each has minutes to go), one queued behind them.
        assert [(j.status, j.stage) for j in jobs_of(service, slow)] == [
            (JobStatus.RUNNING, "parse"),
            (JobStatus.RUNNING, "parse"),
            (JobStatus.QUEUED, None),
        ]
        for job_id in slow:
            service.cancel(job_id)
        wait_for("the slow jobs are cancelled", lambda: finished(service, slow))
        assert [j.status for j in jobs_of(service, slow)] == [JobStatus.CANCELLED] * 3
    finally:
        service.stop()


def test_a_pdf_past_the_parse_time_limit_fails_and_is_logged_with_its_job_and_name(
    make_fast_settings, make_fast_services, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    services = make_fast_services(make_fast_settings(ingest={"max_parse_seconds": 0.5}))
    service = new_ingest(services)
    pdf = write_slow_pdf(tmp_path / "slow.pdf")  # 600 KB: the quick lane's parse process
    service.recover()
    service.start()
    try:
        with caplog.at_level(logging.WARNING, logger="app.services.ingest"):
            job_id = service.submit([upload(pdf, "upload:slow.pdf")]).job_id
            wait_for("the slow PDF's job ends", lambda: finished(service, [job_id]))
    finally:
        service.stop()
    message = "parsing took longer than 0.5 s, the limit (ingest.max_parse_seconds)"
    job = service.get_job(job_id)
    assert job is not None
    assert (job.status, job.errors) == (
        JobStatus.FAILED,
        [{"source": "upload:slow.pdf", "error": message, "code": "parse_time_limit"}],
    )
    assert f"ingest job {job_id}: upload:slow.pdf failed (parse_time_limit): {message}" in caplog.messages


def test_a_job_goes_to_the_lane_of_its_files(tmp_path: Path) -> None:
    small = tmp_path / "small.txt"
    small.write_bytes(b"s" * 600)
    other = tmp_path / "other.txt"
    other.write_bytes(b"o" * 600)
    pipe = tmp_path / "pipe.txt"
    os.mkfifo(pipe)
    text = IngestSource(kind="text", title="Note", text="A note.")

    def files(*paths: Path) -> list[IngestSource]:
        return [upload(path, path.name) for path in paths]

    assert lane_of([], 1000) == Lane.INLINE  # only duplicates: nothing to parse
    assert lane_of([text, text], 1000) == Lane.INLINE
    assert lane_of([text, *files(small)], 1000) == Lane.QUICK
    assert lane_of(files(small, other), 1200) == Lane.QUICK
    assert lane_of(files(small, other), 1199) == Lane.FILES  # 1,200 bytes together
    assert lane_of(files(small), 0) == Lane.FILES  # no quick lane
    assert lane_of(files(tmp_path / "gone.txt"), 1000) == Lane.QUICK  # its parse fails at once
    assert lane_of(files(pipe), 1000) == Lane.FILES  # not a regular file: its size says nothing


def test_the_files_lane_is_bounded_by_the_setting_or_the_memory() -> None:
    assert num_parse_workers(IngestSettings(parse_workers=3)) == 3
    # Children may address a quarter of the memory together: at a cap as large as the memory, one.
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert num_parse_workers(IngestSettings(max_parse_memory_bytes=memory)) == 1
