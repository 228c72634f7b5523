"""Helpers for the scale-out tests: a `blendrag worker` in a thread of the test process."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from app.components import Components, build_components
from app.settings import Settings


@contextmanager
def worker_in_thread(settings: Settings) -> Iterator[Components]:
    """`blendrag worker` in this process (own data dir, same catalog), stopped on exit."""
    from app.jobs.worker import JobRunner, consume
    from app.services.ingest import IngestService

    worker_settings = settings.model_copy(update={"data_dir": settings.data_dir.parent / "worker"})
    worker_settings.kvcache = settings.kvcache.model_copy(update={"dir": worker_settings.data_dir / "kv"})
    components = build_components(worker_settings, role="worker")
    runner = JobRunner(components.catalog, IngestService(components))
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(consume(worker_settings, runner, stop),), daemon=True
    )
    thread.start()
    try:
        yield components
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
        loop.close()
        components.close()
