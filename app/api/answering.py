"""The answer driver of the question routes: `/ask` and `/v1/chat/completions` admit, stream and collect an
answer through here, and differ only in how they write what it yields (their wire formats).

    refused = await admit(service, request)        # an Answer, or why it was refused before any byte is sent
    async with aclosing(answer_events(answer, http_request, metrics)) as events: ...   # streaming
    collected = await collect_answer(answer, http_request, metrics)                   # one JSON body

Both paths stop the engine's work when the client goes away (app/api/disconnect.py) and hand every finished
answer to the admin page's recent-answers list.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Literal

from fastapi import Request
from fastapi.responses import JSONResponse

from app.api.disconnect import ConnectionWatch, while_connected
from app.api.errors import retry_after
from app.metrics import Metrics, RecentAsk
from app.services.ask import (
    Answer,
    AskBusy,
    AskEvent,
    AskRequest,
    AskService,
    AskValidationError,
    DoneEvent,
    ErrorEvent,
    SourcesEvent,
)
from app.services.ask.service import BUSY
from app.services.conversation_service import ConversationNotFound


@dataclass(frozen=True)
class Refused:
    """Why a question was refused before its answer started; each route writes it in its own format."""

    reason: Literal["conversation_not_found", "invalid", "busy"]
    message: str
    retry_after_s: float | None = None  # busy: the engine's estimate of when a retry may be admitted

    @property
    def headers(self) -> dict[str, str] | None:
        """A busy refusal's Retry-After (HTTP 503); None for the others."""
        return retry_after(self.retry_after_s) if self.retry_after_s is not None else None


async def admit(service: AskService, request: AskRequest) -> Answer | Refused:
    """`AskService.admit` (the busy check, the plan, the engine's binding admission), its refusals as values:
    an unknown conversation, a question or prompt too long, a full engine (the message is the service's BUSY)."""
    try:
        return await service.admit(request)
    except ConversationNotFound as exc:
        return Refused("conversation_not_found", str(exc))
    except AskValidationError as exc:
        return Refused("invalid", str(exc))
    except AskBusy as exc:
        return Refused("busy", BUSY, exc.retry_after_s)


def record_answer(metrics: Metrics, event: DoneEvent) -> None:
    """Remember an answer for the admin page's recent-TTFT plot."""
    metrics.recent.add(
        RecentAsk(
            at=time.time(),
            mode=event.mode,
            selector=event.selector,
            ttft_ms=event.timings.ttft_ms,
            total_ms=event.timings.total_ms,
            recompute_ratio=event.recompute_ratio,
            kv_hits=event.kv_hits,
            kv_misses=event.kv_misses,
            num_prompt_tokens=event.usage.prompt_tokens,
            num_completion_tokens=event.usage.completion_tokens,
            full_prefill_estimate_ms=event.timings.full_prefill_estimate_ms,
            num_context_tokens=event.usage.context_tokens,
        )
    )


async def answer_events(answer: Answer, request: Request, metrics: Metrics) -> AsyncIterator[AskEvent]:
    """The answer's events while the client of `request` is connected (a client that goes away closes the
    service generator, which cancels the engine request); a finished answer is recorded. Iterate it inside
    `aclosing`, so leaving the stream closes the answer at once."""
    async with aclosing(answer.events()) as events:
        async for event in while_connected(request, events):
            if isinstance(event, DoneEvent):
                record_answer(metrics, event)
            yield event


@dataclass(frozen=True)
class Collected:
    """A whole answer for a non-streaming body: its sources, then its end (`done`, or `error`), or neither
    when the client left first (`disconnected`) or the answer ended without a result."""

    sources: SourcesEvent | None
    done: DoneEvent | None
    error: ErrorEvent | None
    disconnected: bool


async def collect_answer(answer: Answer, request: Request, metrics: Metrics) -> Collected:
    """Run the answer to its end (or its error) while the client waits; a finished answer is recorded."""
    sources = done = error = None
    watch = ConnectionWatch(request)
    async with aclosing(answer.events()) as events:
        async for event in watch.iterate(events):
            if isinstance(event, SourcesEvent):
                sources = event
            elif isinstance(event, ErrorEvent):
                error = event
                break
            elif isinstance(event, DoneEvent):
                record_answer(metrics, event)
                done = event
                break
    return Collected(sources, done, error, watch.disconnected)


def client_gone() -> JSONResponse:
    """What a route returns for a client that left: nobody reads it (499, as nginx logs it)."""
    return JSONResponse({"detail": "client closed the request"}, status_code=499)
