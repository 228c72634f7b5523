"""Reading Server-Sent Events: the one parser for the client side of blendrag's streams (the CLI's remote
client, tests, bench, any Python client); app/api/sse.py writes them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, NamedTuple, Protocol, TypeVar

_In = TypeVar("_In", contravariant=True)
_Out = TypeVar("_Out", covariant=True)


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


class _Stage(Protocol[_In, _Out]):
    """An incremental reader: `feed` one piece, get what it completes; `close` at the end of the stream."""

    def feed(self, item: _In) -> list[_Out]: ...

    def close(self) -> list[_Out]: ...


def _run(stage: _Stage[_In, _Out], items: Iterable[_In]) -> Iterator[_Out]:
    for item in items:
        yield from stage.feed(item)
    yield from stage.close()


async def _arun(stage: _Stage[_In, _Out], items: AsyncIterable[_In]) -> AsyncIterator[_Out]:
    async for item in items:
        for out in stage.feed(item):
            yield out
    for out in stage.close():
        yield out


def sse_lines(chunks: Iterable[str]) -> Iterator[str]:
    """Event-stream lines from text chunks (e.g. httpx's `response.iter_text()`)."""
    return _run(SSELineSplitter(), chunks)


def asse_lines(chunks: AsyncIterable[str]) -> AsyncIterator[str]:
    """sse_lines for async text streams (httpx's `response.aiter_text()`)."""
    return _arun(SSELineSplitter(), chunks)


def iter_sse(lines: Iterable[str]) -> Iterator[SSEMessage]:
    """Events from lines as they arrive (`sse_lines(response.iter_text())`; not httpx's `iter_lines`,
    which also splits at U+2028); stops after each event's blank line, so it can be called again on the
    same line iterator for the next event."""
    return _run(SSEParser(), lines)


def aiter_sse(lines: AsyncIterable[str]) -> AsyncIterator[SSEMessage]:
    """iter_sse for async line streams (`asse_lines(response.aiter_text())`)."""
    return _arun(SSEParser(), lines)


def parse_sse(body: str) -> list[SSEMessage]:
    """All events of a complete body."""
    return list(iter_sse(sse_lines([body])))
