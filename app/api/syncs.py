"""Folder sync routes: `blendrag sync` plans a sync and finishes it here (the files go through POST /ingest);
the admin page lists the synced folders. Thin: FolderSyncService does the work."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

from fastapi import Depends, HTTPException

from app.api.deps import Access, get_state, guarded_router, require_reader
from app.api.schemas.common import API_KEY_REQUIRED, MODELS_LOADING
from app.api.schemas.syncs import (
    FolderSyncList,
    FolderSyncOut,
    SyncFinishIn,
    SyncFinishOut,
    SyncIn,
    SyncPlanOut,
    SyncRemovalOut,
)
from app.services.folder_sync.plan import SyncManifest, SyncPlan
from app.services.folder_sync.service import FolderSyncService, SyncRefused, SyncRequest
from app.state import AppState

router = guarded_router(
    "syncs",
    require_reader,
    {
        400: "A body that is not valid JSON",
        401: API_KEY_REQUIRED,
        403: "The key may not ingest into this collection",
        409: "The collection follows another folder, or would lose documents the folder lacks",
        422: "Invalid request",
        503: MODELS_LOADING,
    },
    prefix="/syncs",
)


def get_syncs(state: AppState = Depends(get_state)) -> FolderSyncService:
    from app.api.deps import _not_ready

    services = state.services
    if services is None or services.catalog is None or services.documents is None:
        raise _not_ready(state)
    return FolderSyncService(services.catalog, services.documents)


def _request(body: SyncIn, access: Access) -> SyncRequest:
    access.check_ingest(body.collection)
    return SyncRequest(body.collection, body.folder, SyncManifest(dict(body.files), list(body.held)), body.replace)


@router.get("", response_model=FolderSyncList)
def list_syncs(
    access: Access = Depends(require_reader), service: FolderSyncService = Depends(get_syncs)
) -> FolderSyncList:
    """The folders `blendrag sync` keeps your collections equal to: path, last sync, what it changed."""
    return FolderSyncList(syncs=[FolderSyncOut.model_validate(r) for r in service.list(access.collections)])


@router.post("/plan", response_model=SyncPlanOut)
async def plan_sync(
    body: SyncIn, access: Access = Depends(require_reader), service: FolderSyncService = Depends(get_syncs)
) -> SyncPlanOut:
    """What a sync of the folder must ingest and remove (409 when the collection follows another folder, or
    holds documents the folder lacks on a first sync, without `replace`)."""
    request = _request(body, access)
    try:
        plan = await asyncio.to_thread(service.plan, request)
    except SyncRefused as exc:
        raise HTTPException(409, str(exc)) from exc
    return SyncPlanOut(**asdict(plan))


@router.post("/remove", response_model=SyncRemovalOut)
async def remove_gone(
    body: SyncIn, access: Access = Depends(require_reader), service: FolderSyncService = Depends(get_syncs)
) -> SyncRemovalOut:
    """Delete the documents (chunks, index entries, unreferenced KV) of sources the folder no longer has."""
    try:
        removal = await asyncio.to_thread(service.remove_gone, _request(body, access))
    except SyncRefused as exc:
        raise HTTPException(409, str(exc)) from exc
    return SyncRemovalOut(removed=removal.removed, busy=removal.busy)


@router.post("/finish", response_model=SyncFinishOut)
async def finish_sync(
    body: SyncFinishIn, access: Access = Depends(require_reader), service: FolderSyncService = Depends(get_syncs)
) -> SyncFinishOut:
    """After the plan's files were ingested: delete the documents of files the folder no longer has and the
    versions left behind, and record the sync."""
    request = _request(body, access)
    plan = SyncPlan(**body.plan.model_dump())
    try:
        outcome = await asyncio.to_thread(service.finish, request, plan, body.num_skipped, body.removed)
    except SyncRefused as exc:
        raise HTTPException(409, str(exc)) from exc
    return SyncFinishOut(
        changes=asdict(outcome.changes),  # type: ignore[arg-type]
        record=FolderSyncOut.model_validate(outcome.record),
        failed=outcome.failed,
        busy=outcome.busy,
    )
