"""A duplicate shares the outcome of the document it duplicates (its original).

A source whose content is stored already, or is being ingested by another job (a `pending` document), is not
ingested again: its job reports it as a duplicate of that document (submission.py at submit, stages.accept at
parse). While the original is pending nobody knows yet whether its content will be stored: the same PDF sent
three times at once used to report two successes for a parse that then failed. So a job whose duplicates'
originals are still pending does not finish with its own stages: it is written `running` at stage `waiting`
and settled once they are (`IngestWorker.settle_waiting`, after every job's end and every cancel, so it
works whichever thread or PostgreSQL worker settles the original). Then a duplicate of an original that was
committed stays a duplicate (the job succeeds), and one of an original that failed fails with the
original's error and code.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from app.catalog import DocumentStatus, JobStatus
from app.catalog.records import JobUpdate
from app.services.ingest.types import JobError, error_rows

if TYPE_CHECKING:
    from app.catalog import Catalog
    from app.catalog.records import DocumentRecord, JobRecord

logger = logging.getLogger(__name__)

WAITING_STAGE = "waiting"  # the job row's stage while its duplicates wait for their originals


class OutcomeWriter:
    """Writes how a job ended once its stages are done, and settles the jobs that wait for originals.

    `serving`: every unfinished job of the catalog will be run (this process recovered its jobs and runs
    the queue, or the PostgreSQL workers run them). Only then does a duplicate wait for a pending original;
    otherwise (`blendrag ingest` beside a job interrupted earlier) it fails at once, saying why."""

    def __init__(self, catalog: Catalog, *, serving: bool) -> None:
        self._catalog = catalog
        self.serving = serving
        self.waiting = False  # a job may be waiting: the index thread looks again every few seconds

    def conclude(self, job_id: str, errors: list[JobError], ready: bool, duplicate_ids: list[str]) -> None:
        """The end of a job whose stages are done (`ready`: one of its own documents was committed): its
        outcome, or stage `waiting` while an original of one of its duplicates is pending."""
        if self.serving and pending_originals(self._catalog, errors):
            change = JobUpdate(stage=WAITING_STAGE, errors=error_rows(errors), duplicate_ids=duplicate_ids)
            self._catalog.update_job(job_id, change)
            self.waiting = True
            # Looked at again once written: an original settled in between found no waiting job to settle.
            if pending_originals(self._catalog, errors):
                logger.info("ingest job %s waits for the outcome of the document(s) it duplicates", job_id)
                self.settle_waiting()  # this job's own documents are settled: jobs waiting on them may go
                return
        self._write(job_id, errors, ready, duplicate_ids)
        self.settle_waiting()

    def settle_waiting(self) -> None:
        """Settle the waiting jobs whose originals are all settled now. Run after every job's end or cancel
        (whichever thread or worker ends it), and every few seconds by the index thread while a job waits."""
        still_waiting = False
        for job in self._catalog.jobs_with_status([JobStatus.RUNNING]):
            if job.stage != WAITING_STAGE:
                continue
            errors = [JobError.from_row(row) for row in job.errors]
            if self.serving and pending_originals(self._catalog, errors):
                still_waiting = True
                continue
            self._write(job.id, errors, self._any_ready(job), job.duplicate_ids)
            logger.info("ingest job %s: the documents it duplicates are settled, and so is the job", job.id)
        self.waiting = still_waiting

    def _write(self, job_id: str, errors: list[JobError], ready: bool, duplicate_ids: list[str]) -> None:
        shared = share_outcomes(self._catalog, job_id, errors)
        # A duplicate of a committed original is not a failure: its content is stored, under the id the 202 gave.
        failures = [e for e in shared if not e.is_duplicate]
        status = JobStatus.SUCCEEDED if ready or not failures else JobStatus.FAILED
        change = JobUpdate(status=status, clear_stage=True, errors=error_rows(shared), duplicate_ids=duplicate_ids)
        self._catalog.update_job(job_id, change)

    def _any_ready(self, job: JobRecord) -> bool:
        docs = (self._catalog.get_document(doc_id) for doc_id in job.document_ids)
        return any(doc is not None and doc.status == DocumentStatus.READY for doc in docs)


def pending_originals(catalog: Catalog, errors: list[JobError]) -> list[str]:
    """The originals of the duplicates among `errors` that are still pending, each once."""
    ids = dict.fromkeys(e.document_id for e in errors if e.is_duplicate and e.document_id is not None)
    pending = []
    for doc_id in ids:
        doc = catalog.get_document(doc_id)
        if doc is not None and doc.status == DocumentStatus.PENDING:
            pending.append(doc_id)
    return pending


def share_outcomes(catalog: Catalog, job_id: str, errors: list[JobError]) -> list[JobError]:
    """`errors` with each duplicate given its original's outcome: committed, it stays a duplicate; failed,
    it becomes the original's failure (error and code, `document_id` naming the original); deleted, or still
    pending where nothing here will settle it (a CLI ingest beside an interrupted job), a failure that says
    so. Each duplicate turned into a failure is logged at WARNING with its job and source."""
    shared: list[JobError] = []
    for error in errors:
        original = catalog.get_document(error.document_id) if error.is_duplicate and error.document_id else None
        if not error.is_duplicate or (original is not None and original.status == DocumentStatus.READY):
            shared.append(error)
            continue
        failure = _failure_of(catalog, error, original)
        logger.warning(
            "ingest job %s: %s is a duplicate of document %s, which did not become ready (%s): %s",
            job_id,
            error.source,
            error.document_id,
            failure.code,
            failure.error,
        )
        shared.append(failure)
    return shared


def _failure_of(catalog: Catalog, duplicate: JobError, original: DocumentRecord | None) -> JobError:
    of = duplicate.document_id
    if original is None:
        message = f"duplicate of document {of}, which was deleted before its ingest finished"
        return JobError(source=duplicate.source, error=message, code="duplicate_deleted", document_id=of)
    if original.status == DocumentStatus.PENDING:
        message = (
            f"duplicate of document {of}, whose ingest (job {original.job_id}) has not finished and is not "
            "running here: it resumes when the server starts; send this source again after that"
        )
        return JobError(source=duplicate.source, error=message, code="duplicate_unsettled", document_id=of)
    message = original.error or "failed"
    return JobError(source=duplicate.source, error=message, code=_code_of(catalog, original), document_id=of)


def _code_of(catalog: Catalog, original: DocumentRecord) -> str:
    """The code the original's own job reported its failure with (the document row keeps the message only);
    `cancelled` when its job was."""
    job = catalog.get_job(original.job_id) if original.job_id else None
    if job is not None and job.status == JobStatus.CANCELLED:
        return "cancelled"
    for row in job.errors if job is not None else []:
        if row.get("error") == original.error and row.get("code") != "duplicate":
            return str(row["code"])
    return "failed"
