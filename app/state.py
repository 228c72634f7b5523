"""The running application's services, built in the FastAPI lifespan and handed to routers.

`AppState` holds what `build_services` returned (`services`) and reads every service from it: the
composition root is app/build.py alone; this module adds what only a server has (metrics, rate limits,
the storage monitor, the background calibration, the KV refresh, the idle trimmer)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.datadir_lock import server_url
from app.memory import IdleTrimmer, set_mmap_threshold
from app.metrics import Metrics
from app.rate_limit import RateLimiter
from app.services.estimates import FullPassRate, RateProbe
from app.services.stats_service import ServingParts, StatsService
from app.services.storage_faults import StorageMonitor
from app.settings import Settings

if TYPE_CHECKING:
    from app.build import Services
    from app.services.kv_refresh import KVRefresh
    from engine.scheduler import Scheduler

logger = logging.getLogger(__name__)

PREFILL_RATE_FILE = "prefill_rate.json"  # the learned full-pass rate, kept across restarts (the name data dirs have)


@dataclass
class AppState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    full_pass_rate: FullPassRate = field(default_factory=FullPassRate)
    services: Services | None = None  # what start-up built (app/build.py); None until then
    kv_refresh: KVRefresh | None = None
    stats: StatsService = field(init=False)
    load_error: str | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    rate_limiter: RateLimiter | None = None
    wrong_key_limiter: RateLimiter = field(init=False)
    storage: StorageMonitor = field(init=False)
    trimmer: IdleTrimmer | None = None
    rate_probe: RateProbe | None = None  # measures the prefill rate at start when none is known for the model

    def __post_init__(self) -> None:
        self.stats = StatsService(self.settings.engine, self.metrics, self.full_pass_rate, self.settings.kvcache)
        self.storage = StorageMonitor(self.settings.data_dir)
        server = self.settings.server
        if server.ask_rate_per_minute is not None and self.rate_limiter is None:
            self.rate_limiter = RateLimiter(server.ask_rate_per_minute, server.ask_burst)
        self.wrong_key_limiter = RateLimiter(server.wrong_key_per_minute, server.wrong_key_burst)

    @property
    def scheduler(self) -> Scheduler | None:
        """The engine's scheduler once start-up built it; every service is read from `services` likewise."""
        return self.services.scheduler if self.services is not None else None

    def serving(self) -> ServingParts | None:
        """What /api/stats reads of the started server (None before start-up finishes)."""
        s = self.services
        if s is None or s.engine is None or s.store is None or s.retriever is None:
            return None
        return ServingParts(
            engine=s.engine,
            store=s.store,
            embedder_compute=s.retriever.embedder.dtype_choice,
            blend=s.blend,
            calibration=s.calibration.status() if s.calibration is not None else None,
        )

    async def load(self) -> None:
        """Load models and open stores off the event loop, so /health answers while this runs."""
        from app.build import SERVER_NEEDS, Hooks, build_services

        server = self.settings.server
        if server.malloc_mmap_threshold_bytes is not None:
            set_mmap_threshold(server.malloc_mmap_threshold_bytes)  # before the models allocate
        hooks = Hooks(
            metrics=self.metrics,
            full_pass_rate=self.full_pass_rate,
            storage=self.storage,
            on_chunks_committed=self._on_commit,
        )
        try:
            services = await asyncio.to_thread(build_services, self.settings, SERVER_NEEDS, hooks=hooks)
        except Exception as exc:
            logger.exception("start-up failed")
            self.load_error = f"{type(exc).__name__}: {exc}"
            return
        assert services.engine is not None and services.scheduler is not None and services.ingest is not None
        self.services = services
        engine = services.engine
        self.full_pass_rate.attach(self.settings.data_dir / PREFILL_RATE_FILE, key=engine.fingerprint)
        scheduler = services.scheduler
        # The wait estimate a busy engine answers with (Retry-After) needs a prompt rate from the first question
        # on: the one kept from an earlier run, until the scheduler measures its own.
        scheduler.rates.seed_full_rate(self.full_pass_rate.tokens_per_s)
        scheduler.start()
        if self.full_pass_rate.tokens_per_s is None:
            # No rate for this model yet: measured now, on the worker, behind any question and off the path to
            # ready, so that the first ingest is announced with a time estimate.
            self.rate_probe = RateProbe(self.full_pass_rate, scheduler, engine.tokenizer)
            self.rate_probe.start()
        if self.settings.calibration.auto:
            from app.calibration.runner import CalibrationRunner

            services.calibration = CalibrationRunner(self.settings, engine, scheduler, adopt=services.adopt_blend)
            services.calibration.start()
        if server.memory_trim_idle_s is not None:
            self.trimmer = IdleTrimmer(
                lambda: scheduler.queue_depth > 0 or scheduler.num_precompute_jobs > 0,
                server.memory_trim_idle_s,
                on_rss=self.metrics.process_rss.set,
            )
            self.trimmer.start()
        sync = getattr(services.retriever, "sync", None)
        if sync is not None:  # scale-out: the index follows the catalog's change log
            sync.start()
        await asyncio.to_thread(self.storage.ensure_reserve)
        # Scale-out: the workers own the KV of the shared library.
        if server.refresh_stale_kv and not self.settings.catalog.is_postgres:
            await asyncio.to_thread(self._start_kv_refresh, services)
        if services.job_queue is None:
            services.ingest.recover()
            services.ingest.start()
        logger.info("ready at %s", server_url(self.settings.server.host, self.settings.server.port))
        self.ready.set()

    def _on_commit(self, num_chunks: int, seconds: float) -> None:
        self.metrics.ingest_chunks.inc(num_chunks)
        self.metrics.ingest_seconds.inc(seconds)
        self.storage.ensure_reserve()  # a reserve spent on a full disk comes back once there is room
        self.storage.recovered()  # the commit wrote chunks, index and KV: writes succeed again

    def _start_kv_refresh(self, services: Services) -> None:
        """After a model or system prompt switch: chunks re-tokenized now, their KV recomputed in the background."""
        from app.services.kv_refresh import KVRefresh, plan_refresh

        engine, kv_space, scheduler = services.engine, services.kv_space, services.scheduler
        assert engine is not None and kv_space is not None and scheduler is not None
        plan = plan_refresh(services.catalog, engine.tokenizer, kv_space)
        if plan.stale or plan.old_keys:
            self.kv_refresh = KVRefresh(services.catalog, engine, kv_space, scheduler, plan)
            self.kv_refresh.start()

    async def close(self) -> None:
        if self.kv_refresh is not None:
            await asyncio.to_thread(self.kv_refresh.stop)
        if self.trimmer is not None:
            await asyncio.to_thread(self.trimmer.stop)
        sync = getattr(self.services.retriever, "sync", None) if self.services is not None else None
        if sync is not None:
            await asyncio.to_thread(sync.stop)
        if self.services is not None and self.services.ingest is not None:
            await asyncio.to_thread(self.services.ingest.stop)
        if self.services is not None and self.services.calibration is not None:
            await asyncio.to_thread(self.services.calibration.stop)
        if self.scheduler is not None:
            await asyncio.to_thread(self.scheduler.stop)
        if self.rate_probe is not None:
            await asyncio.to_thread(self.rate_probe.join, 5.0)  # the stopped scheduler ended its work
        self.full_pass_rate.save()
        if self.services is not None:
            self.services.close()
