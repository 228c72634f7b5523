"""Admin data: cache coverage, serving stats for the admin page, and Prometheus /metrics.

All of these need the API key when `server.api_key` is set (Prometheus sends it with
`authorization: {credentials: …}` in its scrape config).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from fastapi import APIRouter, Depends, Response

from app.api.deps import get_coverage, get_state, queue_depth, require_api_key
from app.api.schemas import CoverageOut, ErrorOut, ModeStatsOut, RecentAskOut, StatsOut, TierStatsOut
from app.catalog import DocumentStatus
from app.metrics import RecentAsk
from app.services.coverage_service import CoverageService
from app.state import AppState

router = APIRouter(tags=["admin"], dependencies=[Depends(require_api_key)],
                   responses={401: {"model": ErrorOut, "description": "API key required"}})


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
def metrics(state: AppState = Depends(get_state)) -> Response:
    """Prometheus metrics: requests by route template and status, TTFT per mode, recompute ratio, KV
    hits/misses/bytes per tier (read from the store at scrape time), ingest throughput, queue depth."""
    store_stats = state.components.store.stats() if state.components is not None else None
    state.metrics.refresh(store_stats, queue_depth(state))
    return Response(state.metrics.render(), media_type=state.metrics.content_type)


@router.get("/api/coverage", response_model=CoverageOut)
def coverage(service: CoverageService = Depends(get_coverage)) -> CoverageOut:
    """How much of the library can be answered from stored KV now: fresh / stale / missing chunks, in
    total and per ready document, and bytes of fresh entries per tier."""
    view = service.compute()
    return CoverageOut.model_validate(dataclasses.asdict(view))


def _rate(hits: int, misses: int) -> float | None:
    return round(hits / (hits + misses), 6) if hits + misses else None


def _ttft_by_mode(recent: list[RecentAsk]) -> dict[str, ModeStatsOut]:
    by_mode: dict[str, list[float]] = {}
    for ask in recent:
        by_mode.setdefault(ask.mode, []).append(ask.ttft_ms)
    out = {}
    for mode, values in sorted(by_mode.items()):
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
        out[mode] = ModeStatsOut(count=len(values), ttft_ms_mean=round(statistics.fmean(values), 2),
                                 ttft_ms_p50=round(statistics.median(values), 2), ttft_ms_p95=round(p95, 2))
    return out


@router.get("/api/stats", response_model=StatsOut)
def stats(state: AppState = Depends(get_state)) -> StatsOut:
    """Everything the admin page shows besides coverage: KV hit rates per tier, recent TTFT by mode,
    ingest throughput, queue depth."""
    m = state.metrics
    sample = m.registry.get_sample_value
    components = state.components
    tiers: list[TierStatsOut] = []
    kv_hit_rate = None
    documents_by_status: dict[str, int] = {}
    if components is not None:
        st = components.store.stats()
        kv_hit_rate = _rate(st.num_hits, st.num_misses)
        tiers = [TierStatsOut(name=t.name, available=t.available, num_entries=t.num_entries,
                              num_bytes=t.num_bytes, budget_bytes=t.budget_bytes, num_hits=t.num_hits,
                              num_misses=t.num_misses,
                              hit_rate=_rate(t.num_hits, t.num_misses), num_evictions=t.num_evictions,
                              num_faults=t.num_faults) for t in st.tiers]
        for status in DocumentStatus:
            _, total = components.catalog.list_documents(offset=0, limit=1, status=status)
            documents_by_status[status.value] = total
    chunks = int(sample("blendrag_ingest_chunks_total") or 0)
    seconds = float(sample("blendrag_ingest_seconds_total") or 0.0)
    recent = m.recent.snapshot()
    model = state.settings.engine.model
    return StatsOut(
        model=model if model == "builtin" else Path(model).name,
        fingerprint=components.engine.fingerprint[:12] if components is not None else None,
        default_mode=state.settings.engine.mode, default_selector=state.settings.engine.selector,
        default_recompute_ratio=state.settings.engine.recompute_ratio,
        queue_depth=queue_depth(state),
        prefill_tokens_per_s=(round(state.prefill_rate.tokens_per_s, 1)
                              if state.prefill_rate.tokens_per_s is not None else None),
        documents_by_status=documents_by_status, kv_tiers=tiers, kv_hit_rate=kv_hit_rate,
        ask_kv_hits=int(sample("blendrag_ask_kv_lookups_total", {"result": "hit"}) or 0),
        ask_kv_misses=int(sample("blendrag_ask_kv_lookups_total", {"result": "miss"}) or 0),
        ingest_chunks=chunks, ingest_seconds=round(seconds, 3),
        ingest_chunks_per_s=round(chunks / seconds, 2) if seconds > 0 else None,
        ttft_by_mode=_ttft_by_mode(recent),
        recent=[RecentAskOut.model_validate(dataclasses.asdict(r)) for r in recent],
    )
