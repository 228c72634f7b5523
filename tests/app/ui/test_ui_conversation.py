"""The chat page as a conversation: turns stack with their sources and timing lines, follow-ups carry the
conversation (history tokens in the timing line), "New chat" starts over, a recent conversation reopens.
Desktop and a 390 px phone; screenshots in test-output/screenshots/."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from apitools import BYPASS_CSP, LiveServer, wait_for_job

pytestmark = pytest.mark.browser

TIMEOUT_MS = 60_000
PHONE = {"width": 390, "height": 700}
DOCS = [
    {"title": "Zorblat guide", "text": "Quintaro is the capital of the planet Zorblat. Its rivers are purple."},
    {"title": "Kites", "text": "Every May Quintaro holds a kite festival on the Silver Sea shore."},
]


@pytest.fixture(scope="module")
def library(ui_server: LiveServer) -> None:
    with httpx.Client(base_url=ui_server.url, timeout=60) as http:
        accepted = http.post("/ingest", json={"documents": DOCS}).json()
        assert wait_for_job(http, accepted["job_id"])["status"] == "succeeded"


@pytest.fixture
def phone(browser: Any, console: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=PHONE, device_scale_factor=1, **BYPASS_CSP)
    page = context.new_page()
    page.on("pageerror", lambda exc: console.errors.append(str(exc)))
    page.on("console", lambda msg: console.errors.append(msg.text) if msg.type == "error" else None)
    yield page
    context.close()
    assert console.unexpected() == []


def _ask(page: Any, question: str, n: int) -> Any:
    page.fill("#question", question)
    page.press("#question", "Enter")
    return page.wait_for_selector(f"article.turn:nth-of-type({n})[data-state=done]", timeout=TIMEOUT_MS)


def _unmarked(text: str) -> str:
    """An answer's text without [n] citation marks, white space normalised."""
    return " ".join(re.sub(r"\s*\[\d+\]", "", text).split())


def _conversation_turns(page: Any) -> list[str]:
    return [q.inner_text() for q in page.query_selector_all("article.turn .question")]


def test_follow_ups_continue_the_conversation_and_reopen(
    ui_server: LiveServer, library: None, page: Any, browser: Any, shot: Any
) -> None:
    page.goto(ui_server.url + "/")
    page.wait_for_selector("#server-status .dot.ok")
    first = _ask(page, "What is the capital of Zorblat?", 1)
    conversation = page.get_attribute("#thread", "data-conversation")
    assert conversation
    assert page.inner_text("[data-testid=conversation]") == "“What is the capital of Zorblat?”"
    assert first.query_selector("[data-k=history]") is None  # no earlier turns yet
    second = _ask(page, "And when is its kite festival?", 2)
    page.wait_for_selector("article.turn:nth-of-type(2)[data-rendered=true]")
    shown = second.query_selector("[data-testid=answer]").inner_text()
    assert page.get_attribute("#thread", "data-conversation") == conversation  # the same conversation
    history = second.query_selector("[data-k=history]").inner_text()
    assert history.startswith("history ") and history.endswith(" reused"), history
    assert second.query_selector(".question").inner_text() == "#2And when is its kite festival?"
    assert len(second.query_selector_all(".source")) >= 1
    shot(page, "chat-conversation")

    with httpx.Client(base_url=ui_server.url) as http:
        stored = http.get(f"/conversations/{conversation}").json()
    assert [t["question"] for t in stored["turns"]] == [
        "What is the capital of Zorblat?",
        "And when is its kite festival?",
    ]

    page.click("[data-testid=new-chat]")
    assert page.get_attribute("#thread", "data-conversation") == ""
    assert page.query_selector("article.turn") is None and page.is_visible("#empty")
    _ask(page, "Who holds a kite festival?", 1)
    assert page.get_attribute("#thread", "data-conversation") not in ("", conversation)

    page.click("[data-testid=recent-toggle]")
    item = page.wait_for_selector(f"#recent-list button[data-id='{conversation}']")
    assert "2 turns" in item.inner_text() and "What is the capital of Zorblat?" in item.inner_text()
    shot(page, "chat-recent")
    item.click()
    page.wait_for_function(f"document.getElementById('thread').dataset.conversation === '{conversation}'")
    assert _conversation_turns(page) == ["What is the capital of Zorblat?", "#2And when is its kite festival?"]
    page.wait_for_selector("article.turn:nth-of-type(2)[data-rendered=true]")
    reopened = page.query_selector("article.turn:nth-of-type(2)")
    assert reopened.get_attribute("data-state") == "done"
    assert stored["turns"][1]["answer"].strip()
    # The stored answer, rendered as it was live (without the citation marks only a live answer carries).
    assert _unmarked(reopened.query_selector("[data-testid=answer]").inner_text()) == _unmarked(shown) != ""
    assert "TTFT" in reopened.query_selector("[data-testid=stats]").inner_text()
    # A follow-up after reopening continues it.
    _ask(page, "Is it on the Silver Sea shore?", 3)
    with httpx.Client(base_url=ui_server.url) as http:
        assert http.get(f"/conversations/{conversation}").json()["num_turns"] == 3
        assert http.get("/conversations").json()["total"] == 0  # keyless: listed to nobody
    shot(page, "chat-reopened")
    # Another keyless visitor (another browser) is not shown this browser's conversations.
    stranger = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    stranger.goto(ui_server.url + "/")
    stranger.click("[data-testid=recent-toggle]")
    stranger.wait_for_selector("#recent-list li.muted")
    assert stranger.inner_text("#recent-list") == "No conversations yet"
    stranger.context.close()


def test_conversation_on_a_phone(ui_server: LiveServer, library: None, phone: Any, shot: Any) -> None:
    phone.goto(ui_server.url + "/")
    phone.wait_for_selector("#server-status .dot.ok")
    _ask(phone, "What is the capital of Zorblat?", 1)
    _ask(phone, "And its rivers?", 2)
    phone.click("[data-testid=recent-toggle]")
    phone.wait_for_selector("#recent-list button[data-id]")
    # The recent list and the thread stay inside the screen: no sideways scrolling.
    right = phone.evaluate(
        "Math.max(...[...document.querySelectorAll('#recent-list, article.turn')]"
        ".map((e) => e.getBoundingClientRect().right))"
    )
    assert right <= PHONE["width"] + 0.5, right
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(phone, "chat-conversation-phone")
