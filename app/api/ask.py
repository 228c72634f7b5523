"""POST /ask: Server-Sent Events (`sources`, `token`…, `done` | `error`) or one JSON body."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse

from app.api.deps import engine_is_full, get_ask, get_state
from app.api.schemas import AskIn, AskOut, ErrorOut, ValidationErrorOut
from app.api.sse import sse_event, sse_openapi, sse_response
from app.metrics import Metrics, RecentAsk
from app.services.ask_service import (
    AskEvent,
    AskRequest,
    AskService,
    AskValidationError,
    DoneEvent,
    ErrorEvent,
    SearchFilters,
    SourcesEvent,
    TokenDelta,
)
from app.state import AppState

router = APIRouter(tags=["ask"])

BUSY_DETAIL = "the engine is busy, retry shortly"


def to_request(body: AskIn) -> AskRequest:
    return AskRequest(
        question=body.question, top_k=body.top_k,
        filters=SearchFilters(document_ids=body.filters.document_ids, tags=body.filters.tags),
        mode=body.mode, recompute_ratio=body.recompute_ratio, selector=body.selector, max_tokens=body.max_tokens,
        temperature=body.temperature, top_p=body.top_p, seed=body.seed,
    )


def done_payload(event: DoneEvent) -> dict[str, Any]:
    body = dataclasses.asdict(event)
    body["usage"]["total_tokens"] = event.usage.total_tokens
    # Flat copies of the headline numbers, for clients that do not want to dig.
    body["ttft_ms"] = event.timings.ttft_ms
    body["total_ms"] = event.timings.total_ms
    return body


def event_payload(event: AskEvent) -> tuple[str, dict[str, Any]]:
    """The SSE event name and JSON data of one service event."""
    match event:
        case SourcesEvent():
            return "sources", {"sources": [dataclasses.asdict(s) for s in event.sources],
                               "retrieval_ms": event.retrieval_ms}
        case TokenDelta():
            return "token", {"text": event.text}
        case DoneEvent():
            return "done", done_payload(event)
        case ErrorEvent():
            return "error", {"message": event.message, "code": event.code}
    raise TypeError(f"unknown event {event!r}")


def record_answer(metrics: Metrics, event: DoneEvent) -> None:
    """Remember an answer for the admin page's recent-TTFT plot."""
    metrics.recent.add(RecentAsk(
        at=time.time(), mode=event.mode, selector=event.selector, ttft_ms=event.timings.ttft_ms,
        total_ms=event.timings.total_ms,
        recompute_ratio=event.recompute_ratio, kv_hits=event.kv_hits, kv_misses=event.kv_misses,
        num_prompt_tokens=event.usage.prompt_tokens, num_completion_tokens=event.usage.completion_tokens,
        full_prefill_estimate_ms=event.timings.full_prefill_estimate_ms,
    ))


def busy_error() -> HTTPException:
    return HTTPException(503, BUSY_DETAIL, headers={"Retry-After": "1"})


def validated(service: AskService, body: AskIn, state: AppState) -> AskRequest:
    """The service request for a body, or the HTTP error it deserves (422 invalid, 503 busy)."""
    request = to_request(body)
    try:
        service.validate(request)
    except AskValidationError as exc:
        raise HTTPException(422, str(exc)) from exc
    if engine_is_full(state):
        raise busy_error()
    return request


_STREAM_DOC = (
    "With `stream: true` (default), Server-Sent Events in this order: one `sources` "
    "`{sources: [{rank, chunk_id, document_id, title, page, score, snippet, text}], retrieval_ms}`, "
    "then `token` `{text}` deltas, then one `done` (the AskOut fields except `sources`) or one "
    "`error` `{message, code: busy|internal|cancelled}`. With `stream: false`, one AskOut JSON body."
)
_ASK_RESPONSES: dict[int | str, dict[str, Any]] = {
    **sse_openapi(_STREAM_DOC, model=AskOut),
    422: {"model": ValidationErrorOut, "description": "Empty question, unknown mode, ratio outside [0, 1] …"},
    503: {"model": ErrorOut, "description": "Engine queue full or models still loading; retry"},
}


@router.post("/ask", responses=_ASK_RESPONSES, response_model=None)
async def ask(body: AskIn, request: Request, service: AskService = Depends(get_ask),
              state: AppState = Depends(get_state)) -> Any:
    """Answer a question from the library: retrieve, blend the chunks' stored KV, generate."""
    ask_request = validated(service, body, state)
    if not body.stream:
        return await _answer_json(service, ask_request, state.metrics)

    async def stream() -> AsyncIterator[str]:
        # aclosing: a client that goes away closes the service generator, which cancels the engine request.
        async with aclosing(service.ask(ask_request)) as events:
            async for event in events:
                if isinstance(event, DoneEvent):
                    record_answer(state.metrics, event)
                name, data = event_payload(event)
                yield sse_event(name, data)
                if await request.is_disconnected():
                    return

    return sse_response(stream())


async def _answer_json(service: AskService, ask_request: AskRequest, metrics: Metrics) -> JSONResponse:
    result: dict[str, Any] = {}
    async with aclosing(service.ask(ask_request)) as events:
        async for event in events:
            if isinstance(event, ErrorEvent):
                if event.code == "busy":
                    raise busy_error()
                raise HTTPException(500, event.message)
            if isinstance(event, DoneEvent):
                record_answer(metrics, event)
            name, data = event_payload(event)
            if name != "token":
                result.update(data)
    return JSONResponse(AskOut.model_validate(result).model_dump())


# Used by the OpenAI-compatible router too.
__all__ = ["busy_error", "done_payload", "event_payload", "record_answer", "router",
           "to_request", "validated"]
