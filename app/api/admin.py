"""Admin data: cache coverage, serving stats for the admin page, and Prometheus /metrics.

All of these need a key when `server.api_key` is set (Prometheus sends it with `authorization:
{credentials: …}` in its scrape config). /metrics is the admin's; a collection key reads /api/coverage
and /api/stats of its own collections (document counts and coverage; the serving numbers are the server's).
"""

from __future__ import annotations

import dataclasses

from fastapi import Depends, Response

from app.api.deps import Access, get_coverage, get_state, guarded_router, require_admin, require_reader
from app.api.schemas import CoverageOut, ErrorOut, StatsOut
from app.api.schemas.common import API_KEY_REQUIRED
from app.services.coverage_service import CoverageService
from app.services.stats_service import server_wide_left_out
from app.state import AppState

router = guarded_router("admin", require_reader, {401: API_KEY_REQUIRED})


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
        403: {"model": ErrorOut, "description": "A collection key may not read the server's metrics"},
    },
    dependencies=[Depends(require_admin)],
)
def metrics(state: AppState = Depends(get_state)) -> Response:
    """Prometheus metrics: requests by route template and status, TTFT per mode, recompute ratio, KV
    hits/misses/bytes per tier (read from the store at scrape time), ingest throughput, queue depth."""
    state.stats.refresh_metrics(state.services.store if state.services is not None else None, state.scheduler)
    return Response(state.metrics.render(), media_type=state.metrics.content_type)


@router.get("/api/coverage", response_model=CoverageOut)
def coverage(service: CoverageService = Depends(get_coverage), access: Access = Depends(require_reader)) -> CoverageOut:
    """How much of the library (your collections) can be answered from stored KV now: fresh / stale /
    missing chunks, in total and per ready document, and bytes of fresh entries per tier."""
    view = service.compute(access.collections)
    return CoverageOut.model_validate(view)


@router.get("/api/stats", response_model=StatsOut)
def stats(state: AppState = Depends(get_state), access: Access = Depends(require_reader)) -> StatsOut:
    """Everything the admin page shows besides coverage: KV hit rates per tier, recent TTFT by mode,
    ingest throughput, queue depth. A collection key gets the document counts of its collections; the
    figures of every collection together (recent answers and their timings, KV tiers, lookups, ingest
    counts, conversation counts) are left to admins (empty or null)."""
    services = state.services
    documents = services.documents if services is not None else None
    snapshot = state.stats.snapshot(state.serving(), documents, state.scheduler, access.collections)
    if not access.is_admin:
        snapshot = server_wide_left_out(snapshot)
    conversations = services.conversations if services is not None else None
    counts = conversations.counts() if conversations is not None and access.is_admin else None
    return StatsOut.model_validate(
        {
            **dataclasses.asdict(snapshot),
            "storage": dataclasses.asdict(state.storage.status()),
            "conversations": counts.num_conversations if counts is not None else None,
            "conversation_turns": counts.num_turns if counts is not None else None,
        }
    )
