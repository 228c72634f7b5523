"""FastAPI dependencies: the app state and its services, 503 until models are loaded."""

from __future__ import annotations

from fastapi import HTTPException, Request

from app.services.ask_service import AskService
from app.services.ingest_service import IngestService
from app.state import AppState


def get_state(request: Request) -> AppState:
    return request.app.state.blendrag


def _not_ready(state: AppState) -> HTTPException:
    detail = f"start-up failed: {state.load_error}" if state.load_error else "models are still loading"
    return HTTPException(status_code=503, detail=detail)


def get_ingest(request: Request) -> IngestService:
    state = get_state(request)
    if state.ingest is None:
        raise _not_ready(state)
    return state.ingest


def get_ask(request: Request) -> AskService:
    state = get_state(request)
    if state.ask is None:
        raise _not_ready(state)
    return state.ask
