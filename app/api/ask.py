"""POST /ask: Server-Sent Events (`sources`, `token`…, `done` | `error`) or one JSON body."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from app.api.deps import get_ask
from app.api.schemas import AskIn
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

router = APIRouter(tags=["ask"])


def to_request(body: AskIn) -> AskRequest:
    return AskRequest(
        question=body.question, top_k=body.top_k,
        filters=SearchFilters(document_ids=body.filters.document_ids, tags=body.filters.tags),
        mode=body.mode,  # type: ignore[arg-type]  # validated by the service
        recompute_ratio=body.recompute_ratio, max_tokens=body.max_tokens, temperature=body.temperature,
        top_p=body.top_p, seed=body.seed,
    )


def event_payload(event: AskEvent) -> tuple[str, dict[str, Any]]:
    match event:
        case SourcesEvent():
            return "sources", {"sources": [dataclasses.asdict(s) for s in event.sources],
                               "retrieval_ms": event.retrieval_ms}
        case TokenDelta():
            return "token", {"text": event.text}
        case DoneEvent():
            body = dataclasses.asdict(event)
            body["usage"]["total_tokens"] = event.usage.total_tokens
            body["ttft_ms"] = event.timings.ttft_ms
            body["total_ms"] = event.timings.total_ms
            return "done", body
        case ErrorEvent():
            return "error", {"message": event.message, "code": event.code}
    raise TypeError(f"unknown event {event!r}")


def sse(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


@router.post("/ask")
async def ask(body: AskIn, request: Request, service: AskService = Depends(get_ask)) -> Any:
    ask_request = to_request(body)
    try:
        service.validate(ask_request)
    except AskValidationError as exc:
        raise HTTPException(422, str(exc)) from exc

    if not body.stream:
        result: dict[str, Any] = {}
        async for event in service.ask(ask_request):
            name, data = event_payload(event)
            if name == "error":
                status = 503 if data["code"] == "busy" else 500
                return JSONResponse({"detail": data["message"]}, status_code=status)
            if name == "sources":
                result.update(data)
            elif name == "done":
                result.update(data)
        return JSONResponse(result)

    async def stream() -> AsyncIterator[str]:
        async for event in service.ask(ask_request):
            name, data = event_payload(event)
            yield sse(name, data)
            if await request.is_disconnected():
                # Leaving the loop closes the service's generator, which cancels the engine request.
                return

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
