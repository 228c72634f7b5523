"""`blendrag worker`: take ingest jobs from the PostgreSQL queue and run them (parse → chunk → embed → KV → commit).

Any number of workers may run on any machines. Each holds one job at a time and heartbeats it while the
job runs in a thread; a worker that dies (even SIGKILL) stops heartbeating, and after
`worker.heartbeat_timeout_s` PgQueuer hands the job to another worker. That worker finds the catalog job
still `running`, removes what the dead run half-wrote (`IngestService.reset_interrupted`) and runs it
again. KV entries are content-addressed, so entries the dead run already stored are reused, not duplicated.
SIGTERM / SIGINT stop taking jobs and let the running one finish.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncGenerator
from datetime import timedelta
from typing import TYPE_CHECKING

from app.catalog import JobStatus
from app.jobs.pg_queue import ENTRYPOINT, INSTALL_HINT, PgJobQueue, libpq_url
from app.services.ingest.originals import WAITING_STAGE

if TYPE_CHECKING:
    from app.catalog import Catalog
    from app.services.ingest import IngestService
    from app.settings import Settings

logger = logging.getLogger(__name__)


class JobRunner:
    """Runs one catalog job by id, first undoing an earlier, interrupted run of it."""

    def __init__(self, catalog: Catalog, service: IngestService) -> None:
        self._catalog = catalog
        self._service = service

    def run(self, job_id: str) -> JobStatus | None:
        job = self._catalog.get_job(job_id)
        if job is None:
            logger.warning("queued ingest job %s is not in the catalog; skipped", job_id)
            return None
        if job.status.finished:  # e.g. cancelled while it waited in the queue
            return job.status
        if job.status == JobStatus.RUNNING and job.stage == WAITING_STAGE:
            # Its stages ran; it waits for the documents its duplicates are copies of, whose end settles it.
            self._service.settle_waiting()
            return job.status
        if job.status == JobStatus.RUNNING:
            logger.warning("ingest job %s was interrupted (its worker stopped); running it again", job_id)
            self._service.reset_interrupted(job)
        try:
            finished = self._service.run_job(job_id)
        except Exception:  # run_job records failures itself; this is a bug or a lost database
            logger.exception("ingest job %s crashed", job_id)
            raise
        if finished.stage == WAITING_STAGE:  # its end is written by whoever settles the originals it duplicates
            logger.info("ingest job %s waits for the outcome of the documents it duplicates", job_id)
        else:
            logger.info("ingest job %s %s", job_id, finished.status.value)
        return finished.status


def run_worker(settings: Settings) -> int:
    """Serve ingest jobs until SIGTERM / SIGINT. Returns the exit code."""
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        logger.error(INSTALL_HINT)
        return 1
    from app.build import build_services

    logging.getLogger().setLevel(min(logging.getLogger().level, logging.INFO))
    services = build_services(settings, {"ingest"}, role="worker")
    try:
        assert services.ingest is not None
        queue = PgJobQueue(settings.catalog.url or "")
        requeued = queue.requeue_unfinished(services.catalog)
        queue.close()
        if requeued:
            logger.info("%d unfinished job(s) of the catalog were not queued: queued them", len(requeued))
        runner = JobRunner(services.catalog, services.ingest)
        asyncio.run(consume(settings, runner))
    finally:
        services.close()
    return 0


async def consume(settings: Settings, runner: JobRunner, stop: asyncio.Event | None = None) -> None:
    """Take jobs off the queue until `stop` is set or a termination signal arrives."""
    import psycopg
    from pgqueuer import Job, QueueManager
    from pgqueuer.queries import Queries

    class OneJobAtATime(QueueManager):
        # PgQueuer's per-worker budget must be >= 2 x batch size; an ingest job keeps the CPU busy, so
        # holding a second one here would only keep it from an idle worker: ask for one at a time.
        async def fetch_jobs(
            self, batch_size: int, global_concurrency_limit: int | None, heartbeat_timeout: timedelta
        ) -> AsyncGenerator[Job, None]:
            async for job in super().fetch_jobs(1, 1, heartbeat_timeout):
                yield job

    conn = await psycopg.AsyncConnection.connect(libpq_url(settings.catalog.url or ""), autocommit=True)
    qm = OneJobAtATime(Queries.from_psycopg_connection(conn))

    @qm.entrypoint(ENTRYPOINT)
    async def ingest(job: Job) -> None:
        await asyncio.to_thread(runner.run, (job.payload or b"").decode())

    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if threading.current_thread() is threading.main_thread() else ()
    for sig in signals:
        loop.add_signal_handler(sig, qm.shutdown.set)
    watcher = asyncio.create_task(_forward(stop, qm.shutdown)) if stop is not None else None
    logger.info("worker %s waiting for ingest jobs", qm.queue_manager_id)
    try:
        await qm.run(
            batch_size=1,
            max_concurrent_tasks=2,
            dequeue_timeout=timedelta(seconds=settings.worker.poll_interval_s),
            heartbeat_timeout=timedelta(seconds=settings.worker.heartbeat_timeout_s),
        )
    finally:
        if watcher is not None:
            watcher.cancel()
        for sig in signals:
            loop.remove_signal_handler(sig)
        await conn.close()


async def _forward(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()
