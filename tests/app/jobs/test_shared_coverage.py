"""Coverage on a scale-out deployment reports the shared Redis tier: the same from every replica."""

from __future__ import annotations

import time

from jobtools import worker_in_thread

from app.build import Services, build_services, new_ingest
from app.catalog import DocumentStatus, JobStatus
from app.jobs.pg_queue import PgJobQueue
from app.services.ingest import IngestSource
from app.settings import Settings


def test_coverage_is_identical_from_every_replica(pg_settings: Settings, server_services: Services) -> None:
    other_settings = pg_settings.model_copy(update={"data_dir": pg_settings.data_dir.parent / "replica-b"})
    other_settings.kvcache = pg_settings.kvcache.model_copy(update={"dir": other_settings.data_dir / "kv"})
    replica_b = build_services(other_settings, {"doctor", "ingest"})
    queue = PgJobQueue(pg_settings.catalog.url or "")
    try:
        service = new_ingest(server_services, dispatch=queue.enqueue)
        submitted = service.submit(
            [
                IngestSource(
                    kind="text", title="A", text="Vellmar harbour has 40 ships.\n\nIts lighthouse is red and white."
                ),
                IngestSource(kind="text", title="B", text="Sourdough needs a starter."),
            ]
        )
        with worker_in_thread(pg_settings):
            deadline = time.monotonic() + 120
            while server_services.catalog.get_job(submitted.job_id).status != JobStatus.SUCCEEDED:
                assert time.monotonic() < deadline, "job did not finish"
                time.sleep(0.1)
        chunks = server_services.catalog.iter_chunks([DocumentStatus.READY])
        # Replica A reads one entry, which lands in its private memory tier; B has none locally.
        server_services.store.get(chunks[0].kv_key)
        assert server_services.store.contains(chunks[0].kv_key) == "memory"
        assert replica_b.store.memory.contains(chunks[0].kv_key) is False
        view_a, view_b = server_services.coverage.compute(), replica_b.coverage.compute()
        assert view_a == view_b
        assert (view_a.chunks_total, view_a.chunks_fresh, view_a.coverage) == (len(chunks), len(chunks), 1.0)
        assert set(view_a.fresh_by_tier) == {"redis"} and view_a.fresh_by_tier["redis"] == len(
            {c.kv_key for c in chunks}
        )
        # Gone from Redis: missing for everyone, although A still holds a private copy.
        server_services.store.redis.delete(chunks[0].kv_key)
        view_a, view_b = server_services.coverage.compute(), replica_b.coverage.compute()
        assert view_a == view_b
        assert view_a.chunks_missing == sum(1 for c in chunks if c.kv_key == chunks[0].kv_key)
        states = replica_b.coverage.chunk_states(chunks[0].document_id)
        assert states[chunks[0].id] == "missing"
    finally:
        queue.close()
        replica_b.close()
