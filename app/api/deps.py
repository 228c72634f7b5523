"""FastAPI dependencies: the app state, its services (503 until models are loaded) and the API key."""

from __future__ import annotations

import dataclasses
import hmac
import math
from collections.abc import Callable
from typing import TypeVar

from fastapi import HTTPException, Request

from app.api.rate_limit import client_id
from app.services.ask_service import AskService
from app.services.ask_types import AskRequest
from app.services.conversation_service import ConversationService, owner_of
from app.services.coverage_service import CoverageService
from app.services.document_service import DocumentService
from app.services.ingest import IngestService
from app.state import AppState

T = TypeVar("T")


def get_state(request: Request) -> AppState:
    return request.app.state.blendrag


def _not_ready(state: AppState) -> HTTPException:
    detail = f"start-up failed: {state.load_error}" if state.load_error else "models are still loading"
    return HTTPException(status_code=503, detail=detail, headers={"Retry-After": "5"})


def _loaded(pick: Callable[[AppState], T | None]) -> Callable[[Request], T]:
    """A dependency giving one service of the loaded app; 503 (with Retry-After) until start-up has built it."""

    def dependency(request: Request) -> T:
        state = get_state(request)
        value = pick(state)
        if value is None:
            raise _not_ready(state)
        return value

    return dependency


get_ingest: Callable[[Request], IngestService] = _loaded(lambda s: s.ingest)
get_ask: Callable[[Request], AskService] = _loaded(lambda s: s.ask)
get_coverage: Callable[[Request], CoverageService] = _loaded(lambda s: s.coverage)
get_documents: Callable[[Request], DocumentService] = _loaded(lambda s: s.documents)
get_conversations: Callable[[Request], ConversationService] = _loaded(lambda s: s.conversations)


def engine_is_full(state: AppState) -> bool:
    """True when the scheduler would refuse a new request now: a cheap early check that spares retrieval.
    Not binding (requests race between it and the scheduler): routes admit to the scheduler before they
    answer (`AskService.admit`), so a full engine is always a 503, never a 200 stream ending in `busy`."""
    scheduler = state.scheduler
    return scheduler is not None and scheduler.num_waiting >= scheduler.max_queue


def presented_key(request: Request) -> str | None:
    """The key a client sent: `Authorization: Bearer <key>` or `X-API-Key: <key>`."""
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("x-api-key") or None


def conversation_owner(request: Request) -> str | None:
    """Whose conversations a request sees: its key's hash, or None (every caller without a key)."""
    return owner_of(presented_key(request))


def require_api_key(request: Request) -> None:
    """401 unless `server.api_key` is unset or the request presents it (compared in constant time)."""
    _check_key(request, get_state(request).settings.server.api_key)


def client_host(request: Request) -> str | None:
    """The client's IP address (X-Forwarded-For already applied for trusted proxies, see app/main.py)."""
    return request.client.host if request.client else None


def guard_questions(request: Request) -> None:
    """The question routes: a wrong key is a 401 (429 past the wrong-key limit); the key is required with
    `server.protect_ask`; then the rate limit (429), bucketed on a valid key, else on the client address."""
    state = get_state(request)
    server = state.settings.server
    valid_key = _check_key(request, server.api_key, required=server.protect_ask)
    request.state.anonymous = valid_key is None
    limiter = state.rate_limiter
    if limiter is None:
        return
    client = client_id(valid_key, client_host(request))
    wait_s = limiter.acquire(client)
    if wait_s is not None:
        raise HTTPException(
            status_code=429,
            detail=f"too many questions: at most {server.ask_rate_per_minute:g} per minute, {server.ask_burst} "
            "at once, per API key (or IP address); retry later",
            headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
        )


def cap_for_client(ask: AskRequest, request: Request) -> AskRequest:
    """Clip `max_tokens` of an anonymous question (no valid key) to `server.anonymous_max_tokens`."""
    settings = get_state(request).settings
    cap = settings.server.anonymous_max_tokens
    if cap is None or not getattr(request.state, "anonymous", True):
        return ask
    wanted = ask.max_tokens or settings.engine.max_new_tokens
    return dataclasses.replace(ask, max_tokens=cap) if wanted > cap else ask


def _check_key(request: Request, expected: str | None, *, required: bool = True) -> str | None:
    """The valid key the request presents (None without one). A wrong key is always a 401, and counts
    against the address's wrong-key budget (429 once spent); no key is a 401 when `required`."""
    if not expected:
        return None  # no key configured: whatever a client sends means nothing
    given = presented_key(request)
    if given is not None and hmac.compare_digest(given.encode(), expected.encode()):
        return given
    if given is not None:
        state = get_state(request)
        wait_s = state.wrong_key_limiter.acquire(client_id(None, client_host(request)))
        if wait_s is not None:
            server = state.settings.server
            raise HTTPException(
                status_code=429,
                detail=f"too many requests with a wrong API key from this address (at most "
                f"{server.wrong_key_per_minute:g} per minute); retry later",
                headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
            )
    if given is None and not required:
        return None
    raise HTTPException(
        status_code=401,
        detail="missing or wrong API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
        headers={"WWW-Authenticate": "Bearer"},
    )
