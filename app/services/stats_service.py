"""StatsService: what the admin page shows besides coverage, gathered from the metrics, the KV store, the
catalog and the scheduler (before start-up finishes, only what needs no models)."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.metrics import Metrics, RecentAsk
from app.services.estimates import FullPassRate

if TYPE_CHECKING:
    from collections.abc import Collection

    from app.calibration.in_force import BlendInForce
    from app.services.document_service import DocumentService
    from engine.config import EngineSettings
    from engine.dtype_choice import DtypeChoice
    from engine.engine import Engine
    from engine.models.resolve import ServedModel
    from engine.scheduler import Scheduler
    from kvcache.config import KVCacheSettings
    from kvcache.stats import TierStats
    from kvcache.store import TieredKVStore


@dataclass(frozen=True)
class ServingParts:
    """What the stats read of a started server: the engine (its model, dtype and the blend settings it serves
    with), the KV store, the embedder's compute dtype, where the blend settings came from and the background
    calibration's state."""

    engine: Engine
    store: TieredKVStore
    embedder_compute: DtypeChoice | None
    blend: BlendInForce | None
    calibration: dict[str, Any] | None


@dataclass(frozen=True)
class ModeStats:
    count: int
    ttft_ms_mean: float
    ttft_ms_p50: float
    ttft_ms_p95: float


@dataclass(frozen=True)
class KVFootprint:
    """What the KV store costs: its format's bytes per token, the disk budget and what the disk holds."""

    storage_dtype: str
    bytes_per_token: float | None  # scales included; None before the model is loaded
    bytes_per_million_tokens: float | None
    eviction: str
    disk_budget_bytes: int | None  # None: no disk tier
    disk_bytes: int | None  # None: left out for a collection key
    disk_entries: int | None


def kv_footprint(parts: ServingParts | None, settings: KVCacheSettings) -> KVFootprint:
    from kvcache.format import Int4Params, format_bytes_per_token

    per_token = None
    disk_budget, disk_bytes, disk_entries = None, 0, 0
    if parts is not None:
        cfg = parts.engine.config
        per_token = format_bytes_per_token(
            settings.storage_dtype,
            num_layers=cfg.num_layers,
            kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            int4=Int4Params(k_group=settings.int4_k_group, v_group=settings.int4_v_group),
        )
        disk = parts.store.disk
        if disk is not None:
            st = disk.stats()
            disk_budget, disk_bytes, disk_entries = st.budget_bytes, st.num_bytes, st.num_entries
    return KVFootprint(
        storage_dtype=settings.storage_dtype,
        bytes_per_token=round(per_token, 1) if per_token is not None else None,
        bytes_per_million_tokens=round(per_token * 1e6) if per_token is not None else None,
        eviction=settings.eviction,
        disk_budget_bytes=disk_budget,
        disk_bytes=disk_bytes,
        disk_entries=disk_entries,
    )


@dataclass(frozen=True)
class ServingStats:
    model: str | None
    served_model: ServedModel | None
    fingerprint: str | None
    compute: DtypeChoice | None  # the engine's dtype and why (None before start-up)
    embedder_compute: DtypeChoice | None
    default_mode: str
    default_selector: str
    default_recompute_ratio: float
    # The blend settings in force and where they came from (app/calibration/in_force.py); None before start-up.
    blend_settings: dict[str, Any] | None
    calibration: dict[str, Any] | None  # the background calibration's state (app/calibration/runner.py)
    queue_depth: int | None
    prefill_tokens_per_s: float | None
    documents_by_status: dict[str, int]
    kv_tiers: list[TierStats]  # the store's own, in lookup order
    kv_hit_rate: float | None
    kv_footprint: KVFootprint
    ask_kv_hits: int | None  # None: left out for a collection key (server_wide_left_out), as below
    ask_kv_misses: int | None
    ingest_chunks: int | None
    ingest_seconds: float | None
    ingest_chunks_per_s: float | None
    ttft_by_mode: dict[str, ModeStats]
    recent: list[RecentAsk]


# The ServingStats counts that sum up every collection's questions and ingests.
_SERVER_WIDE_COUNTS = (
    "kv_hit_rate",
    "ask_kv_hits",
    "ask_kv_misses",
    "ingest_chunks",
    "ingest_seconds",
    "ingest_chunks_per_s",
)


def server_wide_left_out(stats: ServingStats) -> ServingStats:
    """`stats` as a collection key sees them: what sums up every collection (the times of other collections'
    questions, their KV entries, lookups and ingested chunks) is emptied; its own documents' counts stay."""
    footprint = dataclasses.replace(stats.kv_footprint, disk_budget_bytes=None, disk_bytes=None, disk_entries=None)
    counts = dict.fromkeys(_SERVER_WIDE_COUNTS)  # each None: "left out"
    return dataclasses.replace(stats, kv_tiers=[], kv_footprint=footprint, ttft_by_mode={}, recent=[], **counts)


def queue_depth(scheduler: Scheduler | None) -> int | None:
    """Requests waiting or running in the engine scheduler (None before start-up)."""
    # Waiting, in the prompt pass, or decoding: a request in its prompt pass is neither waiting nor running.
    return None if scheduler is None else scheduler.queue_depth


def hit_rate(hits: int, misses: int) -> float | None:
    return round(hits / (hits + misses), 6) if hits + misses else None


def ttft_by_mode(recent: list[RecentAsk]) -> dict[str, ModeStats]:
    by_mode: dict[str, list[float]] = {}
    for ask in recent:
        if ask.num_context_tokens > 0:  # a question with no documents is as fast in every mode
            by_mode.setdefault(ask.mode, []).append(ask.ttft_ms)
    out = {}
    for mode, values in sorted(by_mode.items()):
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
        out[mode] = ModeStats(
            count=len(values),
            ttft_ms_mean=round(statistics.fmean(values), 2),
            ttft_ms_p50=round(statistics.median(values), 2),
            ttft_ms_p95=round(p95, 2),
        )
    return out


class StatsService:
    def __init__(
        self,
        engine_settings: EngineSettings,
        metrics: Metrics,
        full_pass_rate: FullPassRate,
        kv_settings: KVCacheSettings | None = None,
    ) -> None:
        from kvcache.config import KVCacheSettings

        self._engine = engine_settings
        self._kv_settings = kv_settings or KVCacheSettings()
        self._metrics = metrics
        self._full_pass_rate = full_pass_rate

    def snapshot(
        self,
        parts: ServingParts | None,
        documents: DocumentService | None,
        scheduler: Scheduler | None,
        collections: Collection[str] | None = None,
    ) -> ServingStats:
        """The serving numbers; document counts are those of `collections` (None: all)."""
        sample = self._metrics.registry.get_sample_value
        tiers: list[TierStats] = []
        kv_hit_rate = None
        if parts is not None:
            store_stats = parts.store.stats()
            kv_hit_rate = hit_rate(store_stats.num_hits, store_stats.num_misses)
            tiers = list(store_stats.tiers)
        chunks = int(sample("blendrag_ingest_chunks_total") or 0)
        seconds = float(sample("blendrag_ingest_seconds_total") or 0.0)
        recent = self._metrics.recent.snapshot()
        rate = self._full_pass_rate.tokens_per_s
        engine = parts.engine if parts is not None else None
        served = engine.served_model if engine is not None else None
        # The engine serves with the blend settings in force (app/calibration/in_force.py); before start-up,
        # the configured ones.
        engine_settings = engine.settings if engine is not None else self._engine
        in_force = parts.blend if parts is not None else None
        return ServingStats(
            model=served.name if served is not None else None,
            served_model=served,
            fingerprint=engine.fingerprint[:12] if engine is not None else None,
            compute=engine.dtype_choice if engine is not None else None,
            embedder_compute=parts.embedder_compute if parts is not None else None,
            default_mode=engine_settings.mode,
            default_selector=engine_settings.blend.selector,
            default_recompute_ratio=engine_settings.blend.recompute_ratio,
            blend_settings=in_force.describe(engine_settings) if in_force is not None else None,
            calibration=parts.calibration if parts is not None else None,
            queue_depth=queue_depth(scheduler),
            prefill_tokens_per_s=round(rate, 1) if rate is not None else None,
            documents_by_status=documents.count_by_status(collections) if documents is not None else {},
            kv_tiers=tiers,
            kv_hit_rate=kv_hit_rate,
            kv_footprint=kv_footprint(parts, self._kv_settings),
            ask_kv_hits=int(sample("blendrag_ask_kv_lookups_total", {"result": "hit"}) or 0),
            ask_kv_misses=int(sample("blendrag_ask_kv_lookups_total", {"result": "miss"}) or 0),
            ingest_chunks=chunks,
            ingest_seconds=round(seconds, 3),
            ingest_chunks_per_s=round(chunks / seconds, 2) if seconds > 0 else None,
            ttft_by_mode=ttft_by_mode(recent),
            recent=recent,
        )

    def refresh_metrics(self, store: TieredKVStore | None, scheduler: Scheduler | None) -> None:
        """Read the gauges that are sampled at scrape time (store bytes per tier, queue depth)."""
        self._metrics.refresh(store.stats() if store is not None else None, queue_depth(scheduler))
