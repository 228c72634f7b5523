"""Server-Sent Events framing shared by /ask, /ingest/jobs/{id}/events and /v1/chat/completions."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering of the stream


def sse_event(name: str | None, data: Any) -> str:
    """One event. `data` is JSON-encoded unless it is already a string (OpenAI's `[DONE]`)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {name}\n" if name else ""
    # A JSON dump has no raw newlines, so one `data:` line always suffices.
    return f"{head}data: {payload}\n\n"


def sse_comment(text: str) -> str:
    """A comment line: ignored by clients, keeps idle connections (and proxies) alive."""
    return f": {text}\n\n"


def sse_response(stream: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)


def sse_openapi(description: str, model: type[BaseModel] | None = None) -> dict[int | str, dict[str, Any]]:
    """`responses=` entry documenting a text/event-stream body (and, with `model`, a JSON one) in OpenAPI."""
    entry: dict[str, Any] = {"description": description,
                             "content": {"text/event-stream": {"schema": {"type": "string"}}}}
    if model is not None:
        entry["model"] = model
    return {200: entry}
