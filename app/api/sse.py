"""Server-Sent Events framing shared by /ask, /ingest/jobs/{id}/events and /v1/chat/completions (the
other side reads them with app/sse_reader.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering of the stream


# Characters that JSON may carry raw but that common line readers (Python's str.splitlines, httpx's
# iter_lines) treat as line breaks: escaped on the way out so every client sees one `data:` line.
_LINE_SAFE = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def line_safe_json(data: Any) -> str:
    """JSON text with no character any line splitter breaks at (non-ASCII text otherwise kept raw)."""
    # Those characters can only occur inside JSON strings, where the escape means the same character.
    return json.dumps(data, ensure_ascii=False).translate(_LINE_SAFE)


def sse_event(name: str | None, data: Any) -> str:
    """One event. `data` is JSON-encoded unless it is already a string (OpenAI's `[DONE]`)."""
    payload = data if isinstance(data, str) else line_safe_json(data)
    head = f"event: {name}\n" if name else ""
    # A JSON dump has no raw newlines, so one `data:` line always suffices.
    return f"{head}data: {payload}\n\n"


def sse_comment(text: str) -> str:
    """A comment line: ignored by clients, keeps idle connections (and proxies) alive."""
    return f": {text}\n\n"


def sse_response(stream: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema with its `$defs` inlined, so it can sit anywhere (e.g. in a `contentSchema`).
    The serialization schema: an event's data is what the server writes (an Out model read from a record
    with a `validation_alias` still writes its field's own name)."""
    schema = model.model_json_schema(mode="serialization")
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


def sse_event_schema(events: dict[str | None, type[BaseModel] | dict[str, Any]]) -> dict[str, Any]:
    """The schema of one Server-Sent Event (OpenAPI 3.1: a text/event-stream `schema` describes each event):
    `{event, data}` where `data` is a JSON text whose own schema is the model's (`contentSchema`)."""
    variants = []
    for name, data in events.items():
        content = data if isinstance(data, dict) else inline_schema(data)
        data_schema = {"type": "string", "contentMediaType": "application/json", "contentSchema": content}
        variant: dict[str, Any] = {"type": "object", "required": ["data"], "properties": {"data": data_schema}}
        if name is not None:
            variant["required"] = ["event", "data"]
            variant["properties"]["event"] = {"const": name}
        variants.append(variant)
    return variants[0] if len(variants) == 1 else {"oneOf": variants}


def sse_openapi(
    description: str, events: dict[str | None, type[BaseModel] | dict[str, Any]], model: type[BaseModel] | None = None
) -> dict[int | str, dict[str, Any]]:
    """`responses=` entry documenting a text/event-stream body (each event's schema) and, with `model`, the
    JSON body the same route answers without streaming."""
    entry: dict[str, Any] = {
        "description": description,
        "content": {"text/event-stream": {"schema": sse_event_schema(events)}},
    }
    if model is not None:
        entry["model"] = model
    return {200: entry}
