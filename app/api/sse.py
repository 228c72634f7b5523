"""Server-Sent Events framing shared by /ask, /ingest/jobs/{id}/events and /v1/chat/completions, and the
one parser for the other side (tests, bench, any Python client)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, NamedTuple

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


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema with its `$defs` inlined, so it can sit anywhere (e.g. in a `contentSchema`)."""
    schema = model.model_json_schema()
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


# ---- reading -------------------------------------------------------------------------------------


class SSEMessage(NamedTuple):
    event: str | None  # the `event:` name, None for unnamed events (the OpenAI stream)
    data: Any  # the `data:` lines, JSON-decoded when they are JSON (else the string, e.g. "[DONE]")


class SSEParser:
    """Incremental parser (the WHATWG event-stream rules blendrag's streams need): feed it lines without
    their line break; a blank line ends an event. Comments and events without data are skipped."""

    def __init__(self) -> None:
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> list[SSEMessage]:
        """The event this line completes (at most one)."""
        line = line.rstrip("\r")
        if line == "":
            return self.close()
        name, _, value = line.partition(":")
        if name == "event":
            self._event = value.removeprefix(" ")
        elif name == "data":
            self._data.append(value.removeprefix(" "))
        return []  # a comment (":…") or a field blendrag does not send

    def close(self) -> list[SSEMessage]:
        """The event being read, if any (at a blank line, or when the stream ends without one)."""
        event, data = self._event, self._data
        self._event, self._data = None, []
        if not data:
            return []
        raw = "\n".join(data)
        try:
            return [SSEMessage(event, json.loads(raw))]
        except json.JSONDecodeError:
            return [SSEMessage(event, raw)]


def iter_sse(lines: Iterable[str]) -> Iterator[SSEMessage]:
    """Events from lines as they arrive (e.g. httpx's `response.iter_lines()`); stops after each event's
    blank line, so it can be called again on the same line iterator for the next event."""
    parser = SSEParser()
    for line in lines:
        yield from parser.feed(line)
    yield from parser.close()


async def aiter_sse(lines: AsyncIterable[str]) -> AsyncIterator[SSEMessage]:
    """iter_sse for async line streams (httpx's `response.aiter_lines()`)."""
    parser = SSEParser()
    async for line in lines:
        for message in parser.feed(line):
            yield message
    for message in parser.close():
        yield message


def parse_sse(body: str) -> list[SSEMessage]:
    """All events of a complete body."""
    return list(iter_sse(body.splitlines()))
