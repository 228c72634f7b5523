"""GET /conversations, GET and DELETE /conversations/{id}: the caller's stored conversations.

A conversation belongs to the API key that created it and to the collections its turns searched;
another owner's conversation, one over a collection the caller may not (or no longer) read, an unknown
id and a deleted one are all 404. A conversation started without a key is listed to nobody: its id
reaches it (`?ids=` lists those of the given ids the caller may open, how the chat page shows the ones
it started). The same key rule as /ask applies (`server.protect_ask`), and the same rate limit.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response

from app.api.deps import Access, conversation_owner, get_conversations, guard_questions
from app.api.schemas import (
    ConversationDetailOut,
    ConversationOut,
    ConversationPageOut,
    ErrorOut,
    TurnOut,
    TurnSourceOut,
    ValidationErrorOut,
)
from app.catalog.conversations import ConversationPage, ConversationRecord
from app.services.conversation_service import ConversationNotFound, ConversationService

router = APIRouter(
    prefix="/conversations",
    tags=["conversations"],
    dependencies=[Depends(guard_questions)],
    responses={
        401: {"model": ErrorOut, "description": "API key required (with `server.protect_ask`)"},
        422: {"model": ValidationErrorOut, "description": "Invalid offset or limit"},
        429: {"model": ErrorOut, "description": "Too many requests from this API key / IP; see Retry-After"},
        503: {"model": ErrorOut, "description": "Models still loading"},
    },
)

MAX_OFFSET = 2**62  # SQLite integers are 64-bit signed: a larger offset would be a 500
MAX_IDS = 100


def conversation_out(record: ConversationRecord) -> ConversationOut:
    return ConversationOut(
        id=record.id,
        title=record.title,
        num_turns=record.num_turns,
        created_at=record.created_at.isoformat(),
        updated_at=record.updated_at.isoformat(),
    )


def not_found(exc: ConversationNotFound) -> HTTPException:
    return HTTPException(404, str(exc))


@router.get("", response_model=ConversationPageOut)
def list_conversations(
    request: Request,
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
    access: Access = Depends(guard_questions),
) -> ConversationPageOut:
    """Your conversations, the most recently continued first (none without a key, unless named in `ids`)."""
    owner = conversation_owner(request)
    if ids is not None:
        wanted = [i for i in dict.fromkeys(part.strip() for part in ids.split(",")) if i][:MAX_IDS]
        found = service.of_ids(wanted, owner, access.collections)
        page = ConversationPage(total=len(found), conversations=found[offset : offset + limit])
    else:
        page = service.page(owner, access.collections, offset=offset, limit=limit)
    return ConversationPageOut(
        total=page.total,
        offset=offset,
        limit=limit,
        conversations=[conversation_out(c) for c in page.conversations],
    )


@router.get("/{conversation_id}", response_model=ConversationDetailOut, responses={404: {"model": ErrorOut}})
def get_conversation(
    conversation_id: str,
    request: Request,
    service: ConversationService = Depends(get_conversations),
    access: Access = Depends(guard_questions),
) -> ConversationDetailOut:
    """One conversation: its turns in order, each with its answer, sources and timings."""
    try:
        detail = service.detail(conversation_id, conversation_owner(request), access.collections)
    except ConversationNotFound as exc:
        raise not_found(exc) from exc
    head = conversation_out(detail.conversation)
    return ConversationDetailOut(
        **head.model_dump(),
        turns=[
            TurnOut(
                index=v.turn.index,
                question=v.turn.question,
                answer=v.turn.answer,
                sources=[
                    TurnSourceOut(
                        rank=s.rank, chunk_id=s.chunk_id, document_id=s.document_id, title=s.title, page=s.page
                    )
                    for s in v.sources
                ],
                mode=v.turn.mode,
                selector=v.turn.selector,
                recompute_ratio=v.turn.recompute_ratio,
                timings=v.turn.timings,
                usage=v.turn.usage,
                created_at=v.turn.created_at.isoformat(),
            )
            for v in detail.turns
        ],
    )


@router.delete("/{conversation_id}", status_code=204, response_class=Response, responses={404: {"model": ErrorOut}})
def delete_conversation(
    conversation_id: str,
    request: Request,
    service: ConversationService = Depends(get_conversations),
    access: Access = Depends(guard_questions),
) -> Response:
    """Delete a conversation and its turns (its stored turn KV stays until evicted: shared by content)."""
    try:
        service.delete(conversation_id, conversation_owner(request), access.collections)
    except ConversationNotFound as exc:
        raise not_found(exc) from exc
    return Response(status_code=204)
