"""OpenAI-compatible `POST /v1/chat/completions` and `GET /v1/models`, answered by retrieval + blend.

The whole `messages` array counts, as OpenAI clients expect:

- the last `user` message is the question (unanswered user messages just before it are joined to it);
- earlier `user` / `assistant` pairs are the conversation's history: placed in the prompt as the chat
  template renders them (their KV is stored by content, so a client resending the same history reuses
  it), and retrieval reads their questions and the sources the last one retrieves when asked again, as a
  stored conversation reads its turns' (`retrieval.followup`, app/services/ask/followup.py);
- a `system` or `developer` message replaces the server's system prompt for this request (one more
  prefix, computed once; the chunks' stored KV is blended behind it);
- `tool` / `function` messages are not read.

Stateless: nothing is stored unless the body names a `conversation_id` (the `openai` client's
`extra_body=`): "new" starts a stored conversation, an id continues one (404 if unknown), and the turn is
recorded there; with a conversation id and no earlier messages, the stored turns are the history. The
retrieved passages come back in an extra `sources` field (on the response, or on the first stream chunk),
and blendrag's timings and conversation in an extra `blendrag` field.

Other extensions accepted in the body: `top_k`, `filters`, `mode`, `recompute_ratio`, `selector`. The
served model is listed by /v1/models; any `model` name is accepted (one model is served) and the response
names the served one.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from app.api.answering import Refused, admit, answer_events, client_gone, collect_answer
from app.api.ask import Asker, get_asker
from app.api.deps import get_state, guard_questions
from app.api.errors import openai_error
from app.api.openai_messages import ChatMessage, read_messages
from app.api.schemas import (
    AskParams,
    ConversationId,
    MaxTokens,
    NotBool,
    OpenAIErrorOut,
    RepeatedLineOut,
    ServedModelOut,
    UnsupportedIdentifierOut,
)
from app.api.schemas.common import RETRY_AFTER_HEADER
from app.api.sse import inline_schema, sse_event, sse_response
from app.services.ask import (
    Answer,
    AskRequest,
    DoneEvent,
    ErrorEvent,
    SourcesEvent,
    TokenDelta,
)
from app.services.text_checks import INVALID_UNICODE, is_valid_utf8
from app.state import AppState

# "4XX" also stands in for FastAPI's default 422 entry: validation errors here are OpenAI-style 400s. 429 and 503
# carry Retry-After (the OpenAI client waits that long before its own retries).
router = APIRouter(
    prefix="/v1",
    tags=["openai"],
    dependencies=[Depends(guard_questions)],
    responses={
        "4XX": {"model": OpenAIErrorOut, "description": "OpenAI-style error (400 invalid request, 401, 404 …)"},
        429: {
            "model": OpenAIErrorOut,
            "description": "Too many requests from this API key / IP (`rate_limit_error`)",
            "headers": RETRY_AFTER_HEADER,
        },
        503: {
            "model": OpenAIErrorOut,
            "description": "The engine is busy (`engine_busy`) or the models are still loading",
            "headers": RETRY_AFTER_HEADER,
        },
    },
)

SERVED_MODEL = "blendrag"
_STARTED = int(time.time())


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = Field(default=False, strict=True)


class ChatCompletionIn(AskParams):
    """OpenAI's fields; the shared AskParams add the blendrag extensions (top_k, filters, mode, ratio)."""

    # Unknown OpenAI parameters (presence_penalty, user, …) are accepted and ignored.
    model_config = ConfigDict(extra="allow")

    model: str = SERVED_MODEL
    messages: list[ChatMessage] = Field(
        min_length=1,
        description="At least one `user` message; the last one is the question",
        json_schema_extra={
            "contains": {"type": "object", "required": ["role"], "properties": {"role": {"const": "user"}}}
        },
    )
    stream: bool = Field(default=False, strict=True)
    stream_options: StreamOptions | None = None
    max_completion_tokens: MaxTokens | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, NotBool] = Field(default=1, ge=1, le=1, description="Only one choice is generated")
    conversation_id: ConversationId | None = Field(
        default=None,
        description='Store this turn: "new" starts a conversation, an id continues one (404 if unknown); '
        "without earlier messages, the stored turns are the history. Default: stateless, nothing stored",
    )


class ModelOut(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    blendrag: ServedModelOut | None = Field(
        default=None, description="blendrag extension: the model behind the name (null while it loads)"
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut]


@router.get("/models", response_model=ModelList)
def list_models(state: AppState = Depends(get_state)) -> ModelList:
    """The one model this server answers with (OpenAI format). Its id stays `blendrag` whatever model
    serves (clients send it back); the `blendrag` field says which model that is."""
    served = state.services.engine.served_model if state.services is not None else None
    facts = ServedModelOut.model_validate(dataclasses.asdict(served)) if served is not None else None
    return ModelList(data=[ModelOut(id=SERVED_MODEL, created=_STARTED, owned_by="blendrag", blendrag=facts)])


def _ask_request(body: ChatCompletionIn) -> AskRequest:
    """The question, its history and system prompt from `messages` (400 for what cannot be asked)."""
    chat = read_messages(body.messages)
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if not all(is_valid_utf8(s) for s in stop):
        raise HTTPException(400, f"stop: {INVALID_UNICODE}")
    return dataclasses.replace(
        body.to_request(chat.question, max_tokens=body.max_completion_tokens, stop=stop),
        history=chat.history,
        system_prompt=chat.system_prompt,
    )


def finish_reason(reason: str) -> str:
    """OpenAI's finish_reason for ours: "length" stays, "repetition" (and every other end) is "stop"."""
    return "length" if reason == "length" else "stop"


# DoneEvent fields the OpenAI body carries in its own fields (`choices`, `usage`), or not at all. finish_reason is
# not among them: OpenAI's has no "repetition" (nor "cancelled"), so the extension carries blendrag's own.
_OPENAI_OWN = ("answer", "usage", "citations")
_OPENAI_USAGE = ("prompt_tokens", "completion_tokens")


def _usage(done: DoneEvent) -> dict[str, int]:
    """OpenAI's usage (prompt, completion, total) with blendrag's history counts."""
    usage = dataclasses.asdict(done.usage)
    return {
        **{k: usage[k] for k in _OPENAI_USAGE},
        "total_tokens": done.usage.total_tokens,
        **{k: v for k, v in usage.items() if k.startswith("history_")},
    }


def _extras(done: DoneEvent) -> dict[str, Any]:
    """The `blendrag` extension: every DoneEvent field the OpenAI fields do not carry, the usage counts
    flattened (notice says, e.g., why conversation_id is null: the turn could not be stored)."""
    body = {k: v for k, v in dataclasses.asdict(done).items() if k not in _OPENAI_OWN}
    usage = {k: v for k, v in dataclasses.asdict(done.usage).items() if k not in _OPENAI_USAGE}
    return {**body, **usage}


def _fingerprint(state: AppState) -> str | None:
    return f"fp_{state.services.engine.fingerprint[:12]}" if state.services is not None else None


# The `blendrag` extension: the /ask `done` fields (AskDoneOut) OpenAI's own fields do not carry; the one a
# client acting on the answer most needs is spelled out.
_EXTRAS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "blendrag's own fields of the answer: those of /ask's `done` event that OpenAI's fields do "
    "not carry (mode, timings, notice, conversation_id, unsupported_identifiers …), usage counts flattened",
    "properties": {
        "unsupported_identifiers": {
            "type": "array",
            "description": "Code identifiers the answer names that none of the sources contains (possibly invented)",
            "items": inline_schema(UnsupportedIdentifierOut),
        },
        "notice": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "finish_reason": {
            "type": "string",
            "description": 'blendrag\'s own finish reason: "stop", "length", "repetition" (which OpenAI\'s '
            'finish_reason reports as "stop") or "cancelled"',
        },
        "repeated_line": {
            "anyOf": [inline_schema(RepeatedLineOut), {"type": "null"}],
            "description": 'With finish_reason "repetition": the repeat the stop withheld and where what it repeats '
            "begins in the answer",
        },
    },
}
_CHUNK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "object": {"const": "chat.completion.chunk"},
        "choices": {"type": "array"},
        "sources": {"type": "array"},
        "blendrag": _EXTRAS_SCHEMA,
    },
}
_STREAM_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {
            "anyOf": [
                {"const": "[DONE]"},
                {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"anyOf": [_CHUNK_SCHEMA, inline_schema(OpenAIErrorOut)]},
                },
            ]
        }
    },
}


def _refusal(refused: Refused) -> JSONResponse:
    """The answer driver's refusals, OpenAI-style: 404 (conversation), 400 (invalid), 503 busy."""
    match refused.reason:
        case "conversation_not_found":
            return openai_error(404, refused.message, code="conversation_not_found")
        case "busy":
            return openai_error(503, refused.message, code="engine_busy", headers=refused.headers)
    return openai_error(400, refused.message)


@router.post(
    "/chat/completions",
    response_model=None,
    responses={
        200: {
            "description": "With `stream: true`, `data:` lines of `chat.completion.chunk` objects ending with "
            "`data: [DONE]` (the first chunk carries `sources`; a failure is one `{error}` line instead); "
            "otherwise one `chat.completion` object with `sources`.",
            "content": {
                "text/event-stream": {"schema": _STREAM_EVENT_SCHEMA},
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["id", "object", "choices"],
                        "properties": {"object": {"const": "chat.completion"}, "blendrag": _EXTRAS_SCHEMA},
                    }
                },
            },
        }
    },
)
async def chat_completions(body: ChatCompletionIn, asker: Asker = Depends(get_asker)) -> Any:
    """Chat completion grounded in the library; the whole `messages` history counts (see the module doc).
    Only the collections the caller's key may read are searched (`collections` narrows them)."""
    request, state = asker.request, asker.state
    asked = asker.request_for(_ask_request(body), body.collections, body.conversation_id)
    answer = await admit(asker.service, asked)  # the admission /ask has; only the error shapes are OpenAI's
    if isinstance(answer, Refused):
        return _refusal(answer)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    head = {"id": completion_id, "created": created, "model": SERVED_MODEL, "system_fingerprint": _fingerprint(state)}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(_stream(answer, request, state, head, include_usage))

    collected = await collect_answer(answer, request, state.metrics)
    if collected.error is not None:
        return openai_error(500, collected.error.message, code=collected.error.code)
    done = collected.done
    if done is None:
        return client_gone() if collected.disconnected else openai_error(500, "the answer ended without a result")
    sources = [dataclasses.asdict(s) for s in collected.sources.sources] if collected.sources is not None else []
    return JSONResponse(
        {
            **head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": done.answer, "refusal": None},
                    "logprobs": None,
                    "finish_reason": finish_reason(done.finish_reason),
                }
            ],
            "usage": _usage(done),
            "sources": sources,
            "blendrag": _extras(done),
        }
    )


async def _stream(
    answer: Answer, request: Request, state: AppState, head: dict[str, Any], include_usage: bool
) -> AsyncIterator[str]:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
        body: dict[str, Any] = {
            **head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if include_usage:
            body["usage"] = None  # as OpenAI does: null on every chunk but the last
        body.update(extra)
        return sse_event(None, body)

    async with aclosing(answer_events(answer, request, state.metrics)) as events:
        async for event in events:
            if isinstance(event, SourcesEvent):
                yield chunk(
                    {"role": "assistant", "content": ""}, sources=[dataclasses.asdict(s) for s in event.sources]
                )
            elif isinstance(event, TokenDelta):
                yield chunk({"content": event.text})
            elif isinstance(event, DoneEvent):
                yield chunk({}, finish_reason(event.finish_reason), blendrag=_extras(event))
                if include_usage:
                    yield sse_event(
                        None, {**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage(event)}
                    )
                yield sse_event(None, "[DONE]")
                return
            elif isinstance(event, ErrorEvent):
                # The openai client raises APIError on a data line carrying `error`.
                yield sse_event(
                    None,
                    {"error": {"message": event.message, "type": "server_error", "param": None, "code": event.code}},
                )
                return
