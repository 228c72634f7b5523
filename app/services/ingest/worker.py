"""Running ingest jobs: the worker thread and its queue, one job through the stages, a failure written
down even on a full disk (the storage reserve, then retries), and recovery of interrupted jobs.

`recover()` (run at start-up) re-queues interrupted jobs after removing what they had half-written.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from app.catalog import DocumentStatus, JobStatus
from app.catalog.records import JobRecord, JobUpdate
from app.services.ingest import stages
from app.services.ingest.context import IngestEnv, JobContext
from app.services.ingest.progress import Progress, ProgressCallback
from app.services.ingest.types import (
    IngestError,
    IngestSource,
    JobCancelled,
    JobError,
    JobInterrupted,
    WorkItem,
    error_rows,
)
from app.services.storage_faults import is_storage_full

logger = logging.getLogger(__name__)

UNSETTLED_RETRY_S = 5.0  # how often the worker retries marking a job failed that the catalog refused


class IngestWorker:
    def __init__(
        self,
        env: IngestEnv,
        on_chunks_committed: Callable[[int, float], None] | None = None,
        free_space: Callable[[], bool] | None = None,
    ) -> None:
        self._env = env
        self._catalog = env.catalog
        self._on_chunks_committed = on_chunks_committed
        # Releases the storage reserve (True if it did): a failure the client is told of must be written
        # down, or a restart would run the job again and report another outcome.
        self._free_space = free_space
        # Jobs whose failure could not be written (the catalog itself was full): job id → error. They read
        # as failed (settled_view) and the worker writes them down as soon as the catalog takes writes again.
        self._unsettled: dict[str, str] = {}
        self._unsettled_lock = threading.Lock()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one job mutates the index at a time
        # Set by stop(): the running job stops at its next check (inside parse and chunk too) and is resumed
        # by the next start, so shutting down never waits for a long job to finish.
        self._stopping = threading.Event()

    # ---- the thread ------------------------------------------------------------------------------

    def enqueue(self, job_id: str) -> None:
        self._queue.put(job_id)

    def start(self) -> None:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._work, name="ingest-worker", daemon=True)
            self._thread.start()

    def request_stop(self) -> None:
        """Tell the running job to stop at its next check (it resumes at the next start); `stop` waits."""
        self._stopping.set()

    def stop(self) -> None:
        if self._thread is not None:
            self.request_stop()
            self._queue.put(None)
            self._thread.join(timeout=60)
            self._thread = None
        self._settle()  # a failure reported but not yet written: last chance before a restart re-runs it

    def _work(self) -> None:
        while True:
            try:
                job_id = self._queue.get(timeout=UNSETTLED_RETRY_S if self._unsettled else None)
            except queue.Empty:
                self._settle()
                continue
            if job_id is None:
                return
            try:
                self.run_job(job_id)
            except Exception as exc:  # the worker must outlive any one job
                logger.exception("ingest job %s crashed", job_id)
                self._unsettle(job_id, f"{type(exc).__name__}: {exc}")
            self._settle()

    # ---- failures the catalog refused to record --------------------------------------------------

    def settled_view(self, job: JobRecord) -> JobRecord:
        """The job as clients see it: failed, if its failure is known but not yet written."""
        with self._unsettled_lock:
            error = self._unsettled.get(job.id)
        if error is not None and not job.status.finished:
            return dataclasses.replace(
                job, status=JobStatus.FAILED, stage=None, errors=[*job.errors, _storage_error(error)]
            )
        return job

    def _with_reserve(self, write: Callable[[], None]) -> None:
        """Run a catalog write; on a full disk, once more after releasing the storage reserve."""
        try:
            write()
        except Exception as exc:
            if self._free_space is None or not is_storage_full(exc) or not self._free_space():
                raise
            write()

    def _unsettle(self, job_id: str, error: str) -> None:
        """A job whose own failure handling failed: never leave it `running`."""
        with self._unsettled_lock:
            self._unsettled[job_id] = error
        self._env.storage_fault(error)

    def _settle(self) -> None:
        """Write down the failure of jobs that could not be marked failed before (retried by the worker)."""
        with self._unsettled_lock:
            pending = dict(self._unsettled)
        catalog = self._catalog
        for job_id, error in pending.items():

            def mark_failed(job_id: str = job_id, error: str = error) -> None:
                job = catalog.get_job(job_id)
                if job is not None and not job.status.finished:
                    for doc_id in job.document_ids:
                        doc = catalog.get_document(doc_id)
                        if doc is not None and doc.status == DocumentStatus.PENDING:
                            catalog.set_document_status(doc_id, DocumentStatus.FAILED, error=error)
                    catalog.update_job(
                        job_id,
                        JobUpdate(
                            status=JobStatus.FAILED, clear_stage=True, errors=[*job.errors, _storage_error(error)]
                        ),
                    )

            try:
                self._with_reserve(mark_failed)
            except Exception as exc:
                logger.warning("ingest job %s still cannot be marked failed: %s", job_id, exc)
                continue
            with self._unsettled_lock:
                self._unsettled.pop(job_id, None)

    # ---- recovery --------------------------------------------------------------------------------

    def recover(self) -> list[str]:
        """At start-up: undo what interrupted jobs half-wrote and queue them again. Returns their ids."""
        resumed = []
        for job in self._catalog.jobs_with_status([JobStatus.RUNNING, JobStatus.QUEUED]):
            if self.settle_if_done(job):
                continue
            self.reset_interrupted(job)
            logger.warning("resuming interrupted ingest job %s", job.id)
            self._queue.put(job.id)
            resumed.append(job.id)
        if resumed:
            self._env.retriever.save()
        return resumed

    def settle_if_done(self, job: JobRecord) -> bool:
        """A job stopped after its last document was settled (committed or failed) but before its own
        status was written: nothing is left to run (and its uploads may already be gone), so write the
        status it would have ended with instead of running it again. Returns whether it was settled."""
        if job.status != JobStatus.RUNNING or not job.document_ids:
            return False
        docs = [self._catalog.get_document(doc_id) for doc_id in job.document_ids]
        if any(doc is not None and doc.status == DocumentStatus.PENDING for doc in docs):
            return False
        errors = [JobError.from_row(row) for row in job.errors]
        reported = {e.error for e in errors}
        for doc in docs:
            if doc is not None and doc.status == DocumentStatus.FAILED and doc.error not in reported:
                errors.append(JobError(source=doc.source_path or doc.title, error=doc.error or "failed", code="failed"))
        ready = [doc for doc in docs if doc is not None and doc.status == DocumentStatus.READY]
        for doc in ready:
            # The commit may have stopped between a new version going live and the old ones going.
            stages.replace_older_versions(self._env, doc)
        failures = [e for e in errors if not e.is_duplicate]
        status = JobStatus.SUCCEEDED if ready or not failures else JobStatus.FAILED
        remove_uploads(self._env.settings.uploads_dir, job)
        self._catalog.update_job(job.id, JobUpdate(status=status, clear_stage=True, errors=error_rows(errors)))
        logger.warning("ingest job %s had settled every document before it stopped: marked %s", job.id, status)
        return True

    def reset_interrupted(self, job: JobRecord) -> None:
        """Remove what an interrupted run of `job` half-wrote and mark it queued, ready to run again."""
        catalog, retriever = self._catalog, self._env.retriever
        num_sources = len(job.spec.get("sources", []))
        for doc_id in job.document_ids[num_sources:]:
            # Documents fanned out of a json/jsonl file: parse creates them again.
            catalog.delete_document(doc_id)
        if len(job.document_ids) > num_sources:
            catalog.update_job(job.id, JobUpdate(document_ids=job.document_ids[:num_sources]))
        for doc_id in job.document_ids[:num_sources]:
            doc = catalog.get_document(doc_id)
            if doc is not None and doc.status == DocumentStatus.PENDING:
                retriever.remove([c.id for c in catalog.chunks_of(doc_id)])
                catalog.replace_chunks(doc_id, [])
        catalog.update_job(job.id, JobUpdate(status=JobStatus.QUEUED, clear_stage=True))

    # ---- one job ---------------------------------------------------------------------------------

    def run_job(self, job_id: str, on_progress: ProgressCallback | None = None) -> JobRecord:
        """Run every stage of a job in this thread; returns the finished job."""
        job = self._catalog.get_job(job_id)
        if job is None:
            raise IngestError(f"no ingest job {job_id}")
        if job.status.finished:
            return job
        with self._lock:
            ctx = job_context(self._env, job, on_progress, self._stopping)
            self._catalog.update_job(job.id, JobUpdate(status=JobStatus.RUNNING, errors=error_rows(ctx.errors)))
            try:
                finished = self._run(ctx, time.perf_counter())
            finally:
                self._env.documents.kv_in_use.clear()
            return finished

    def _run(self, ctx: JobContext, started: float) -> JobRecord:
        try:
            stages.parse(ctx)
            stages.chunk(ctx)
            stages.embed(ctx)
            stages.precompute_kv(ctx)
            num_chunks = stages.commit(ctx)
        except JobCancelled:
            self.finish_cancelled(ctx.job_id, ctx.errors)
            return self._catalog.get_job(ctx.job_id)  # type: ignore[return-value]
        except JobInterrupted:
            logger.warning("ingest job %s interrupted by shutdown; it resumes at the next start", ctx.job_id)
            return self._catalog.get_job(ctx.job_id)  # type: ignore[return-value]
        except Exception as exc:
            logger.exception("ingest job %s failed", ctx.job_id)
            return self._fail(ctx, exc)
        drop_unused_kv(ctx, failed_only=True)
        # A duplicate is not a failure: its content is stored, under the id the 202 gave.
        failures = [e for e in ctx.errors if not e.is_duplicate]
        status = JobStatus.SUCCEEDED if ctx.live() or not failures else JobStatus.FAILED
        # The uploads go before the status is written: whoever sees the job finished sees them gone.
        self._remove_uploads(ctx.job_id)
        self._catalog.update_job(
            ctx.job_id,
            JobUpdate(status=status, clear_stage=True, errors=error_rows(ctx.errors), duplicate_ids=ctx.duplicates),
        )
        if self._on_chunks_committed is not None:
            self._on_chunks_committed(num_chunks, time.perf_counter() - started)
        return ctx.progress.emit()

    def _fail(self, ctx: JobContext, exc: Exception) -> JobRecord:
        """The whole job failed: every document fails, and the failure is written down (or retried)."""
        full = is_storage_full(exc)
        if full:
            self._env.storage_fault(f"{type(exc).__name__}: {exc}")
        message = f"storage full: {exc}" if full else f"ingest failed: {exc}"
        drop_unused_kv(ctx, failed_only=False)  # frees space for the failure to be written
        code = "storage_full" if full else "internal"
        ctx.errors.append(JobError(source=None, error=f"{type(exc).__name__}: {exc}", code=code))

        def mark_failed() -> None:
            for item in ctx.items:
                ctx.fail(item, message)
            self._remove_uploads(ctx.job_id)
            self._catalog.update_job(
                ctx.job_id,
                JobUpdate(
                    status=JobStatus.FAILED,
                    clear_stage=True,
                    errors=error_rows(ctx.errors),
                    duplicate_ids=ctx.duplicates,
                ),
            )

        # Every document of the job is failed now: none may keep index entries a commit already added
        # (the index must hold exactly the catalog's ready chunks).
        for item in ctx.items:
            self._env.retriever.remove_document(item.document_id)
        try:
            self._with_reserve(mark_failed)
        except Exception as handler_exc:  # e.g. the catalog is full too: never leave the job `running`
            logger.error("could not mark ingest job %s failed: %s", ctx.job_id, handler_exc)
            self._unsettle(ctx.job_id, message)
            return self.settled_view(self._catalog.get_job(ctx.job_id))  # type: ignore[arg-type]
        return ctx.progress.emit()

    def finish_cancelled(self, job_id: str, errors: list[JobError]) -> None:
        job = self._catalog.get_job(job_id)
        if job is None:
            return
        dropped = self._catalog.fail_pending(job.document_ids, "ingest cancelled")
        if dropped:
            self._env.retriever.remove(dropped)
        remove_uploads(self._env.settings.uploads_dir, job)
        self._catalog.update_job(job_id, JobUpdate(status=JobStatus.CANCELLED, errors=error_rows(errors)))

    def _remove_uploads(self, job_id: str) -> None:
        job = self._catalog.get_job(job_id)
        if job is not None:
            remove_uploads(self._env.settings.uploads_dir, job)


def job_context(
    env: IngestEnv,
    job: JobRecord,
    on_progress: ProgressCallback | None = None,
    stopping: threading.Event | None = None,
) -> JobContext:
    """A job's context before its first stage: an item per source, the duplicates submit answered."""
    sources = [IngestSource.from_spec(s) for s in job.spec.get("sources", [])]
    # document_ids may be longer than sources: records of a json/jsonl file fan out at parse time.
    items = [WorkItem(doc_id, src) for doc_id, src in zip(job.document_ids, sources, strict=False)]
    # Duplicates of stored documents were answered at submit; they stay reported.
    errors = [JobError.from_row(d) for d in job.spec.get("duplicates", [])]
    return JobContext(
        env=env,
        job_id=job.id,
        items=items,
        progress=Progress(env.catalog, job.id, on_progress, stopping),
        collection=job.collection,
        errors=errors,
        duplicates=[e.document_id for e in errors if e.document_id is not None],
    )


def remove_uploads(uploads_dir: Path, job: JobRecord) -> None:
    """Delete the uploaded files of a finished job (and their emptied batch directories): a job reads its
    files only while it runs (an interrupted one again at the next start), and nothing reads them after.
    Only files under `uploads_dir`: a CLI ingest names the user's own files, which are never touched."""
    root = uploads_dir.resolve()
    for source in job.spec.get("sources", []):
        if source.get("kind") != "file" or not source.get("path"):
            continue
        path = Path(source["path"]).resolve()
        if root not in path.parents:
            continue
        try:
            path.unlink(missing_ok=True)
            for directory in path.parents:  # uploads/<batch>/<n>/: the emptied ones, deepest first
                if directory == root:
                    break
                directory.rmdir()
        except OSError:  # a directory still holding another file of the batch, or a full-disk oddity
            continue


def drop_unused_kv(ctx: JobContext, *, failed_only: bool) -> None:
    """KV entries this job stored for documents that then failed (all its documents unless `failed_only`),
    which no committed chunk uses: left behind they would only fill the disk (on a full disk, deleting
    them is what makes room)."""
    keys = {k for i in ctx.items if (i.failed is not None or not failed_only) for k in i.kv_keys}
    keep = {k for i in ctx.items if i.failed is None for k in i.kv_keys} if failed_only else set()
    ctx.env.documents.drop_unused_kv(keys, keep=keep)


def _storage_error(error: str) -> dict[str, str | None]:
    return JobError(source=None, error=error, code="storage").to_row()
