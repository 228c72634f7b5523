"""Build the long-lived components (engine, scheduler, KV store, retriever, catalog) from the settings.

Heavy imports happen here, lazily, so `blendrag --help` and settings validation stay instant.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.catalog import Catalog
from app.settings import Settings

if TYPE_CHECKING:
    from app.calibration.in_force import BlendInForce
    from app.calibration.runner import CalibrationRunner
    from app.index_sync import Role
    from engine.engine import Engine
    from engine.scheduler import Scheduler
    from kvcache.store import TieredKVStore
    from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)


@dataclass
class Components:
    settings: Settings
    catalog: Catalog
    engine: Engine
    store: TieredKVStore
    retriever: Retriever
    blend: BlendInForce | None = None  # the blend settings in force and where they came from (app/calibration)
    calibration: CalibrationRunner | None = None  # the background calibration, when the server runs one

    def adopt_blend(self, in_force: BlendInForce) -> None:
        """Serve with these blend settings from the next request on (start-up, a finished calibration)."""
        from app.calibration.in_force import apply

        apply(self.engine, in_force)
        self.blend = in_force
        logger.info("start-up: blend settings in force: %s", in_force.describe()["label"])

    def expected_kv_key(self, token_ids: list[int]) -> str:
        """The KV entry key a chunk has under the current model, system prompt (any storage dtype).

        `TieredKVStore.key_for` is the one key function; the KV writer (kvcache/writer.py) uses it too.
        """
        return self.store.key_for(self.engine.fingerprint, self.engine.prompt.prefix_ids, token_ids)

    def close(self) -> None:
        """Save the index and close the stores; a failed save (a full disk) does not keep the stores open
        or fail the shutdown: the catalog is the truth, and the next start brings the index level with it."""
        try:
            self.retriever.save()
        except Exception as exc:  # noqa: BLE001 - logged; rebuilt from the catalog at the next start
            logger.error(
                "index snapshot not saved at shutdown (%s: %s); the next start rebuilds it", type(exc).__name__, exc
            )
        finally:
            try:
                self.store.close()
            finally:
                self.catalog.close()


def build_components(settings: Settings, *, role: Role = "server") -> Components:
    """Load models and open every store. Takes a few seconds (model load), minutes on first run.

    `role` matters with a PostgreSQL catalog only: a server builds its index from the catalog, a worker
    (or `blendrag ingest`) only embeds, for the catalog (see app/index_sync.py).
    """
    from app.compute_dtype import data_dir_dtype
    from app.index_sync import open_retriever
    from engine.engine import Engine
    from kvcache.store import TieredKVStore

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    catalog = Catalog(settings.catalog.url or "", migrate=settings.catalog.auto_upgrade)
    logger.info("start-up: catalog open (%s)", catalog_label(settings.catalog.url or ""))
    step = time.perf_counter()
    model = settings.engine.model
    logger.info(
        "start-up: loading the model %s%s …",
        model,
        " (a catalogue model or GGUF file is converted to safetensors under the data dir on first start, then reused)"
        if not Path(model).is_dir()
        else "",
    )
    # The dtype the data dir's KV was built in, unless the operator sets another (app/compute_dtype.py).
    dtype = data_dir_dtype(settings.data_dir, settings.engine.dtype, settings.engine.resolve_device())
    engine = Engine(settings.engine, models_dir=settings.models_dir, dtype_choice=dtype)
    logger.info(
        "start-up: model loaded and its prompt prefix warmed in %.1f s: %s",
        time.perf_counter() - step,
        engine.served_model.describe(),
    )
    store = TieredKVStore(settings.kvcache)
    logger.info("start-up: KV store open (%s)", ", ".join(t.name for t in store.stats().tiers))
    step = time.perf_counter()
    retriever = open_retriever(settings, catalog, role)
    logger.info("start-up: loading the embedder %s …", settings.retrieval.embedder)
    retriever.embedder.load()  # now, not at the first question
    logger.info(
        "start-up: embedder loaded and index of %d chunks open in %.1f s", retriever.count, time.perf_counter() - step
    )
    logger.info(
        "start-up: components ready in %.1f s (model fingerprint %s)", time.perf_counter() - t0, engine.fingerprint[:12]
    )
    components = Components(settings=settings, catalog=catalog, engine=engine, store=store, retriever=retriever)
    from app.calibration.in_force import blend_in_force

    components.adopt_blend(blend_in_force(engine, settings.engine, settings.data_dir))
    return components


def catalog_label(url: str) -> str:
    """The catalog URL without a password, for logs."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a log label only
        return "catalog"


def build_scheduler(components: Components) -> Scheduler:
    from engine.scheduler import Scheduler

    engine_settings = components.settings.engine
    return Scheduler(components.engine, max_queue=engine_settings.max_queue, max_running=engine_settings.max_running)
