"""The SSE writer and the one SSE parser (used by tests and bench) agree."""

from __future__ import annotations

from app.api.sse import sse_comment, sse_event
from app.sse_reader import SSEMessage, aiter_sse, asse_lines, iter_sse, parse_sse, sse_lines


def test_parse_reads_what_the_server_writes() -> None:
    body = (
        sse_comment("keep-alive")
        + sse_event("sources", {"sources": [], "retrieval_ms": 1.5})
        + sse_event("token", {"text": "naïve 東京\n"})
        + sse_event(None, "[DONE]")
    )
    assert parse_sse(body) == [
        SSEMessage("sources", {"sources": [], "retrieval_ms": 1.5}),
        SSEMessage("token", {"text": "naïve 東京\n"}),
        SSEMessage(None, "[DONE]"),
    ]


def test_parse_follows_the_event_stream_rules() -> None:
    body = 'event: a\r\ndata: 1\r\ndata: 2\r\n\r\n: comment\n\nevent: empty\n\ndata:{"x": 1}\n\ndata: tail'
    # two data lines join with a newline; no space after the colon is fine; an event without data and
    # a comment dispatch nothing; an unterminated last event still counts
    assert parse_sse(body) == [SSEMessage("a", "1\n2"), SSEMessage(None, {"x": 1}), SSEMessage(None, "tail")]
    assert [(m.event, m.data) for m in parse_sse(sse_event("done", {"ok": True}))] == [("done", {"ok": True})]


def test_iter_sse_reads_one_event_at_a_time_from_a_line_stream() -> None:
    lines = iter((sse_event("sources", {}) + sse_event("token", {"text": "a"}) + sse_event("done", {})).split("\n"))
    assert next(iter_sse(lines)) == SSEMessage("sources", {})
    assert next(lines) == "event: token"  # nothing of the next event was consumed
    assert list(iter_sse(lines)) == [SSEMessage(None, {"text": "a"}), SSEMessage("done", {})]


async def test_aiter_sse_over_async_lines() -> None:
    async def lines():
        for line in (sse_event("token", {"text": "x"}) + sse_event("done", {"answer": "x"})).split("\n"):
            yield line

    assert [m async for m in aiter_sse(lines())] == [
        SSEMessage("token", {"text": "x"}),
        SSEMessage("done", {"answer": "x"}),
    ]


HOSTILE = "Q3\u2028report\u2029and\x85more\x0bform\x0cfeed\x1csep"


def test_events_quoting_line_separators_stay_one_line_for_any_reader() -> None:
    import httpx

    body = sse_event("token", {"text": HOSTILE}) + sse_event("done", {"answer": HOSTILE})
    # Escaped on the wire, so even a reader splitting like str.splitlines (httpx iter_lines) sees one line.
    assert "\u2028" not in body and "\x85" not in body
    assert httpx.Response(200, text=body).iter_lines().__next__() == "event: token"
    assert [m.data for m in parse_sse(body)] == [{"text": HOSTILE}, {"answer": HOSTILE}]


def test_line_splitter_breaks_at_cr_lf_only_across_chunks() -> None:
    raw = 'data: {"text": "a\u2028b"}\r'  # a CR at a chunk's end may be half of a CRLF
    chunks = [raw, '\n\ndata: x\rdata: y\n\ndata: {"t": "\x85"', "}\n\n"]
    assert list(sse_lines(chunks)) == [
        'data: {"text": "a\u2028b"}',
        "",
        "data: x",
        "data: y",
        "",
        'data: {"t": "\x85"}',
        "",
    ]
    # raw separators from another server (not escaped) are read whole too
    assert list(iter_sse(sse_lines(chunks))) == [
        SSEMessage(None, {"text": "a\u2028b"}),
        SSEMessage(None, "x\ny"),
        SSEMessage(None, {"t": "\x85"}),
    ]


async def test_async_line_splitter() -> None:
    async def chunks():
        for part in ('data: {"t": "\u2029', '"}\n', "\n"):
            yield part

    assert [m async for m in aiter_sse(asse_lines(chunks()))] == [SSEMessage(None, {"t": "\u2029"})]
