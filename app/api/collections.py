"""GET /collections (scoped to the caller's collections) and DELETE /collections/{name} (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path

from app.api.deps import Access, get_state, require_admin, require_reader
from app.api.schemas import CollectionDeletedOut, CollectionListOut, CollectionOut
from app.api.schemas.common import API_KEY_REQUIRED, GUARD_ERRORS, error_responses
from app.services.collection_service import CollectionBusy, CollectionNotFound, CollectionService
from app.services.document_service import DocumentBusy
from app.services.key_service import COLLECTION_PATTERN
from app.state import AppState

router = APIRouter(
    prefix="/collections",
    tags=["collections"],
    responses=error_responses({**GUARD_ERRORS, 401: API_KEY_REQUIRED}),
)


def get_collections(state: AppState = Depends(get_state)) -> CollectionService:
    from app.api.deps import _not_ready

    services = state.services
    if services is None or services.documents is None or services.coverage is None or services.catalog is None:
        raise _not_ready(state)
    return CollectionService(services.catalog, services.coverage, services.documents)


@router.get("", response_model=CollectionListOut)
def list_collections(
    access: Access = Depends(require_reader), service: CollectionService = Depends(get_collections)
) -> CollectionListOut:
    """The collections you may read, with their documents, chunks and KV coverage."""
    return CollectionListOut(collections=[CollectionOut.model_validate(c) for c in service.list(access.collections)])


@router.delete(
    "/{name}",
    response_model=CollectionDeletedOut,
    dependencies=[Depends(require_admin)],
    responses=error_responses(
        {
            403: "A collection key may not delete collections",
            404: "No document is in this collection",
            422: "Not a collection name",
            409: "A document of it is still being ingested",
        }
    ),
)
def delete_collection(
    name: Annotated[str, Path(pattern=COLLECTION_PATTERN, description="The collection")],
    service: CollectionService = Depends(get_collections),
) -> CollectionDeletedOut:
    """Delete every document of a collection (a KV entry goes only when no other chunk uses it)."""
    try:
        deleted = service.delete(name)
    except CollectionNotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except (CollectionBusy, DocumentBusy) as exc:
        raise HTTPException(409, str(exc)) from exc
    return CollectionDeletedOut(name=name, deleted=deleted)
