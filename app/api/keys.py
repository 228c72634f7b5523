"""Collection keys (admin only): make one (the secret is shown once), list them, revoke one.

A key is refused by every replica within `server.key_cache_s` of its revocation.
"""

from __future__ import annotations

from fastapi import Depends, HTTPException, Request, Response

from app.api.deps import get_keys, get_state, guarded_router, require_admin
from app.api.schemas import ErrorOut, KeyCreatedOut, KeyIn, KeyListOut, KeyOut
from app.api.schemas.common import MODELS_LOADING, error_responses
from app.services.key_service import KeyRequestError, KeyService

router = guarded_router(
    "admin",
    require_admin,
    {401: "Admin key required", 403: "A collection key may not manage keys", 503: MODELS_LOADING},
    prefix="/admin/keys",
)


@router.post(
    "",
    status_code=201,
    response_model=KeyCreatedOut,
    responses=error_responses(
        {
            400: "The body is not JSON (or not UTF-8)",
            409: "No server.api_key is set",
            422: "Invalid name or collections",
        }
    ),
)
def create_key(body: KeyIn, request: Request, service: KeyService = Depends(get_keys)) -> KeyCreatedOut:
    """Make a collection key; the answer holds its secret, shown this once (only a hash is stored)."""
    if not get_state(request).settings.server.api_key:
        # Without an admin key the server is open; a first collection key would close the question routes
        # to everyone while leaving the admin routes open.
        raise HTTPException(409, "set server.api_key (the admin key) before making collection keys")
    try:
        created = service.create(body.name, body.collections, body.can_ingest)
    except KeyRequestError as exc:
        raise HTTPException(422, str(exc)) from exc
    return KeyCreatedOut(key_id=created.record.id, key=created.secret)


@router.get("", response_model=KeyListOut)
def list_keys(service: KeyService = Depends(get_keys)) -> KeyListOut:
    """Every collection key, oldest first (names, collections, dates; never the secrets)."""
    return KeyListOut(keys=[KeyOut.model_validate(k) for k in service.list()])


@router.delete("/{key_id}", status_code=204, response_class=Response, responses={404: {"model": ErrorOut}})
def revoke_key(key_id: str, service: KeyService = Depends(get_keys)) -> Response:
    """Revoke a key: refused from now on by this replica, by every replica within `server.key_cache_s`."""
    if not service.revoke(key_id):
        raise HTTPException(404, f"no key {key_id}")
    return Response(status_code=204)
