"""Ingest jobs on the PostgreSQL queue: the API side only enqueues, `blendrag worker` runs them.

Real PostgreSQL, Redis, tiny Llama and MiniLM. The SIGKILL test runs workers as real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobtools import worker_in_thread

from app.build import Services, build_services, new_ingest
from app.catalog import DocumentStatus, JobStatus
from app.jobs.pg_queue import PgJobQueue
from app.jobs.worker import JobRunner
from app.services.doctor import run_doctor
from app.services.ingest import IngestSource
from app.settings import Settings

REPO = Path(__file__).resolve().parents[3]
TEXT_A = "Quintaro is the capital of Zorblat. It has purple rivers.\n\nThe kite festival is in May."
TEXT_B = "Sourdough needs flour, water, salt and a starter. Bake it at 250 degrees."


def text(title: str, body: str) -> IngestSource:
    return IngestSource(kind="text", title=title, text=body)


def wait_for(predicate, timeout: float, what: str):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def finished(services: Services, job_id: str):  # noqa: ANN201
    job = services.catalog.get_job(job_id)
    return job if job is not None and job.status.finished else None


def test_api_only_enqueues_and_a_worker_runs_the_job(pg_settings: Settings, server_services: Services) -> None:
    queue = PgJobQueue(pg_settings.catalog.url or "")
    service = new_ingest(server_services, dispatch=queue.enqueue)
    submitted = service.submit([text("A", TEXT_A), text("B", TEXT_B)])
    time.sleep(1.0)
    # nothing runs the job in the API process
    assert server_services.catalog.get_job(submitted.job_id).status == JobStatus.QUEUED
    cancelled = service.submit([text("C", "Cancelled before any worker saw it.")])
    assert service.cancel(cancelled.job_id).status == JobStatus.CANCELLED

    with worker_in_thread(pg_settings) as worker:
        job = wait_for(lambda: finished(server_services, submitted.job_id), 120, "the job to finish")
        assert job.status == JobStatus.SUCCEEDED and job.errors == []
        assert job.progress["commit"] == {"done": 2, "total": 2, "ready": 2}
        # the worker indexes nothing itself: the catalog (with embeddings) is what replicas read
        assert worker.retriever.count == 0
    assert server_services.catalog.get_job(cancelled.job_id).status == JobStatus.CANCELLED

    chunks = server_services.catalog.iter_chunks([DocumentStatus.READY])
    assert {c.document_id for c in chunks} == set(submitted.document_ids)
    entries = server_services.catalog.index_entries()
    assert all(e.embedding is not None and e.embedding.shape == (384,) for e in entries)
    # the server's index follows the catalog
    server_services.retriever.sync.poll()
    assert server_services.retriever.chunk_ids() == sorted(c.id for c in chunks)
    hits = server_services.retriever.search("capital of Zorblat", top_k=1)
    assert hits[0].document_id == submitted.document_ids[0]
    # KV stored by the worker is in the shared Redis tier
    for c in chunks:
        assert server_services.store.redis.contains(c.kv_key)
    assert run_doctor(server_services.doctor_parts(), repair=False).problems == 0
    queue.close()


def test_jobs_whose_enqueue_was_lost_are_queued_once_again(pg_settings: Settings, server_services: Services) -> None:
    """A job recorded in the catalog but never queued (the API died in between) is queued by a worker at
    start; queuing twice is harmless (the job id is the queue's dedupe key)."""
    import psycopg

    from app.jobs.pg_queue import libpq_url

    service = new_ingest(server_services)
    submitted = service.submit([text("A", TEXT_A)], enqueue=False)
    queue = PgJobQueue(pg_settings.catalog.url or "")
    assert queue.requeue_unfinished(server_services.catalog) == [submitted.job_id]
    assert queue.requeue_unfinished(server_services.catalog) == []  # already queued
    with psycopg.connect(libpq_url(pg_settings.catalog.url or "")) as conn:
        queued = conn.execute("SELECT convert_from(payload, 'UTF8') FROM pgqueuer").fetchall()
    assert queued == [(submitted.job_id,)]
    with worker_in_thread(pg_settings):
        job = wait_for(lambda: finished(server_services, submitted.job_id), 120, "the job to finish")
    assert job.status == JobStatus.SUCCEEDED
    queue.close()


def test_cancel_reaches_the_worker_running_the_job(pg_settings: Settings, server_services: Services) -> None:
    queue = PgJobQueue(pg_settings.catalog.url or "")
    service = new_ingest(server_services, dispatch=queue.enqueue)
    paragraphs = [f"Entry {i}: the tide at Vellmar rose {i} cm on day {i * 2}." for i in range(60)]
    submitted = service.submit([text(f"Tides {d}", "\n\n".join(paragraphs[d:] + paragraphs[:d])) for d in range(10)])
    with worker_in_thread(pg_settings):
        wait_for(
            lambda: server_services.catalog.get_job(submitted.job_id).status == JobStatus.RUNNING,
            120,
            "the worker to start the job",
        )
        assert service.cancel(submitted.job_id).cancel_requested
        job = wait_for(lambda: finished(server_services, submitted.job_id), 120, "the job to stop")
    assert job.status == JobStatus.CANCELLED
    docs = [server_services.catalog.get_document(d) for d in submitted.document_ids]
    assert {(d.status, d.error, d.num_chunks) for d in docs} == {(DocumentStatus.FAILED, "ingest cancelled", 0)}
    assert server_services.catalog.iter_chunks() == []
    queue.close()


def test_a_duplicate_waits_on_its_worker_and_the_originals_worker_settles_it(
    pg_settings: Settings, server_services: Services, tmp_path: Path
) -> None:
    """Two workers: the one given the duplicate first leaves it `running` at stage `waiting` (holding no job
    slot); the one that runs the original settles it with the original's failure (issue 62)."""
    fake = tmp_path / "report.docx"
    fake.write_bytes(b"plain text pretending to be a DOCX")
    upload = IngestSource(kind="file", title="report.docx", path=str(fake), source_path="upload:report.docx")
    service = new_ingest(server_services, dispatch=lambda job_id: None)  # the API side records the jobs only
    first = service.submit([upload])
    second = service.submit([upload])
    original = first.document_ids[0]
    assert second.document_ids == [original]
    duplicates_worker = JobRunner(server_services.catalog, new_ingest(server_services, dispatch=lambda job_id: None))
    originals_worker = JobRunner(server_services.catalog, new_ingest(server_services, dispatch=lambda job_id: None))
    assert duplicates_worker.run(second.job_id) == JobStatus.RUNNING
    assert server_services.catalog.get_job(second.job_id).stage == "waiting"
    assert duplicates_worker.run(second.job_id) == JobStatus.RUNNING  # queued again: not run again
    assert originals_worker.run(first.job_id) == JobStatus.FAILED
    failed = server_services.catalog.get_job(first.job_id)
    assert [e["code"] for e in failed.errors] == ["unreadable_document"]
    shared = server_services.catalog.get_job(second.job_id)
    assert (shared.status, shared.stage, shared.errors) == (
        JobStatus.FAILED,
        None,
        [{**failed.errors[0], "document_id": original}],
    )


def _worker_process(settings: Settings, name: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "BLENDRAG_CATALOG__URL": settings.catalog.url or "",
        "BLENDRAG_KVCACHE__REDIS_URL": settings.kvcache.redis_url or "",
        "BLENDRAG_ENGINE__MODEL": settings.engine.model,
        "BLENDRAG_ENGINE__NUM_THREADS": "1",
        "BLENDRAG_WORKER__HEARTBEAT_TIMEOUT_S": "3",
        "BLENDRAG_WORKER__POLL_INTERVAL_S": "0.5",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker", "--data-dir", str(settings.data_dir.parent / name)],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


@pytest.mark.slow  # two worker processes load their models: ~2 minutes on 2 cores
@pytest.mark.timeout(600)
def test_sigkilled_worker_loses_nothing(pg_settings: Settings, tmp_path: Path) -> None:
    """Kill -9 a worker mid-job: another worker takes the job over and everything ends consistent."""
    # Many small documents: the job spends seconds in embed and kv, long enough to be killed there.
    paragraphs = [
        f"Report {i} on the harbour of Vellmar: {i * 7} ships, {i % 5} storms, and crew {i * 3}." for i in range(40)
    ]
    sources = [
        text(f"Doc {d}", "\n\n".join(paragraphs[(d * 3) % 40 :] + paragraphs[: (d * 3) % 40]) + f" #{d}")
        for d in range(12)
    ]
    services = build_services(pg_settings, {"doctor", "ingest"})
    queue = PgJobQueue(pg_settings.catalog.url or "")
    try:
        service = new_ingest(services, dispatch=queue.enqueue)
        first = _worker_process(pg_settings, "worker-a", tmp_path / "worker-a.log")
        submitted = service.submit(sources)
        job_id = submitted.job_id

        def mid_job():  # noqa: ANN202
            job = services.catalog.get_job(job_id)
            return job.stage in ("embed", "kv") and job.progress.get("embed", {}).get("done", 0) > 0

        try:
            wait_for(mid_job, 180, "worker A to be mid-job")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(30)
        killed_at = services.catalog.get_job(job_id)
        assert killed_at.status == JobStatus.RUNNING  # nobody finished it
        second = _worker_process(pg_settings, "worker-b", tmp_path / "worker-b.log")
        try:
            job = wait_for(lambda: finished(services, job_id), 300, "worker B to finish the job")
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(60)
        log_b = (tmp_path / "worker-b.log").read_text()
        assert job.status == JobStatus.SUCCEEDED, log_b
        assert f"ingest job {job_id} was interrupted (its worker stopped); running it again" in log_b
        assert second.returncode == 0, log_b
        docs = [services.catalog.get_document(d) for d in submitted.document_ids]
        assert [d.status for d in docs] == [DocumentStatus.READY] * len(sources)
        chunks = services.catalog.iter_chunks()
        assert sum(d.num_chunks for d in docs) == len(chunks) > len(sources)
        # no chunk written twice by the two runs
        assert len({(c.document_id, c.index) for c in chunks}) == len(chunks)
        services.retriever.sync.poll()
        assert services.retriever.chunk_ids() == sorted(c.id for c in chunks)
        report = run_doctor(services.doctor_parts(), repair=False)
        assert (report.problems, report.num_chunks) == (0, len(chunks))
    finally:
        queue.close()
        services.close()
