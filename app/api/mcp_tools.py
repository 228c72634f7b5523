"""The MCP tools (`search`, `ask`, `list_collections`, `get_document`): what an agent may call at /mcp.

Each tool is a route in all but transport: it takes the HTTP request its call came in (the caller's key in
`Authorization: Bearer` or `X-API-Key`), asks the same dependencies as the HTTP routes who is calling
(`guard_questions` for `search` and `ask`, as /ask; `require_reader` for `list_collections` and `get_document`,
as /collections and /documents: app/api/deps.py), validates its arguments (the question's through `AskIn`, as
/ask and the CLI do), calls the services and answers with the HTTP route's own Out model, as JSON text and as
structured content. Anything refused (a bad argument, a missing or wrong key, a collection the key may not
read, a busy engine, an unknown document) is a tool error with a message (`isError`), never a protocol error
or a 500.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from http import HTTPStatus
from typing import Annotated, Any

import mcp.types as types
from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.api.answering import Refused, admit, record_answer
from app.api.ask import done_payload, event_payload
from app.api.collections import get_collections
from app.api.deps import (
    cap_for_client,
    get_ask,
    get_documents,
    get_state,
    guard_questions,
    require_reader,
    scope_request,
)
from app.api.errors import validation_message
from app.api.schemas import AskOut, CollectionListOut, CollectionOut, SourcesEventOut
from app.api.schemas.documents import ChunkOut, DocumentDetail, DocumentOut, KVCounts
from app.ask_params import AskIn, CollectionName, MaxTokens, TopK
from app.services.ask import AskPlan, AskValidationError, DoneEvent, ErrorEvent, SourcesEvent
from app.services.ask.service import BUSY
from app.services.ask.types import MAX_QUESTION_CHARS, NO_MATCH, NOT_COVERED, NOTHING_INGESTED
from app.services.text_checks import NOT_BLANK
from engine.types import Mode

logger = logging.getLogger(__name__)

_QUESTION = Field(
    max_length=MAX_QUESTION_CHARS,
    json_schema_extra={"minLength": 1, "pattern": NOT_BLANK},
    description="The question, in natural language",
)
_COLLECTION = "Only this collection (one the caller's key may read); default: every collection it may read"


class SearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: Annotated[str, _QUESTION]
    collection: CollectionName | None = Field(default=None, description=_COLLECTION)
    top_k: TopK | None = Field(default=None, description="Passages to return (default: the server's top_k)")


class AskArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: Annotated[str, _QUESTION]
    collection: CollectionName | None = Field(default=None, description=_COLLECTION)
    mode: Mode | None = Field(
        default=None,
        description="blend (stored KV, a share recomputed), full (no reuse), prefix, reuse; default: the server's",
    )
    max_tokens: MaxTokens | None = Field(default=None, description="At most this many tokens of answer")


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DocumentArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    document_id: str = Field(
        min_length=1, max_length=128, description="The document's id (a passage's `document_id` from search)"
    )


def _question(question: str, collection: str | None, **params: Any) -> AskIn:
    """The question as /ask validates it (`AskIn`: not blank, its limits)."""
    return AskIn(question=question, collections=[collection] if collection is not None else None, **params)


class ToolRefused(Exception):
    """A call answered with a tool error: its message is what the agent reads."""


def _sources_event(plan: AskPlan, num_indexed: int) -> SourcesEvent:
    """The `sources` event /ask sends for this plan (AskService's own rule: why there are none, if none)."""
    if not plan.covered:
        notice: str | None = NOT_COVERED
    else:
        notice = None if plan.sources else (NOTHING_INGESTED if num_indexed == 0 else NO_MATCH)
    return SourcesEvent(sources=plan.sources, retrieval_ms=round(plan.retrieval_ms, 2), notice=notice)


async def search(request: Request, args: SearchArgs) -> SourcesEventOut:
    """/ask's retrieval without the answer: the passages /ask would give the model, best first."""
    access = guard_questions(request)
    service = get_ask(request)
    body = _question(args.question, args.collection, top_k=args.top_k)
    asked = scope_request(body.to_request(body.question), access, body.collections)
    try:
        plan = await service.plan(asked)
    except AskValidationError as exc:
        raise ToolRefused(str(exc)) from exc
    services = get_state(request).services
    num_indexed = services.retriever.count if services is not None and services.retriever is not None else 0
    return SourcesEventOut.model_validate(_sources_event(plan, num_indexed))


async def ask(request: Request, args: AskArgs) -> AskOut:
    """/ask with `stream: false`: the answer, its citations and sources, the notice and the timings."""
    access = guard_questions(request)
    service = get_ask(request)
    body = _question(args.question, args.collection, mode=args.mode, max_tokens=args.max_tokens)
    asked = cap_for_client(scope_request(body.to_request(body.question), access, body.collections), request)
    answer = await admit(service, asked)
    if isinstance(answer, Refused):
        raise ToolRefused(busy_message(answer) if answer.reason == "busy" else answer.message)
    sources: SourcesEvent | None = None
    done: DoneEvent | None = None
    # The call's cancellation (the client gone, or its `notifications/cancelled`) closes the events, which
    # cancels the engine request, as a disconnect does on /ask.
    async with aclosing(answer.events()) as events:
        async for event in events:
            if isinstance(event, SourcesEvent):
                sources = event
            elif isinstance(event, ErrorEvent):
                raise ToolRefused(BUSY if event.code == "busy" else event.message)
            elif isinstance(event, DoneEvent):
                record_answer(get_state(request).metrics, event)
                done = event
                break
    if sources is None or done is None:
        raise ToolRefused("the answer ended without a result")
    return AskOut.model_validate({**event_payload(sources)[1], **done_payload(done)})


async def list_collections(request: Request, args: NoArgs) -> CollectionListOut:
    """GET /collections: the caller's collections with their documents, chunks and KV coverage."""
    access = require_reader(request)
    service = get_collections(get_state(request))
    return CollectionListOut(collections=[CollectionOut.model_validate(c) for c in service.list(access.collections)])


async def get_document(request: Request, args: DocumentArgs) -> DocumentDetail:
    """GET /documents/{id}: one document of the caller's collections, with its chunks' text."""
    access = require_reader(request)
    view = get_documents(request).get(args.document_id, access.collections)
    if view is None:
        raise ToolRefused(f"no document {args.document_id!r} in the collections this key may read")
    return DocumentDetail(
        **DocumentOut.model_validate(view.document).model_dump(),
        kv=KVCounts(**view.kv_counts()),
        chunks=[ChunkOut.model_validate(c) for c in view.chunks],
    )


@dataclass(frozen=True)
class ToolSpec:
    """One tool: what `tools/list` says of it and what answers its calls."""

    name: str
    description: str
    args: type[BaseModel]
    out: type[BaseModel]
    run: Callable[[Request, Any], Awaitable[BaseModel]]

    def tool(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=self.args.model_json_schema(),
            output_schema=self.out.model_json_schema(mode="serialization"),
            annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
        )


TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            "search",
            "Search the library: the passages that best match a question, best first, each with its document "
            "(`document_id`, `title`), `section`, `page`, `score`, `chunk_id` and `text`; `notice` says why there "
            "are none (nothing ingested, no match, or the documents do not cover the question). The same "
            "retrieval as the answers' sources, in the collections the caller's key may read.",
            SearchArgs,
            SourcesEventOut,
            search,
        ),
        ToolSpec(
            "ask",
            "Answer a question from the library's documents: the `answer`, its `citations` (sentence spans and "
            "the rank of the source each comes from), the `sources` it was given, `notice` when the documents do "
            "not cover the question (the answer then comes from the model alone) and `timings`.",
            AskArgs,
            AskOut,
            ask,
        ),
        ToolSpec(
            "list_collections",
            "The collections the caller's key may read, with their documents, chunks and KV cache coverage.",
            NoArgs,
            CollectionListOut,
            list_collections,
        ),
        ToolSpec(
            "get_document",
            "One document by id (a search passage's `document_id`): its title, collection, status, and its "
            "chunks in order with their text.",
            DocumentArgs,
            DocumentDetail,
            get_document,
        ),
    )
}


def tool_error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def refusal_message(exc: HTTPException) -> str:
    """An HTTP refusal of the dependencies (401, 403, 429, 503) as a tool error's text."""
    return _with_retry_after(f"{exc.detail} ({exc.status_code} {HTTPStatus(exc.status_code).phrase})", exc.headers)


def busy_message(refused: Refused) -> str:
    """A busy engine's refusal as a tool error's text, with the Retry-After a 503 of /ask carries."""
    return _with_retry_after(refused.message, refused.headers)


def _with_retry_after(text: str, headers: dict[str, str] | None) -> str:
    """A tool error travels in a 200, so a 429's or 503's Retry-After goes into its text."""
    wait = (headers or {}).get("Retry-After")
    return f"{text}; retry after {wait} s" if wait is not None else text


async def call_tool(request: Request, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
    """Run one tool call for the caller of `request`; every refusal is a tool error with its reason."""
    spec = TOOLS.get(name)
    if spec is None:
        return tool_error(f"unknown tool {name!r}; the tools are: {', '.join(TOOLS)}")
    try:
        args = spec.args.model_validate(arguments or {})
        out = await spec.run(request, args)
    except ValidationError as exc:
        return tool_error(f"invalid arguments: {validation_message(exc)}")
    except HTTPException as exc:
        return tool_error(refusal_message(exc))
    except ToolRefused as exc:
        return tool_error(str(exc))
    except Exception:
        # A bug, not the caller's fault: logged with its traceback; the agent reads a tool error, never a 500.
        logger.exception("MCP tool %s failed", name)
        return tool_error(f"internal error in tool {name!r}; the server log has the details")
    data = out.model_dump(mode="json")
    text = json.dumps(data, ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=data)
