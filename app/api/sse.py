"""Server-Sent Events framing shared by /ask, /ingest/jobs/{id}/events and /v1/chat/completions, and the
one parser for the other side (tests, bench, any Python client)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, NamedTuple

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


class SSELineSplitter:
    """Lines of an event stream from text chunks as they arrive. The event-stream format ends lines at
    CRLF, LF or CR only: U+2028, U+0085, form feeds … are part of a line (httpx's `iter_lines` and
    `str.splitlines` split there too, which cut a `data:` line quoting such a passage in two)."""

    def __init__(self) -> None:
        self._buffer = ""

    def feed(self, text: str) -> list[str]:
        data = self._buffer + text
        lines: list[str] = []
        start = 0
        i = 0
        while i < len(data):
            ch = data[i]
            if ch == "\n" or ch == "\r":
                if ch == "\r" and i + 1 == len(data):
                    break  # maybe the CR of a CRLF split across chunks: decide with the next one
                lines.append(data[start:i])
                i += 2 if ch == "\r" and data[i + 1] == "\n" else 1
                start = i
                continue
            i += 1
        self._buffer = data[start:]
        return lines

    def close(self) -> list[str]:
        rest, self._buffer = self._buffer, ""
        rest = rest.removesuffix("\r")
        return [rest] if rest else []


def sse_lines(chunks: Iterable[str]) -> Iterator[str]:
    """Event-stream lines from text chunks (e.g. httpx's `response.iter_text()`)."""
    splitter = SSELineSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.close()


async def asse_lines(chunks: AsyncIterable[str]) -> AsyncIterator[str]:
    """sse_lines for async text streams (httpx's `response.aiter_text()`)."""
    splitter = SSELineSplitter()
    async for chunk in chunks:
        for line in splitter.feed(chunk):
            yield line
    for line in splitter.close():
        yield line


def iter_sse(lines: Iterable[str]) -> Iterator[SSEMessage]:
    """Events from lines as they arrive (`sse_lines(response.iter_text())`; not httpx's `iter_lines`,
    which also splits at U+2028); stops after each event's blank line, so it can be called again on the
    same line iterator for the next event."""
    parser = SSEParser()
    for line in lines:
        yield from parser.feed(line)
    yield from parser.close()


async def aiter_sse(lines: AsyncIterable[str]) -> AsyncIterator[SSEMessage]:
    """iter_sse for async line streams (`asse_lines(response.aiter_text())`)."""
    parser = SSEParser()
    async for line in lines:
        for message in parser.feed(line):
            yield message
    for message in parser.close():
        yield message


def parse_sse(body: str) -> list[SSEMessage]:
    """All events of a complete body."""
    return list(iter_sse(sse_lines([body])))
