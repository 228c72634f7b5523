"""Running ingest jobs: the parse lanes and the index thread, one job through the stages, a failure written
down even on a full disk (the storage reserve, then retries), and recovery of interrupted jobs.

A queued job is parsed in a lane (lanes.py: inline text on the index thread itself, small files in the quick
lane, the rest by `ingest.parse_workers` parse processes at once), then chunked, embedded, given its KV and
committed on the index thread, one job at a time (one job mutates the index at a time). A job whose
duplicates' originals are still pending waits for them without holding any thread (originals.py).

`recover()` (run at start-up) re-queues interrupted jobs after removing what they had half-written.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.catalog import DocumentStatus, JobStatus
from app.catalog.records import JobRecord, JobUpdate
from app.services.ingest import stages
from app.services.ingest.context import IngestEnv, JobContext, job_context
from app.services.ingest.lanes import Lane, ParseLanes, lane_of, num_parse_workers
from app.services.ingest.originals import WAITING_STAGE, OutcomeWriter
from app.services.ingest.parse_process import ParseServer
from app.services.ingest.progress import ProgressCallback
from app.services.ingest.types import (
    IngestError,
    IngestSource,
    JobCancelled,
    JobError,
    JobInterrupted,
    error_rows,
)
from app.services.storage_faults import is_storage_full

logger = logging.getLogger(__name__)

UNSETTLED_RETRY_S = 5.0  # how often the worker retries marking a job failed that the catalog refused
WAITING_POLL_S = 1.0  # how often the index thread looks at jobs waiting for their duplicates' originals
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Parsed:
    """A job its lane has parsed, on its way to the index thread."""

    ctx: JobContext
    parse_seconds: float


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
        # The index thread's queue: a job id (an inline job, parsed there too) or a job a lane has parsed.
        self._queue: queue.Queue[str | Parsed | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one job mutates the index at a time
        self._accept_lock = threading.Lock()  # one parsed document at a time is checked for duplicates and kept
        # Jobs being run (from their parse to their end): a job queued twice (submitted, then queued again by
        # recover) must not run in two lanes at once.
        self._running: set[str] = set()
        self._running_lock = threading.Lock()
        ingest = env.settings.ingest
        self._lanes = ParseLanes(self._parse_in_lane, num_parse_workers(ingest), quick=ingest.quick_parse_bytes > 0)
        # Set by stop(): the running job stops at its next check (inside parse and chunk too) and is resumed
        # by the next start, so shutting down never waits for a long job to finish.
        self._stopping = threading.Event()
        # Writes how jobs end; a duplicate may wait for a pending original once every unfinished job of the
        # catalog will be run (this worker recovered and serves the queue, or the PostgreSQL workers do).
        self._outcomes = OutcomeWriter(env.catalog, serving=env.settings.catalog.is_postgres)

    # ---- the thread ------------------------------------------------------------------------------

    def enqueue(self, job_id: str) -> None:
        """Queue a job in the lane its sources go to (lanes.py)."""
        job = self._catalog.get_job(job_id)
        sources = [IngestSource.from_spec(s) for s in job.spec.get("sources", [])] if job is not None else []
        lane = lane_of(sources, self._env.settings.ingest.quick_parse_bytes)
        if lane == Lane.INLINE:
            self._queue.put(job_id)
        else:
            self._lanes.put(lane, job_id)

    def start(self) -> None:
        if self._thread is None:
            self._stopping.clear()
            self._outcomes.serving = True
            self._thread = threading.Thread(target=self._work, name="ingest-worker", daemon=True)
            self._thread.start()
            self._lanes.start()

    def request_stop(self) -> None:
        """Tell the running job to stop at its next check (it resumes at the next start); `stop` waits."""
        self._stopping.set()

    def stop(self) -> None:
        if self._thread is not None:
            self.request_stop()
            self._lanes.stop(STOP_TIMEOUT_S)
            self._queue.put(None)
            self._thread.join(timeout=STOP_TIMEOUT_S)
            self._thread = None
            while not self._queue.empty():  # parsed jobs the index thread did not take: resumed at the next start
                item = self._queue.get_nowait()
                if isinstance(item, Parsed):
                    self._release(item.ctx.job_id)
        self._settle()  # a failure reported but not yet written: last chance before a restart re-runs it

    def _work(self) -> None:
        """The index thread: inline jobs whole, parsed jobs from chunk on; between them, the jobs waiting for
        their duplicates' originals (a cancel or another worker may have settled those) and failures to write."""
        while True:
            try:
                timeout = WAITING_POLL_S if self._outcomes.waiting else UNSETTLED_RETRY_S if self._unsettled else None
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = ""
            if item is None:
                return
            job_id = item.ctx.job_id if isinstance(item, Parsed) else item
            try:
                if isinstance(item, Parsed):
                    try:
                        self._index(item.ctx, item.parse_seconds)
                    finally:
                        self._release(item.ctx.job_id)
                elif item:
                    self._run_whole(item, None)
                else:  # a cancel or another worker may have settled the originals a job waits for
                    self._outcomes.settle_waiting()
            except Exception as exc:  # the worker must outlive any one job
                logger.exception("ingest job %s crashed", job_id)
                if job_id:
                    self._unsettle(job_id, f"{type(exc).__name__}: {exc}")
            self._settle()

    def _parse_in_lane(self, job_id: str, server: ParseServer) -> None:
        """A lane thread's part of a job: its parse, with the lane's parse process; then on to the index thread."""
        if self._stopping.is_set():
            return  # left queued (or running): the next start's recovery runs it
        try:
            began = self._begin(job_id, None)
            if isinstance(began, JobRecord):
                return
            began.parse_server = server  # the lane's own parse process: lanes parse at once
            started = time.perf_counter()
            parsed = False
            try:
                parsed = self._parse(began) is None
            finally:
                if not parsed:
                    self._release(job_id)
            if parsed:
                self._queue.put(Parsed(began, time.perf_counter() - started))
        except Exception as exc:  # the lane must outlive any one job
            logger.exception("ingest job %s crashed while it was parsed", job_id)
            self._unsettle(job_id, f"{type(exc).__name__}: {exc}")

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
        self._outcomes.serving = True  # every unfinished job runs again from here: a duplicate may wait
        for job in self._catalog.jobs_with_status([JobStatus.RUNNING, JobStatus.QUEUED]):
            if self.settle_if_done(job):
                continue
            self.reset_interrupted(job)
            logger.warning("resuming interrupted ingest job %s", job.id)
            self.enqueue(job.id)
            resumed.append(job.id)
        if resumed:
            self._env.retriever.save()
        return resumed

    def settle_if_done(self, job: JobRecord) -> bool:
        """A job stopped after its last document was settled (committed or failed) but before its own
        status was written: nothing is left to run (and its uploads may already be gone), so write the
        status it would have ended with instead of running it again (a job that was waiting for its duplicates'
        originals waits again). Returns whether it was settled."""
        if job.status == JobStatus.RUNNING and job.stage == WAITING_STAGE:
            self._outcomes.settle_waiting()
            return True
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
        remove_uploads(self._env.settings.uploads_dir, job)
        self._outcomes.conclude(job.id, errors, bool(ready), job.duplicate_ids)
        logger.warning("ingest job %s had settled every document before it stopped: settled", job.id)
        return True

    def settle_waiting(self) -> None:
        self._outcomes.settle_waiting()

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
        """Run every stage of a job in this thread (its files parsed by the shared parse process); returns the
        job: finished, or `running` at stage `waiting` while the originals of its duplicates are being ingested
        by other jobs, whose end settles it (originals.py)."""
        return self._run_whole(job_id, on_progress)

    def _run_whole(self, job_id: str, on_progress: ProgressCallback | None) -> JobRecord:
        began = self._begin(job_id, on_progress)
        if isinstance(began, JobRecord):
            return began
        try:
            started = time.perf_counter()
            ended = self._parse(began)
            return ended if ended is not None else self._index(began, time.perf_counter() - started)
        finally:
            self._release(job_id)

    def _begin(self, job_id: str, on_progress: ProgressCallback | None) -> JobContext | JobRecord:
        """The context of a job about to run, marked running (and taken: `_release` when it ends); or the job
        itself when there is nothing to run: finished already, waiting for its duplicates' originals (its
        stages ran), or being run by another lane of this worker (a job queued twice)."""
        job = self._catalog.get_job(job_id)
        if job is None:
            raise IngestError(f"no ingest job {job_id}")
        with self._running_lock:
            if job.status.finished or job.stage == WAITING_STAGE or job_id in self._running:
                return job
            self._running.add(job_id)
        try:
            ctx = job_context(self._env, job, on_progress, self._stopping, self._accept_lock)
            self._catalog.update_job(job.id, JobUpdate(status=JobStatus.RUNNING, errors=error_rows(ctx.errors)))
        except BaseException:
            self._release(job_id)
            raise
        return ctx

    def _release(self, job_id: str) -> None:
        with self._running_lock:
            self._running.discard(job_id)

    def _parse(self, ctx: JobContext) -> JobRecord | None:
        """The parse stage, outside the index lock (jobs are parsed in several lanes at once); returns the job
        if it ended there (cancelled, interrupted, failed as a whole), else None."""
        try:
            stages.parse(ctx)
        except Exception as exc:
            return self._ended(ctx, exc)
        return None

    def _index(self, ctx: JobContext, parse_seconds: float) -> JobRecord:
        """The stages after parse, one job at a time, then the job's outcome."""
        with self._lock:
            started = time.perf_counter()
            try:
                try:
                    stages.chunk(ctx)
                    stages.embed(ctx)
                    stages.precompute_kv(ctx)
                    num_chunks = stages.commit(ctx)
                except Exception as exc:
                    return self._ended(ctx, exc)
                drop_unused_kv(ctx, failed_only=True)
            finally:
                self._env.documents.kv_in_use.clear()
        # The uploads go before the status is written: whoever sees the job finished sees them gone.
        self._remove_uploads(ctx.job_id)
        if self._on_chunks_committed is not None:
            self._on_chunks_committed(num_chunks, parse_seconds + time.perf_counter() - started)
        self._outcomes.conclude(ctx.job_id, ctx.errors, bool(ctx.live()), ctx.duplicates)
        return ctx.progress.emit()

    def _ended(self, ctx: JobContext, exc: Exception) -> JobRecord:
        """A job that stopped inside a stage: cancelled, interrupted by a shutdown, or failed as a whole."""
        if isinstance(exc, JobCancelled):
            self.finish_cancelled(ctx.job_id, ctx.errors)
        elif isinstance(exc, JobInterrupted):
            logger.warning("ingest job %s interrupted by shutdown; it resumes at the next start", ctx.job_id)
        else:
            logger.error("ingest job %s failed", ctx.job_id, exc_info=exc)
            return self._fail(ctx, exc)
        return self._catalog.get_job(ctx.job_id)  # type: ignore[return-value]

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
        self._outcomes.settle_waiting()  # duplicates of this job's documents fail with them
        return ctx.progress.emit()

    def finish_cancelled(self, job_id: str, errors: list[JobError]) -> None:
        job = self._catalog.get_job(job_id)
        if job is None:
            return
        dropped = self._catalog.fail_pending(job.document_ids, "ingest cancelled")
        if dropped:
            self._env.retriever.remove(dropped)
        remove_uploads(self._env.settings.uploads_dir, job)
        self._catalog.update_job(
            job_id,
            JobUpdate(status=JobStatus.CANCELLED, clear_stage=job.stage == WAITING_STAGE, errors=error_rows(errors)),
        )
        self._outcomes.settle_waiting()  # duplicates of this job's documents fail with them

    def _remove_uploads(self, job_id: str) -> None:
        job = self._catalog.get_job(job_id)
        if job is not None:
            remove_uploads(self._env.settings.uploads_dir, job)


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
