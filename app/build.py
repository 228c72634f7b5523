"""The composition root: `build_services(settings, need=…)` builds what one command uses, and nothing more.

The server (`AppState.load`), every CLI command that touches the library and the queue worker build through
it. Each service is handed the collaborators it uses by name (catalog, retriever, KV store, scheduler,
engine, the served model's KV space …); this module is the one place that knows which those are. Heavy imports
happen here, lazily, so `blendrag --help` and settings validation stay instant, and a command that needs
no model (`blendrag keys`, `blendrag purge-failed`) loads none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypedDict

from app.catalog import Catalog
from app.engine_loader import load_engine
from app.settings import Settings

if TYPE_CHECKING:
    from app.calibration.in_force import BlendInForce
    from app.calibration.runner import CalibrationRunner
    from app.index_sync import Role
    from app.jobs.pg_queue import PgJobQueue
    from app.metrics import Metrics
    from app.services.ask import AskService
    from app.services.conversation_service import ConversationService
    from app.services.coverage_service import CoverageService
    from app.services.doctor import DoctorParts
    from app.services.document_service import DocumentService
    from app.services.estimates import FullPassRate
    from app.services.ingest import IngestService
    from app.services.key_service import KeyService
    from app.services.storage_faults import StorageMonitor
    from engine.engine import Engine
    from engine.scheduler import Scheduler
    from kvcache.space import KVSpace
    from kvcache.store import TieredKVStore
    from retrieval.embedder import Embedder
    from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)

# What a command can ask for. The parts each needs follow from `_PARTS`; a service a need implies
# (ingest deletes through documents, ask records through conversations) comes with it.
Need = Literal["keys", "conversations", "kv_store", "documents", "coverage", "ingest", "ask", "doctor", "job_queue"]
SERVER_NEEDS: frozenset[Need] = frozenset(
    {"keys", "conversations", "documents", "coverage", "ingest", "ask", "job_queue"}
)
_IMPLIES: dict[Need, tuple[Need, ...]] = {"ingest": ("documents", "coverage"), "ask": ("conversations",)}
# The parts a need uses; "embedder" means loaded now, not at the first question.
_PARTS: dict[Need, frozenset[str]] = {
    "keys": frozenset({"catalog"}),
    "conversations": frozenset({"catalog"}),
    "job_queue": frozenset({"catalog"}),
    "kv_store": frozenset({"store"}),
    "documents": frozenset({"catalog", "store", "retriever"}),
    "coverage": frozenset({"catalog", "store", "engine"}),
    "ingest": frozenset({"catalog", "store", "retriever", "embedder", "engine", "scheduler"}),
    "ask": frozenset({"catalog", "store", "retriever", "embedder", "engine", "scheduler"}),
    "doctor": frozenset({"catalog", "store", "retriever", "embedder", "engine"}),
}


@dataclass(frozen=True)
class Hooks:
    """What the server adds to the services it builds: its metrics, the learned full-pass rate, the storage
    monitor, and what a commit tells it. The CLI and the worker build without them."""

    metrics: Metrics | None = None
    full_pass_rate: FullPassRate | None = None
    storage: StorageMonitor | None = None
    on_chunks_committed: Callable[[int, float], None] | None = None


@dataclass
class Services:
    """What `build_services` built: the long-lived parts (None where the command did not need them) and the
    services wired from them. `built` names the parts constructed here, in order."""

    settings: Settings
    catalog: Catalog | None = None  # every need but kv_store
    built: list[str] = field(default_factory=list)
    store: TieredKVStore | None = None
    retriever: Retriever | None = None
    engine: Engine | None = None
    kv_space: KVSpace | None = None  # the served model's entries in `store` (with engine and store)
    scheduler: Scheduler | None = None
    blend: BlendInForce | None = None  # where the blend settings in force came from; the engine holds them
    calibration: CalibrationRunner | None = None  # the background calibration, when the server runs one
    job_queue: PgJobQueue | None = None  # PostgreSQL catalog, server only
    keys: KeyService | None = None
    conversations: ConversationService | None = None
    coverage: CoverageService | None = None
    documents: DocumentService | None = None
    ingest: IngestService | None = None
    ask: AskService | None = None

    def adopt_blend(self, in_force: BlendInForce) -> None:
        """Serve with these blend settings from the next request on (start-up, a finished calibration)."""
        from app.calibration.in_force import apply

        assert self.engine is not None
        apply(self.engine, in_force)
        self.blend = in_force
        logger.info("start-up: blend settings in force: %s", in_force.described)

    def doctor_parts(self) -> DoctorParts:
        """What `run_doctor` checks and repairs with (built with need "doctor")."""
        from app.services.doctor import DoctorParts

        assert self.catalog is not None and self.retriever is not None and self.store is not None
        assert self.engine is not None and self.kv_space is not None
        return DoctorParts(
            catalog=self.catalog,
            retriever=self.retriever,
            kv_space=self.kv_space,
            engine=self.engine,
            uploads_dir=self.settings.uploads_dir,
        )

    def close(self) -> None:
        """Save the index and close the stores; a failed save (a full disk) does not keep the stores open
        or fail the shutdown: the catalog is the truth, and the next start brings the index level with it."""
        try:
            if self.retriever is not None:
                self.retriever.save()
        except Exception as exc:  # noqa: BLE001 - logged; rebuilt from the catalog at the next start
            logger.error(
                "index snapshot not saved at shutdown (%s: %s); the next start rebuilds it", type(exc).__name__, exc
            )
        finally:
            try:
                if self.job_queue is not None:
                    self.job_queue.close()
                if self.store is not None:
                    self.store.close()
            finally:
                if self.catalog is not None:
                    self.catalog.close()


def build_services(
    settings: Settings,
    need: Iterable[Need],
    *,
    role: Role = "server",
    hooks: Hooks | None = None,
    engine: Engine | None = None,
    embedder: Embedder | None = None,
) -> Services:
    """Build only what `need` uses (the catalog for every need but `kv_store`). Loading the model takes
    seconds (minutes on a first start that converts it); nothing here starts a thread.

    `role` matters with a PostgreSQL catalog only: a server builds its index from the catalog, a worker
    (or `blendrag ingest`) only embeds, for the catalog (see app/index_sync.py). `engine` / `embedder`:
    parts the caller already built (tests share one engine); a passed engine keeps its blend settings.
    """
    needs = _closure(need)
    parts = frozenset().union(*(_PARTS[n] for n in needs))
    hooks = hooks or Hooks()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    s = Services(settings=settings)
    if "catalog" in parts:
        s.catalog = Catalog(settings.catalog.url or "", migrate=settings.catalog.auto_upgrade)
        s.built.append("catalog")
        logger.info("start-up: catalog open (%s)", catalog_label(settings.catalog.url or ""))
    try:
        _build_parts(s, parts, role, engine, embedder)
        if "engine" in s.built:
            assert s.engine is not None
            logger.info(
                "start-up: components ready in %.1f s (model fingerprint %s)",
                time.perf_counter() - t0,
                s.engine.fingerprint[:12],
            )
            from app.calibration.in_force import blend_in_force

            s.adopt_blend(blend_in_force(s.engine, settings.engine, settings.data_dir))
        _wire(s, needs, hooks)
    except BaseException:
        s.close()
        raise
    return s


def _closure(need: Iterable[Need]) -> frozenset[Need]:
    todo, seen = list(need), set()
    while todo:
        n = todo.pop()
        if n not in _PARTS:
            raise ValueError(f"unknown need {n!r}; one of {', '.join(_PARTS)}")
        if n not in seen:
            seen.add(n)
            todo.extend(_IMPLIES.get(n, ()))
    return frozenset(seen)


def _build_parts(
    s: Services, parts: frozenset[str], role: Role, engine: Engine | None, embedder: Embedder | None
) -> None:
    settings = s.settings
    if "engine" in parts:
        s.engine = engine if engine is not None else load_engine(settings)
        if engine is None:
            s.built.append("engine")
    if "store" in parts:
        from kvcache.store import TieredKVStore

        s.store = TieredKVStore(settings.kvcache)
        s.built.append("store")
        logger.info("start-up: KV store open (%s)", ", ".join(t.name for t in s.store.stats().tiers))
    if s.engine is not None and s.store is not None:
        from kvcache.space import KVSpace

        # The one place a KV space is made: the served model behind the server's prompt prefix.
        s.kv_space = KVSpace.of_engine(s.store, s.engine)
    if "retriever" in parts:
        from app.index_sync import open_retriever

        step = time.perf_counter()
        s.retriever = open_retriever(settings, s.catalog, role, embedder=embedder)
        s.built.append("retriever")
        if "embedder" in parts and embedder is None:
            logger.info("start-up: loading the embedder %s …", settings.retrieval.embedder)
            s.retriever.embedder.load()  # now, not at the first question
            s.built.append("embedder")
            what = "embedder loaded and index"
        else:
            what = "index"
        logger.info("start-up: %s of %d chunks open in %.1f s", what, s.retriever.count, time.perf_counter() - step)
    if "scheduler" in parts:
        assert s.engine is not None
        s.scheduler = new_scheduler(settings, s.engine)
        s.built.append("scheduler")


def _wire(s: Services, needs: frozenset[Need], hooks: Hooks) -> None:
    """The services of `needs`, each given the parts it uses."""
    settings = s.settings
    storage = hooks.storage
    if "keys" in needs:
        from app.services.key_service import KeyService

        s.keys = KeyService(s.catalog.keys, cache_s=settings.server.key_cache_s)
    if "conversations" in needs:
        from app.services.conversation_service import ConversationService

        s.conversations = ConversationService(s.catalog)
    if "coverage" in needs:
        from app.services.coverage_service import CoverageService

        assert s.store is not None and s.kv_space is not None
        # Scale-out (PostgreSQL catalog + Redis): the shared tier only, the same from every replica.
        shared = settings.catalog.is_postgres and s.store.redis is not None
        s.coverage = CoverageService(s.catalog, s.kv_space, shared_tier_only=shared)
    if "documents" in needs:
        from app.services.document_service import DocumentService

        assert s.store is not None and s.retriever is not None
        # One DocumentService for the routes and the ingest jobs: a deletion keeps the KV a running job holds.
        s.documents = DocumentService(s.catalog, s.retriever, s.store, coverage=s.coverage, storage=storage)
    if "job_queue" in needs and settings.catalog.is_postgres:
        # Scale-out: jobs go to the PostgreSQL queue (`blendrag worker`), the index follows the catalog.
        from app.jobs.pg_queue import PgJobQueue

        s.job_queue = PgJobQueue(settings.catalog.url or "")
    if "ingest" in needs:
        s.ingest = new_ingest(s, hooks)
    if "ask" in needs:
        s.ask = new_ask(s, hooks)


class EngineParts(TypedDict):
    """The parts ask and ingest are both built on, under the names their constructors take."""

    catalog: Catalog
    retriever: Retriever
    engine: Engine
    kv_space: KVSpace
    scheduler: Scheduler


def _engine_parts(s: Services, scheduler: Scheduler | None) -> EngineParts:
    """`s`'s parts for ask and ingest (`scheduler` default: `s.scheduler`); each must have been built."""
    scheduler = scheduler or s.scheduler
    assert s.catalog is not None and s.retriever is not None and s.engine is not None
    assert s.kv_space is not None and scheduler is not None, "ask and ingest need the engine parts built"
    return EngineParts(
        catalog=s.catalog, retriever=s.retriever, engine=s.engine, kv_space=s.kv_space, scheduler=scheduler
    )


def new_ask(s: Services, hooks: Hooks | None = None, *, scheduler: Scheduler | None = None) -> AskService:
    """An AskService over `s`'s parts, on `scheduler` (default: `s.scheduler`)."""
    from app.services.ask import AskService

    hooks = hooks or Hooks()
    storage = hooks.storage
    return AskService(
        s.settings,
        **_engine_parts(s, scheduler),
        conversations=s.conversations,
        metrics=hooks.metrics,
        full_pass_rate=hooks.full_pass_rate,
        on_storage_fault=storage.record if storage is not None else None,
        on_storage_ok=storage.recovered if storage is not None else None,
    )


def new_ingest(
    s: Services,
    hooks: Hooks | None = None,
    *,
    scheduler: Scheduler | None = None,
    dispatch: Callable[[str], object] | None = None,
) -> IngestService:
    """An IngestService over `s`'s parts, on `scheduler` (default: `s.scheduler`); its jobs go to `dispatch`
    (default: the server's PostgreSQL job queue when there is one, else the service's own thread)."""
    from app.services.ingest import IngestService
    from app.services.ingest.context import IngestEnv

    hooks = hooks or Hooks()
    storage = hooks.storage
    if dispatch is None and s.job_queue is not None:
        dispatch = s.job_queue.enqueue
    assert s.documents is not None
    env = IngestEnv(
        settings=s.settings,
        **_engine_parts(s, scheduler),
        documents=s.documents,
        full_pass_rate=hooks.full_pass_rate,
        on_storage_fault=storage.record if storage is not None else None,
    )
    return IngestService(
        env,
        dispatch=dispatch,
        on_chunks_committed=hooks.on_chunks_committed,
        free_space=storage.release_reserve if storage is not None else None,
    )


def new_scheduler(settings: Settings, engine: Engine) -> Scheduler:
    """The engine's scheduler, not started: unstarted, it computes chunk KV in the caller's thread."""
    from engine.scheduler import Scheduler

    return Scheduler(
        engine,
        max_queue=settings.engine.max_queue,
        max_running=settings.engine.max_running,
        max_queue_wait_s=settings.engine.max_queue_wait_s,
    )


def catalog_label(url: str) -> str:
    """The catalog URL without a password, for logs."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a log label only
        return "catalog"
