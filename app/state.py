"""The running application's services, built in the FastAPI lifespan and handed to routers."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.api.rate_limit import RateLimiter
from app.datadir_lock import server_url
from app.metrics import Metrics
from app.services.estimates import PrefillRate
from app.services.stats_service import StatsService
from app.services.storage_faults import StorageMonitor
from app.settings import Settings

if TYPE_CHECKING:
    from app.components import Components
    from app.jobs.pg_queue import PgJobQueue
    from app.services.ask_service import AskService
    from app.services.coverage_service import CoverageService
    from app.services.document_service import DocumentService
    from app.services.ingest_service import IngestService
    from engine.scheduler import Scheduler

logger = logging.getLogger(__name__)


@dataclass
class AppState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    prefill_rate: PrefillRate = field(default_factory=PrefillRate)
    components: Components | None = None
    scheduler: Scheduler | None = None
    ingest: IngestService | None = None
    ask: AskService | None = None
    coverage: CoverageService | None = None
    documents: DocumentService | None = None
    stats: StatsService = field(init=False)
    load_error: str | None = None
    job_queue: PgJobQueue | None = None  # PostgreSQL catalog only
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    rate_limiter: RateLimiter | None = None
    storage: StorageMonitor = field(init=False)

    def __post_init__(self) -> None:
        self.stats = StatsService(self.settings.engine, self.metrics, self.prefill_rate, self.settings.kvcache)
        self.storage = StorageMonitor(self.settings.data_dir)
        server = self.settings.server
        if server.ask_rate_per_minute is not None and self.rate_limiter is None:
            self.rate_limiter = RateLimiter(server.ask_rate_per_minute, server.ask_burst)

    async def load(self) -> None:
        """Load models and open stores off the event loop, so /health answers while this runs."""
        from app.components import build_components, build_scheduler
        from app.services.ask_service import AskService
        from app.services.coverage_service import CoverageService
        from app.services.document_service import DocumentService
        from app.services.ingest_service import IngestService

        try:
            components = await asyncio.to_thread(build_components, self.settings)
        except Exception as exc:
            logger.exception("start-up failed")
            self.load_error = f"{type(exc).__name__}: {exc}"
            return
        self.components = components
        self.scheduler = build_scheduler(components)
        self.scheduler.start()

        def on_commit(num_chunks: int, seconds: float) -> None:
            self.metrics.ingest_chunks.inc(num_chunks)
            self.metrics.ingest_seconds.inc(seconds)

        ingest_options = {
            "on_chunks_committed": on_commit,
            "prefill_rate": self.prefill_rate,
            "scheduler": self.scheduler,
            "on_storage_fault": self.storage.record,
        }
        if self.settings.catalog.is_postgres:
            # Scale-out: jobs go to the PostgreSQL queue (`blendrag worker`), the index follows the catalog.
            from app.jobs.pg_queue import PgJobQueue

            self.job_queue = PgJobQueue(self.settings.catalog.url or "")
            self.ingest = IngestService(components, dispatch=self.job_queue.enqueue, **ingest_options)
            sync = getattr(components.retriever, "sync", None)
            if sync is not None:
                sync.start()
        else:
            self.ingest = IngestService(components, **ingest_options)
        self.ask = AskService(components, self.scheduler, self.metrics, self.prefill_rate)
        self.coverage = CoverageService(components)
        self.documents = DocumentService(components, self.ingest, self.coverage)
        if self.job_queue is None:
            self.ingest.recover()
            self.ingest.start()
        logger.info("ready at %s", server_url(self.settings.server.host, self.settings.server.port))
        self.ready.set()

    async def close(self) -> None:
        sync = getattr(self.components.retriever, "sync", None) if self.components is not None else None
        if sync is not None:
            await asyncio.to_thread(sync.stop)
        if self.job_queue is not None:
            self.job_queue.close()
        if self.ingest is not None:
            await asyncio.to_thread(self.ingest.stop)
        if self.scheduler is not None:
            await asyncio.to_thread(self.scheduler.stop)
        if self.components is not None:
            self.components.close()
