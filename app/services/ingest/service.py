"""IngestService: parse → chunk → embed → precompute KV → commit, as background jobs.

A document is visible (status `pending`) as soon as its job is accepted and answerable only once the job
commits it (`ready`): its chunk rows, FAISS entries and KV entries all exist by then. This class is the
face routers, the CLI and the job queue see; submission (`submission.py`), the stages (`stages.py`) and
the worker (`worker.py`) do the work.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from app.catalog import JobStatus
from app.catalog.models import DEFAULT_COLLECTION
from app.catalog.records import JobUpdate
from app.services.ingest import submission
from app.services.ingest.context import IngestEnv
from app.services.ingest.originals import WAITING_STAGE
from app.services.ingest.progress import ProgressCallback
from app.services.ingest.types import IngestSource, JobError, SubmitResult
from app.services.ingest.worker import IngestWorker

if TYPE_CHECKING:
    from app.catalog.records import JobRecord


class IngestService:
    def __init__(
        self,
        env: IngestEnv,
        *,
        dispatch: Callable[[str], object] | None = None,
        on_chunks_committed: Callable[[int, float], None] | None = None,
        free_space: Callable[[], bool] | None = None,
    ) -> None:
        """`env`: what the stages use (catalog, engine, retriever, KV store, scheduler, documents …).
        `dispatch(job_id)` hands submitted jobs elsewhere (the PostgreSQL queue of `blendrag worker`); without
        it they run on this service's own worker thread. `on_chunks_committed(num_chunks, seconds)` hears of
        each commit; `free_space()` releases the storage reserve so a failure can be written down."""
        self._env = env
        self._catalog = env.catalog
        self._dispatch = dispatch
        self._worker = IngestWorker(env, on_chunks_committed=on_chunks_committed, free_space=free_space)

    def submit(
        self, sources: list[IngestSource], *, enqueue: bool = True, collection: str = DEFAULT_COLLECTION
    ) -> SubmitResult:
        """Create the job adding `sources` to `collection` (refused with IngestError / IngestTooLarge over a
        cap) and queue it unless told not to."""
        submission.check_caps(sources, self._env.settings.ingest, self._count_tokens)
        result = submission.create_job(self._catalog, self._env.documents, sources, collection)
        if enqueue:
            (self._dispatch or self._worker.enqueue)(result.job_id)
        return result

    def _count_tokens(self, text: str) -> int:
        return len(self._env.engine.tokenizer(text, add_special_tokens=False)["input_ids"])

    def recent_jobs(self, limit: int, collections: Collection[str] | None = None) -> list[JobRecord]:
        """The newest jobs (of `collections`; None: all)."""
        # Each as get_job reports it: a job whose failure is not yet written reads failed in both.
        jobs = self._catalog.list_jobs(limit=limit, collections=collections)
        return [self._worker.settled_view(job) for job in jobs]

    def get_job(self, job_id: str) -> JobRecord | None:
        job = self._catalog.get_job(job_id)
        return self._worker.settled_view(job) if job is not None else None

    def cancel(self, job_id: str) -> JobRecord:
        """Ask a job to stop (KeyError if unknown): a queued one is cancelled now, and so is one waiting for
        its duplicates' originals (no thread runs it); a running one at its next cancel check (before the
        commit at the latest)."""
        job = self._catalog.get_job(job_id)
        if job is None:
            raise KeyError(job_id)
        if not job.status.finished:
            self._catalog.update_job(job_id, JobUpdate(cancel_requested=True))
            if job.status == JobStatus.QUEUED:
                self._worker.finish_cancelled(job_id, [])
            elif job.stage == WAITING_STAGE:
                self._worker.finish_cancelled(job_id, [JobError.from_row(row) for row in job.errors])
        return self._catalog.get_job(job_id)  # type: ignore[return-value]

    def start(self) -> None:
        self._worker.start()

    def request_stop(self) -> None:
        """The running job stops at its next check, inside parse and chunk too (shutdown never waits for it)."""
        self._worker.request_stop()

    def stop(self) -> None:
        self._worker.stop()

    def recover(self) -> list[str]:
        """At start-up: undo what interrupted jobs half-wrote and queue them again. Returns their ids."""
        return self._worker.recover()

    def reset_interrupted(self, job: JobRecord) -> None:
        self._worker.reset_interrupted(job)

    def settle_waiting(self) -> None:
        """Settle the jobs waiting for the documents their duplicates are copies of, where those are settled."""
        self._worker.settle_waiting()

    def run_job(self, job_id: str, on_progress: ProgressCallback | None = None) -> JobRecord:
        """Run every stage of a job in this thread; returns the finished job."""
        return self._worker.run_job(job_id, on_progress)

    def delete_document(self, document_id: str) -> bool:
        """Delete a document with its chunks, index entries and unshared KV (see DocumentService)."""
        return self._env.documents.delete_document(document_id)

    def purge_failed(self, collections: Collection[str] | None = None) -> int:
        return self._env.documents.purge_failed(collections)
