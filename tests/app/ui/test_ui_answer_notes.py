"""What the chat page shows with an answer, in headless chromium, on canned answer streams (the tiny test
model writes random tokens): the `done` notice above the answer (issue 62, item 8), and a source passage that
starts inside a code block rendered with its code as code (item 7b)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from apitools import LiveServer

pytestmark = pytest.mark.browser

TIMEOUT_MS = 60_000
INVENTED = (
    "2 of the 2 code names in this answer are in none of its sources: "
    "it is likely invented, not drawn from your documents"
)
NOT_COVERED = "the documents do not cover this question"
SOURCE = {
    "rank": 1,
    "title": "Zorblat guide",
    "section": None,
    "page": None,
    "score": 0.41,
    "chunk_id": 7,
    "document_id": "d1",
    "snippet": "Quintaro is the capital.",
    "text": "Quintaro is the capital.",
}


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def _stream(done: dict[str, Any], answer: str, sources: list[dict[str, Any]], notices: tuple[str | None, ...]) -> str:
    """The events of one answer: `notices` are the sources event's and the done event's."""
    sources_notice, done_notice = notices
    return (
        _sse("sources", {"sources": sources, "retrieval_ms": 1.0, "notice": sources_notice})
        + _sse("token", {"text": answer})
        + _sse(
            "done",
            done
            | {"answer": answer, "finish_reason": "stop", "citations": [], "unsupported_identifiers": []}
            | {"notice": done_notice},
        )
    )


@pytest.fixture(scope="module")
def real_done(ui_server: LiveServer) -> dict[str, Any]:
    """A done event as this server writes it (timings, usage …), whose answer fields the tests replace."""
    with httpx.Client(base_url=ui_server.url, timeout=60) as http:
        answered = http.post("/ask", json={"question": "Anything?", "max_tokens": 2, "stream": False}).json()
    return {k: v for k, v in answered.items() if k != "sources"}


def _ask(page: Any, url: str, body: str) -> Any:
    page.route("**/ask", lambda route: route.fulfill(status=200, content_type="text/event-stream", body=body))
    page.goto(url + "/")
    page.wait_for_selector("#server-status .dot.ok")
    page.fill("#question", "How do I load relationships?")
    page.press("#question", "Enter")
    return page.wait_for_selector("article.turn[data-rendered=true]", timeout=TIMEOUT_MS)


def test_the_done_notice_is_shown_above_the_answer(
    ui_server: LiveServer, real_done: dict[str, Any], page: Any, shot: Any
) -> None:
    answer = "Use `capital_loader()` and `river_map`."
    turn = _ask(page, ui_server.url, _stream(real_done, answer, [SOURCE], (None, INVENTED)))
    notice = turn.query_selector("[data-testid=answer-notice]")
    assert notice.inner_text() == INVENTED
    # Between the question and the answer: read before the answer is.
    order = turn.eval_on_selector_all(":scope > *", "es => es.map(e => e.dataset.testid || e.className)")
    assert order[:3] == ["question", "answer-notice", "answer"]
    shot(page, "chat-answer-notice")


def test_the_sources_notice_is_not_repeated_above_the_answer(
    ui_server: LiveServer, real_done: dict[str, Any], page: Any
) -> None:
    turn = _ask(page, ui_server.url, _stream(real_done, "Quintaro, I think.", [], (NOT_COVERED, NOT_COVERED)))
    assert turn.query_selector("[data-testid=answer-notice]") is None
    assert turn.query_selector("[data-testid=notice]").inner_text() == (
        "Your documents do not cover this question: the answer comes from the model alone, not from your documents"
    )


def test_a_passage_that_starts_inside_a_code_block_opens_with_its_code_as_code(
    ui_server: LiveServer, real_done: dict[str, Any], page: Any, shot: Any
) -> None:
    # The chunk before this one opened the block: this passage starts in its code and closes it.
    text = "client = httpx.Client()\nclient.get(url)\n```\n\nThe client keeps connections open.\n"
    source = SOURCE | {"text": text, "snippet": text[:40]}
    turn = _ask(page, ui_server.url, _stream(real_done, "Keep one client.", [source], (None, None)))
    turn.query_selector("button.source").click()
    page.wait_for_selector("dialog#passage[open] #passage-text.markdown pre code")
    assert page.inner_text("#passage-text pre code").strip() == "client = httpx.Client()\nclient.get(url)"
    assert [p.inner_text() for p in page.query_selector_all("#passage-text p")] == [
        "The client keeps connections open."
    ]
    shot(page, "chat-passage-starts-in-code")
