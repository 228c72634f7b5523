"""GET /conversations, GET and DELETE /conversations/{id}: the caller's stored conversations.

A conversation belongs to the API key that created it and to the collections its turns searched;
another owner's conversation, one over a collection the caller may not (or no longer) read, an unknown
id and a deleted one are all 404. A conversation started without a key is listed to nobody: its id
reaches it (`?ids=` lists those of the given ids the caller may open, how the chat page shows the ones
it started). The same key rule as /ask applies (`server.protect_ask`), and the same rate limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Query, Request, Response

from app.api.deps import Access, conversation_owner, get_conversations, guard_questions, guarded_router
from app.api.schemas import (
    ConversationDetailOut,
    ConversationOut,
    ConversationPageOut,
    ErrorOut,
    TurnOut,
)
from app.api.schemas.common import MODELS_LOADING, QUESTION_GUARD_ERRORS
from app.catalog.conversations import ConversationPage
from app.services.conversation_service import ConversationNotFound, ConversationService

router = guarded_router(
    "conversations",
    guard_questions,
    {**QUESTION_GUARD_ERRORS, 422: "Invalid offset or limit", 503: MODELS_LOADING},
    prefix="/conversations",
)

MAX_OFFSET = 2**62  # SQLite integers are 64-bit signed: a larger offset would be a 500
MAX_IDS = 100


@dataclass(frozen=True)
class Caller:
    """Whose conversations a request may see: its owner (key hash or None) and the collections it may read."""

    owner: str | None
    collections: frozenset[str] | None


def caller(request: Request, access: Access = Depends(guard_questions)) -> Caller:
    return Caller(conversation_owner(request), access.collections)


@contextmanager
def found() -> Iterator[None]:
    """An unknown (or not the caller's) conversation answers 404."""
    try:
        yield
    except ConversationNotFound as exc:
        raise HTTPException(404, str(exc)) from exc


@router.get("", response_model=ConversationPageOut)
def list_conversations(
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    ids: Annotated[
        str | None,
        Query(
            max_length=MAX_IDS * 40,
            description="Comma-separated conversation ids: list those of them you may open (without a key, "
            "your conversations are listed only this way)",
        ),
    ] = None,
    service: ConversationService = Depends(get_conversations),
    who: Caller = Depends(caller),
) -> ConversationPageOut:
    """Your conversations, the most recently continued first (none without a key, unless named in `ids`)."""
    if ids is not None:
        wanted = [i for i in dict.fromkeys(part.strip() for part in ids.split(",")) if i][:MAX_IDS]
        listed = service.of_ids(wanted, who.owner, who.collections)
        page = ConversationPage(total=len(listed), conversations=listed[offset : offset + limit])
    else:
        page = service.page(who.owner, who.collections, offset=offset, limit=limit)
    return ConversationPageOut(
        total=page.total,
        offset=offset,
        limit=limit,
        conversations=[ConversationOut.model_validate(c) for c in page.conversations],
    )


@router.get("/{conversation_id}", response_model=ConversationDetailOut, responses={404: {"model": ErrorOut}})
def get_conversation(
    conversation_id: str, service: ConversationService = Depends(get_conversations), who: Caller = Depends(caller)
) -> ConversationDetailOut:
    """One conversation: its turns in order, each with its answer, sources and timings."""
    with found():
        detail = service.detail(conversation_id, who.owner, who.collections)
    return ConversationDetailOut(
        **ConversationOut.model_validate(detail.conversation).model_dump(),
        turns=[TurnOut.model_validate(v) for v in detail.turns],
    )


@router.delete("/{conversation_id}", status_code=204, response_class=Response, responses={404: {"model": ErrorOut}})
def delete_conversation(
    conversation_id: str, service: ConversationService = Depends(get_conversations), who: Caller = Depends(caller)
) -> Response:
    """Delete a conversation and its turns (its stored turn KV stays until evicted: shared by content)."""
    with found():
        service.delete(conversation_id, who.owner, who.collections)
    return Response(status_code=204)
