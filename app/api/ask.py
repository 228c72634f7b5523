"""POST /ask: Server-Sent Events (`sources`, `token`…, `done` | `error`) or one JSON body."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse

from app.api.answering import Refused, admit, answer_events, client_gone, collect_answer
from app.api.deps import (
    Access,
    cap_for_client,
    conversation_owner,
    get_ask,
    get_state,
    guard_questions,
    guarded_router,
    scope_request,
)
from app.api.schemas import (
    AskDefaultsOut,
    AskDoneOut,
    AskIn,
    AskOut,
    ErrorEventOut,
    SourcesEventOut,
    TokenEventOut,
)
from app.api.schemas.common import QUESTION_GUARD_ERRORS, error_responses
from app.api.sse import sse_event, sse_openapi, sse_response
from app.services.ask import (
    Answer,
    AskEvent,
    AskRequest,
    AskService,
    ConversationRef,
    DoneEvent,
    ErrorEvent,
    SourcesEvent,
    TokenDelta,
)
from app.state import AppState

router = guarded_router(
    "ask", guard_questions, {**QUESTION_GUARD_ERRORS, 403: "A named collection the key may not read"}
)


def done_payload(event: DoneEvent) -> dict[str, Any]:
    return AskDoneOut.model_validate(event).model_dump()


def event_payload(event: AskEvent) -> tuple[str, dict[str, Any]]:
    """The SSE event name and JSON data of one service event."""
    match event:
        case SourcesEvent():
            return "sources", SourcesEventOut.model_validate(event).model_dump()
        case TokenDelta():
            return "token", {"text": event.text}
        case DoneEvent():
            return "done", done_payload(event)
        case ErrorEvent():
            return "error", {"message": event.message, "code": event.code}
    raise TypeError(f"unknown event {event!r}")


def question_request(
    ask: AskRequest,
    request: Request,
    access: Access,
    collections: list[str] | None,
    conversation_id: str | None,
) -> AskRequest:
    """The service request for a validated body, made alike for /ask and /v1: searching the caller's
    collections (narrowed to `collections`; 403 for one it may not read), in the conversation it names
    ("new" starts one; opened by the service after its busy check: 404 for an id this caller may not
    open), `max_tokens` capped for an anonymous caller. Nothing here reads the database.

    The routes then admit it through the answer driver (app/api/answering.py) and differ only in how they
    write its refusals and its events.
    """
    scoped = scope_request(ask, access, collections)
    if conversation_id is not None:
        ref = ConversationRef(conversation_id, owner=conversation_owner(request), readable=access.collections)
        scoped = dataclasses.replace(scoped, conversation=ref)
    return cap_for_client(scoped, request)


@dataclass(frozen=True)
class Asker:
    """Who asks and what answers, for /ask and /v1/chat/completions alike: the HTTP request, the caller's
    access, the AskService and the app state (whose metrics hear of every answer)."""

    request: Request
    access: Access
    service: AskService
    state: AppState

    def request_for(self, ask: AskRequest, collections: list[str] | None, conversation_id: str | None) -> AskRequest:
        """`question_request` for this caller."""
        return question_request(ask, self.request, self.access, collections, conversation_id)


def get_asker(
    request: Request,
    service: AskService = Depends(get_ask),
    state: AppState = Depends(get_state),
    access: Access = Depends(guard_questions),
) -> Asker:
    """The question routes' dependency: 503 until the models are loaded, 401/403/429 from the guard."""
    return Asker(request, access, service, state)


_ASK_STATUS = {"conversation_not_found": 404, "invalid": 422, "busy": 503}


async def admitted(service: AskService, ask: AskRequest) -> Answer:
    """`/ask`'s refusals, before any response starts: 404 (conversation), 422 (prompt too long), 503 busy."""
    answer = await admit(service, ask)
    if isinstance(answer, Refused):
        raise HTTPException(_ASK_STATUS[answer.reason], answer.message, headers=answer.headers)
    return answer


_STREAM_DOC = (
    "With `stream: true` (default), Server-Sent Events in this order: one `sources` "
    "`{sources: [{rank, chunk_id, document_id, title, page, score, snippet, text, section}], retrieval_ms, notice}`, "
    "then `token` `{text}` deltas, then one `done` (the AskOut fields except `sources`) or one "
    "`error` `{message, code: busy|internal|cancelled}`. With `stream: false`, one AskOut JSON body."
)
_ASK_RESPONSES: dict[int | str, dict[str, Any]] = {
    **sse_openapi(
        _STREAM_DOC,
        {"sources": SourcesEventOut, "token": TokenEventOut, "done": AskDoneOut, "error": ErrorEventOut},
        model=AskOut,
    ),
    **error_responses(
        {
            400: "The body is not JSON (or not UTF-8)",
            404: "No such conversation (unknown, deleted or another API key's)",
            422: "Empty question, unknown mode, ratio outside [0, 1], prompt longer than the model's context …",
            503: "Engine queue full or models still loading; retry",
        }
    ),
}


@router.get("/api/defaults", response_model=AskDefaultsOut)
def ask_defaults(state: AppState = Depends(get_state)) -> AskDefaultsOut:
    """The server's defaults for the /ask fields a request leaves out (open, like /ask); the blend's are those
    in force (calibrated, shipped or safe, see /api/stats), once the model is loaded."""
    served = state.services.engine if state.services is not None else None
    engine = served.settings if served is not None else state.settings.engine
    return AskDefaultsOut(
        top_k=state.settings.retrieval.top_k,
        mode=engine.mode,
        recompute_ratio=engine.blend.recompute_ratio,
        selector=engine.blend.selector,
        max_tokens=engine.max_new_tokens,
    )


@router.post("/ask", responses=_ASK_RESPONSES, response_model=None)
async def ask(body: AskIn, asker: Asker = Depends(get_asker)) -> Any:
    """Answer a question from the library: retrieve, blend the chunks' stored KV, generate. With a
    `conversation_id`, the conversation's earlier turns are in the prompt and the retrieval query, and the
    turn is stored in it (`"new"` starts one); without one, nothing is stored. Only
    the collections the caller's key may read are searched (`collections` narrows them)."""
    request, metrics = asker.request, asker.state.metrics
    asked = asker.request_for(body.to_request(body.question), body.collections, body.conversation_id)
    answer = await admitted(asker.service, asked)
    if not body.stream:
        collected = await collect_answer(answer, request, metrics)
        if collected.error is not None:
            raise HTTPException(500, collected.error.message)
        if collected.disconnected:
            return client_gone()
        if collected.sources is None or collected.done is None:
            raise HTTPException(500, "the answer ended without a result")
        body_out = {**event_payload(collected.sources)[1], **done_payload(collected.done)}
        return JSONResponse(AskOut.model_validate(body_out).model_dump())

    async def stream() -> AsyncIterator[str]:
        async with aclosing(answer_events(answer, request, metrics)) as events:
            async for event in events:
                yield sse_event(*event_payload(event))

    return sse_response(stream())


# Used by the OpenAI-compatible router too.
__all__ = ["Asker", "admitted", "done_payload", "event_payload", "get_asker", "question_request", "router"]
