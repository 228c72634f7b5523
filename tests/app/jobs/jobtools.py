"""Helpers for the scale-out tests: a `blendrag worker` in a thread of the test process."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from app.build import Services, build_services, new_ingest
from app.settings import Settings


@contextmanager
def worker_in_thread(settings: Settings) -> Iterator[Services]:
    """`blendrag worker` in this process (own data dir, same catalog), stopped on exit."""
    from app.jobs.worker import JobRunner, consume

    worker_settings = settings.model_copy(update={"data_dir": settings.data_dir.parent / "worker"})
    worker_settings.kvcache = settings.kvcache.model_copy(update={"dir": worker_settings.data_dir / "kv"})
    services = build_services(worker_settings, {"ingest"}, role="worker")
    runner = JobRunner(services.catalog, new_ingest(services))
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(consume(worker_settings, runner, stop),), daemon=True
    )
    thread.start()
    try:
        yield services
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
        loop.close()
        services.close()
