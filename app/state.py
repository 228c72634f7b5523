"""The running application's services, built in the FastAPI lifespan and handed to routers."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.datadir_lock import server_url
from app.memory import IdleTrimmer, set_mmap_threshold
from app.metrics import Metrics
from app.rate_limit import RateLimiter
from app.services.estimates import PrefillRate
from app.services.stats_service import StatsService
from app.services.storage_faults import StorageMonitor
from app.settings import Settings

if TYPE_CHECKING:
    from app.components import Components
    from app.jobs.pg_queue import PgJobQueue
    from app.services.ask_service import AskService
    from app.services.conversation_service import ConversationService
    from app.services.coverage_service import CoverageService
    from app.services.document_service import DocumentService
    from app.services.ingest import IngestService
    from app.services.key_service import KeyService
    from app.services.kv_refresh import KVRefresh
    from engine.scheduler import Scheduler

logger = logging.getLogger(__name__)

PREFILL_RATE_FILE = "prefill_rate.json"  # the learned plain-prefill rate, kept across restarts


@dataclass
class AppState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    prefill_rate: PrefillRate = field(default_factory=PrefillRate)
    components: Components | None = None
    kv_refresh: KVRefresh | None = None
    scheduler: Scheduler | None = None
    ingest: IngestService | None = None
    ask: AskService | None = None
    coverage: CoverageService | None = None
    documents: DocumentService | None = None
    conversations: ConversationService | None = None
    keys: KeyService | None = None
    stats: StatsService = field(init=False)
    load_error: str | None = None
    job_queue: PgJobQueue | None = None  # PostgreSQL catalog only
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    rate_limiter: RateLimiter | None = None
    wrong_key_limiter: RateLimiter = field(init=False)
    storage: StorageMonitor = field(init=False)
    trimmer: IdleTrimmer | None = None

    def __post_init__(self) -> None:
        self.stats = StatsService(self.settings.engine, self.metrics, self.prefill_rate, self.settings.kvcache)
        self.storage = StorageMonitor(self.settings.data_dir)
        server = self.settings.server
        if server.ask_rate_per_minute is not None and self.rate_limiter is None:
            self.rate_limiter = RateLimiter(server.ask_rate_per_minute, server.ask_burst)
        self.wrong_key_limiter = RateLimiter(server.wrong_key_per_minute, server.wrong_key_burst)

    async def load(self) -> None:
        """Load models and open stores off the event loop, so /health answers while this runs."""
        from app.components import build_components, build_scheduler
        from app.services.ask_service import AskService
        from app.services.conversation_service import ConversationService
        from app.services.coverage_service import CoverageService
        from app.services.document_service import DocumentService
        from app.services.ingest import IngestService

        server = self.settings.server
        if server.malloc_mmap_threshold_bytes is not None:
            set_mmap_threshold(server.malloc_mmap_threshold_bytes)  # before the models allocate
        try:
            components = await asyncio.to_thread(build_components, self.settings)
        except Exception as exc:
            logger.exception("start-up failed")
            self.load_error = f"{type(exc).__name__}: {exc}"
            return
        self.components = components
        self.prefill_rate.attach(self.settings.data_dir / PREFILL_RATE_FILE, key=components.engine.fingerprint)
        self.scheduler = build_scheduler(components)
        self.scheduler.start()
        if self.settings.calibration.auto:
            from app.calibration.runner import CalibrationRunner

            components.calibration = CalibrationRunner(self.settings, components, self.scheduler)
            components.calibration.start()
        if server.memory_trim_idle_s is not None:
            scheduler = self.scheduler
            self.trimmer = IdleTrimmer(
                lambda: scheduler.queue_depth > 0 or scheduler.num_precompute_jobs > 0,
                server.memory_trim_idle_s,
                on_rss=self.metrics.process_rss.set,
            )
            self.trimmer.start()

        def on_commit(num_chunks: int, seconds: float) -> None:
            self.metrics.ingest_chunks.inc(num_chunks)
            self.metrics.ingest_seconds.inc(seconds)
            self.storage.ensure_reserve()  # a reserve spent on a full disk comes back once there is room
            self.storage.recovered()  # the commit wrote chunks, index and KV: writes succeed again

        self.coverage = CoverageService(components)
        # One DocumentService for the routes and the ingest jobs: a deletion keeps the KV a running job holds.
        self.documents = DocumentService(components, self.coverage, self.storage)
        ingest_options = {
            "on_chunks_committed": on_commit,
            "prefill_rate": self.prefill_rate,
            "scheduler": self.scheduler,
            "on_storage_fault": self.storage.record,
            "free_space": self.storage.release_reserve,
            "documents": self.documents,
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
        self.conversations = ConversationService(components.catalog)
        from app.services.key_service import KeyService

        self.keys = KeyService(components.catalog.keys, cache_s=server.key_cache_s)
        self.ask = AskService(
            components,
            self.scheduler,
            self.metrics,
            self.prefill_rate,
            conversations=self.conversations,
            on_storage_fault=self.storage.record,
            on_storage_ok=self.storage.recovered,
        )
        await asyncio.to_thread(self.storage.ensure_reserve)
        # Scale-out: the workers own the KV of the shared library.
        if server.refresh_stale_kv and not self.settings.catalog.is_postgres:
            await asyncio.to_thread(self._start_kv_refresh, components)
        if self.job_queue is None:
            self.ingest.recover()
            self.ingest.start()
        logger.info("ready at %s", server_url(self.settings.server.host, self.settings.server.port))
        self.ready.set()

    def _start_kv_refresh(self, components: Components) -> None:
        """After a model or system prompt switch: chunks re-tokenized now, their KV recomputed in the background."""
        from app.services.kv_refresh import KVRefresh, plan_refresh

        assert self.scheduler is not None
        plan = plan_refresh(components)
        if plan.stale or plan.old_keys:
            self.kv_refresh = KVRefresh(components, self.scheduler, plan)
            self.kv_refresh.start()

    async def close(self) -> None:
        if self.kv_refresh is not None:
            await asyncio.to_thread(self.kv_refresh.stop)
        if self.trimmer is not None:
            await asyncio.to_thread(self.trimmer.stop)
        sync = getattr(self.components.retriever, "sync", None) if self.components is not None else None
        if sync is not None:
            await asyncio.to_thread(sync.stop)
        if self.job_queue is not None:
            self.job_queue.close()
        if self.ingest is not None:
            await asyncio.to_thread(self.ingest.stop)
        if self.components is not None and self.components.calibration is not None:
            await asyncio.to_thread(self.components.calibration.stop)
        if self.scheduler is not None:
            await asyncio.to_thread(self.scheduler.stop)
        self.prefill_rate.save()
        if self.components is not None:
            self.components.close()
