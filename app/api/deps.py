"""FastAPI dependencies: the app state, its services (503 until models are loaded) and who is asking.

Every request that shows or changes the library gets an `Access`: the admin (`server.api_key`, or anyone
on a server without one), a collection key (stored hashed in the catalog, app/services/key_service.py),
or anonymous. Routes depend on `require_admin` (admin only), `require_reader` (admin or a collection key,
scoped to its collections) or `guard_questions` (the question routes: anonymous too, when allowed).
"""

from __future__ import annotations

import dataclasses
import hmac
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Request

from app.api.errors import retry_after
from app.api.schemas.common import GUARD_ERRORS, error_responses
from app.build import Services
from app.catalog.models import DEFAULT_COLLECTION
from app.rate_limit import client_id
from app.services.ask import AskRequest, AskService
from app.services.conversation_service import ConversationService, owner_of
from app.services.coverage_service import CoverageService
from app.services.document_service import DocumentService
from app.services.ingest import IngestService
from app.services.key_service import SECRET_PREFIX, KeyService
from app.state import AppState

T = TypeVar("T")

# Before start-up has built the services (models loading, stores opening): a retry in a few seconds.
NOT_READY_RETRY_S = 5


def guarded_router(tag: str, guard: Callable[..., Any], errors: dict[int, str], *, prefix: str = "") -> APIRouter:
    """A router whose every route is behind `guard` (`require_admin`, `require_reader`, `guard_questions`),
    documenting the error statuses its routes share (the guard's own 429 and 503 included)."""
    responses = error_responses({**GUARD_ERRORS, **errors})
    return APIRouter(prefix=prefix, tags=[tag], dependencies=[Depends(guard)], responses=responses)


def get_state(request: Request) -> AppState:
    return request.app.state.blendrag


def _not_ready(state: AppState) -> HTTPException:
    detail = f"start-up failed: {state.load_error}" if state.load_error else "models are still loading"
    return HTTPException(status_code=503, detail=detail, headers=retry_after(NOT_READY_RETRY_S))


def _loaded(pick: Callable[[Services], T | None]) -> Callable[[Request], T]:
    """A dependency giving one service of the loaded app (what start-up built: `AppState.services`); 503
    (with Retry-After) until start-up has built it."""

    def dependency(request: Request) -> T:
        state = get_state(request)
        value = pick(state.services) if state.services is not None else None
        if value is None:
            raise _not_ready(state)
        return value

    return dependency


get_ingest: Callable[[Request], IngestService] = _loaded(lambda s: s.ingest)
get_ask: Callable[[Request], AskService] = _loaded(lambda s: s.ask)
get_coverage: Callable[[Request], CoverageService] = _loaded(lambda s: s.coverage)
get_documents: Callable[[Request], DocumentService] = _loaded(lambda s: s.documents)
get_conversations: Callable[[Request], ConversationService] = _loaded(lambda s: s.conversations)
get_keys: Callable[[Request], KeyService] = _loaded(lambda s: s.keys)


def _key_service(state: AppState) -> KeyService | None:
    """The collection keys' service once the catalog is open (None before start-up built it)."""
    return state.services.keys if state.services is not None else None


@dataclass(frozen=True)
class Access:
    """What one request may see and do. `collections` None: every collection."""

    role: Literal["admin", "key", "anonymous"]
    collections: frozenset[str] | None
    can_ingest: bool
    key_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def sees(self, collection: str) -> bool:
        return self.collections is None or collection in self.collections

    def narrowed(self, requested: Iterable[str] | None) -> frozenset[str] | None:
        """The collections a request searches: its own, or the `collections` it names (403 for one it may
        not read). None: every collection."""
        if requested is None:
            return self.collections
        wanted = frozenset(requested)
        if self.collections is not None:
            refused = sorted(wanted - self.collections)
            if refused:
                raise HTTPException(403, f"this key may not read collection {refused[0]!r}")
        return wanted

    @property
    def default_collection(self) -> str:
        """Where documents go without a `collection`: a key's own collection when it has exactly one (it can
        write nowhere else), else `default`."""
        if self.role == "key" and self.collections is not None and len(self.collections) == 1:
            return next(iter(self.collections))
        return DEFAULT_COLLECTION

    def check_ingest(self, collection: str) -> None:
        """403 unless this caller may add documents to (or delete them from) `collection`."""
        if not self.can_ingest:
            raise HTTPException(403, "this key may not ingest or delete documents")
        if not self.sees(collection):
            raise HTTPException(403, f"this key may not write to collection {collection!r}")


ADMIN = Access(role="admin", collections=None, can_ingest=True)
KEY_REQUIRED = "missing or wrong API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"


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


def client_host(request: Request) -> str | None:
    """The client's IP address (X-Forwarded-For already applied for trusted proxies, see app/main.py)."""
    return request.client.host if request.client else None


def _unauthorized() -> HTTPException:
    return HTTPException(status_code=401, detail=KEY_REQUIRED, headers={"WWW-Authenticate": "Bearer"})


def _identify(request: Request) -> Access | None:
    """The admin or a collection key, from the key the request presents; None without a key. A wrong key
    is a 401 (429 past the address's wrong-key budget) whenever keys mean something on this server."""
    cached = getattr(request.state, "access", None)
    if cached is not None:
        return cached
    state = get_state(request)
    server = state.settings.server
    given = presented_key(request)
    access: Access | None = None
    if given is not None:
        if server.api_key and hmac.compare_digest(given.encode(), server.api_key.encode()):
            access = ADMIN
        else:
            keys = _key_service(state)
            if keys is None and given.startswith(SECRET_PREFIX):
                raise _not_ready(state)  # a collection key can be checked once the catalog is open
            record = keys.authenticate(given) if keys is not None else None
            if record is not None:
                access = Access("key", frozenset(record.collections), record.can_ingest, key_id=record.id)
            elif server.api_key or (keys is not None and keys.any_keys()):
                _count_wrong_key(request)
                raise _unauthorized()
            # No key configured on this server: whatever a client sends means nothing.
    request.state.access = access
    return access


def require_reader(request: Request) -> Access:
    """Routes that show or change documents: the admin (everything) or a collection key (its collections)."""
    access = _identify(request)
    if access is None:
        if get_state(request).settings.server.api_key:
            raise _unauthorized()
        return ADMIN
    return access


def require_admin(request: Request) -> Access:
    """The admin routes: the admin key (anyone, without `server.api_key`); a collection key is a 403."""
    access = require_reader(request)
    if not access.is_admin:
        raise HTTPException(403, "this route needs the admin key; a collection key may not use it")
    return access


def question_access(request: Request) -> Access:
    """Who asks, on the question routes. Without a key: the `server.public_collections` when set; else
    everything on an open server, and a 401 once collection keys exist (or with `server.protect_ask`)."""
    access = _identify(request)
    if access is not None:
        return access
    state = get_state(request)
    server = state.settings.server
    if server.public_collections:
        return Access("anonymous", frozenset(server.public_collections), can_ingest=False)
    keys = _key_service(state)
    if (server.api_key and server.protect_ask) or (keys is not None and keys.any_keys()):
        raise _unauthorized()
    return Access("anonymous", None, can_ingest=False)


def guard_questions(request: Request) -> Access:
    """The question routes: who asks (401 as `question_access` says), then the rate limit (429), bucketed
    on a valid key (the admin's or a collection key's, each its own bucket), else on the client address."""
    state = get_state(request)
    server = state.settings.server
    access = question_access(request)
    request.state.anonymous = access.role == "anonymous"
    limiter = state.rate_limiter
    if limiter is None:
        return access
    client = client_id(presented_key(request) if access.role != "anonymous" else None, client_host(request))
    wait_s = limiter.acquire(client)
    if wait_s is not None:
        raise HTTPException(
            status_code=429,
            detail=f"too many questions: at most {server.ask_rate_per_minute:g} per minute, {server.ask_burst} "
            "at once, per API key (or IP address); retry later",
            headers=retry_after(wait_s),
        )
    return access


def scope_request(ask: AskRequest, access: Access, requested: Iterable[str] | None) -> AskRequest:
    """The question searched only in the caller's collections (narrowed to `requested`; 403 for one it may
    not read): the filter goes into retrieval itself, before top-k."""
    collections = access.narrowed(requested)
    if collections is None:
        return ask
    return dataclasses.replace(ask, filters=dataclasses.replace(ask.filters, collections=collections))


def cap_for_client(ask: AskRequest, request: Request) -> AskRequest:
    """Clip `max_tokens` of an anonymous question (no valid key) to `server.anonymous_max_tokens`."""
    settings = get_state(request).settings
    cap = settings.server.anonymous_max_tokens
    if cap is None or not getattr(request.state, "anonymous", True):
        return ask
    wanted = ask.max_tokens or settings.engine.max_new_tokens
    return dataclasses.replace(ask, max_tokens=cap) if wanted > cap else ask


def _count_wrong_key(request: Request) -> None:
    """Count a wrong key against the address's budget: 429 once it is spent."""
    state = get_state(request)
    wait_s = state.wrong_key_limiter.acquire(client_id(None, client_host(request)))
    if wait_s is not None:
        server = state.settings.server
        raise HTTPException(
            status_code=429,
            detail=f"too many requests with a wrong API key from this address (at most "
            f"{server.wrong_key_per_minute:g} per minute); retry later",
            headers=retry_after(wait_s),
        )
