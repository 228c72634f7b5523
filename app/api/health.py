from __future__ import annotations

import dataclasses

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from app.api.deps import NOT_READY_RETRY_S, get_state
from app.api.errors import retry_after
from app.api.schemas.common import RETRY_AFTER_HEADER
from app.state import AppState

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is alive (models may still be loading)."""
    return {"status": "ok"}


@router.get(
    "/ready",
    responses={
        200: {
            "description": '`{"status": "ready", "storage": {ok, free_bytes, last_fault, last_fault_at}}`: '
            "questions are answered; `storage.ok: false` means writes (ingest, deletes) may fail "
            "with 507 until space is freed"
        },
        503: {
            "description": '`{"status": "loading"}` or `{"status": "failed", "error": …}`',
            "headers": RETRY_AFTER_HEADER,
        },
    },
)
async def ready(state: AppState = Depends(get_state)) -> JSONResponse:
    """200 once models are loaded and the stores are open; 503 before (or if start-up failed)."""
    if state.ready.is_set():
        return JSONResponse({"status": "ready", "storage": dataclasses.asdict(state.storage.status())})
    body = {"status": "failed", "error": state.load_error} if state.load_error else {"status": "loading"}
    return JSONResponse(body, status_code=503, headers=retry_after(NOT_READY_RETRY_S))
