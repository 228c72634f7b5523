"""The web UI in headless chromium: upload on /admin, watch the job, ask on /, see coverage and TTFT."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from apitools import BYPASS_CSP, LiveServer, server_settings, wait_for_job

from app.main import create_app
from app.services.attribution import SourceText, unsupported_identifiers

pytestmark = pytest.mark.browser

ZORBLAT = (
    b"Quintaro is the capital of the planet Zorblat. Its purple rivers flow into the Silver Sea, "
    b"and every May the city holds a kite festival."
)
TIMEOUT_MS = 60_000
KEY = "ui-test-key"


@pytest.fixture(scope="module")
def library(ui_server: LiveServer) -> dict[str, str]:
    """Two documents ingested over the API (the upload test adds its own through the page)."""
    docs = [
        {"title": "Zorblat guide", "text": ZORBLAT.decode()},
        {"title": "Bread notes", "text": "Sourdough needs flour, water, salt and a starter."},
    ]
    with httpx.Client(base_url=ui_server.url, timeout=60) as http:
        accepted = http.post("/ingest", json={"documents": docs}).json()
        assert wait_for_job(http, accepted["job_id"])["status"] == "succeeded"
    return dict(zip(("zorblat", "bread"), accepted["document_ids"], strict=True))


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[LiveServer]:
    settings = server_settings(tmp_path_factory.mktemp("ui-key") / "data", tiny_llama_dir, server={"api_key": KEY})
    with LiveServer(create_app(settings, load_in_background=False)) as server:
        yield server


def test_admin_upload_shows_progress_then_full_coverage(ui_server: LiveServer, page: Any, shot: Any) -> None:
    page.goto(f"{ui_server.url}/admin")
    page.wait_for_selector("#server-status .dot.ok")
    page.set_input_files(
        "#files",
        files=[
            {
                "name": "festival.txt",
                "mimeType": "text/plain",
                "buffer": b"The kite festival of Quintaro is held every May. " * 4,
            }
        ],
    )
    page.fill("#tags", "events")
    page.click("#upload-btn")

    job = page.wait_for_selector(".job", timeout=TIMEOUT_MS)
    assert job.query_selector(".name").inner_text() == "festival.txt"
    page.wait_for_selector(".job[data-status=succeeded]", timeout=TIMEOUT_MS)
    assert page.inner_text(".job .stage").startswith("done: 1 new document(s), 1 chunk(s)")
    assert page.eval_on_selector(".job .progress > span", "e => e.style.width") == "100%"

    with httpx.Client(base_url=ui_server.url) as http:
        [doc_id] = http.get(f"/ingest/jobs/{job.get_attribute('data-job-id')}").json()["document_ids"]
    row = page.wait_for_selector(f"tr[data-doc-id='{doc_id}'][data-status=ready]", timeout=TIMEOUT_MS)
    assert row.query_selector(".title .t").inner_text() == "festival.txt"  # a text file is titled by its name
    assert "tags: events" in row.inner_text()
    assert row.query_selector(".covtext").inner_text() == "1/1 fresh"
    page.wait_for_function("document.getElementById('card-coverage').textContent === '100%'", timeout=TIMEOUT_MS)
    detail = page.inner_text("#card-coverage-detail")
    assert re.fullmatch(r"(\d+) fresh · 0 stale · 0 missing of \1 chunks", detail), detail
    tiers = page.inner_text("#card-tiers")
    assert "memory" in tiers and "disk" in tiers
    with httpx.Client(base_url=ui_server.url) as http:
        fp = http.get("/api/stats").json()["kv_footprint"]
    fmt = page.inner_text("[data-footprint=format]")
    assert fmt.startswith(f"format\t{fp['storage_dtype']} · ") and "/token · " in fmt and "per 1M tokens" in fmt
    budget = page.inner_text("[data-footprint='disk budget']")
    assert f"{fp['disk_entries']} entries · evicts by frequency" in budget, budget
    shot(page, "admin-after-upload")


def test_chat_streams_an_answer_with_sources(
    ui_server: LiveServer, library: dict[str, str], page: Any, shot: Any
) -> None:
    page.goto(ui_server.url + "/")
    page.wait_for_selector("#server-status .dot.ok")
    assert page.is_visible("#ratio-wrap")
    page.fill("#question", "What is the capital of Zorblat?")
    page.press("#question", "Enter")

    turn = page.wait_for_selector("article.turn[data-state=done]", timeout=TIMEOUT_MS)
    assert turn.query_selector(".question").inner_text() == "What is the capital of Zorblat?"
    assert int(turn.get_attribute("data-deltas")) >= 2  # text arrived in several token events
    assert turn.query_selector("[data-testid=answer]").inner_text().strip() != ""
    sources = turn.query_selector_all(".source")
    assert len(sources) >= 1
    assert sources[0].inner_text().startswith("[1]")
    assert "Zorblat guide" in sources[0].inner_text()
    stats = turn.query_selector("[data-testid=stats]").inner_text()
    assert re.search(r"TTFT \d+(\.\d+)? m?s", stats), stats
    assert "mode blend (query) · recompute" in stats
    # Ingest's chunk precompute taught the server its prefill rate, so the saving can be estimated.
    assert turn.query_selector("[data-k=saved]") is not None, stats
    # The answer's decode rate (several tokens arrived: there is one).
    decode = turn.query_selector("[data-k=decode]").inner_text()
    assert re.fullmatch(r"\d+\.\d tokens/s", decode) and float(decode.split()[0]) > 0, decode
    shot(page, "chat-answer")

    sources[0].click()
    page.wait_for_selector("dialog#passage[open]")
    assert page.inner_text("#passage-title") == "[1] Zorblat guide"
    assert page.inner_text("#passage-text").startswith("Quintaro is the capital of the planet Zorblat.")
    shot(page, "chat-passage")
    page.click("#passage-close")
    assert page.query_selector("dialog#passage[open]") is None

    # Another mode: the ratio control hides, and the answer reports the mode. Max tokens starts empty (the
    # server's cap, shown greyed); a number typed there goes with the question as max_tokens.
    page.select_option("#mode", "full")
    assert not page.is_visible("#ratio-wrap")
    assert page.input_value("#max-tokens") == "" and page.get_attribute("#max-tokens", "placeholder") == "16"
    page.fill("#max-tokens", "3")
    page.fill("#question", "Where do the purple rivers flow?")
    with page.expect_request("**/ask") as asked:
        page.click("#ask-btn")
    assert json.loads(asked.value.post_data)["max_tokens"] == 3
    page.wait_for_selector("article.turn:nth-of-type(2)[data-state=done]", timeout=TIMEOUT_MS)
    stats = page.inner_text("article.turn:nth-of-type(2) [data-testid=stats]")
    assert "mode full" in stats
    assert int(re.search(r"in / (\d+) out", stats.replace("\n", " ")).group(1)) <= 3, stats


def test_chat_shows_server_errors(ui_server: LiveServer, page: Any, console: Any) -> None:
    console.expected.append("status of 422")
    page.goto(ui_server.url + "/")
    page.wait_for_selector("#server-status .dot.ok")
    page.fill("#question", "x" * 8001)  # over the API's question limit: a 422 with a message
    page.press("#question", "Enter")
    error = page.wait_for_selector("[data-testid=error]", timeout=TIMEOUT_MS)
    assert error.inner_text() == "question: String should have at most 8000 characters"


def test_admin_plots_recent_ttft_and_deletes(
    ui_server: LiveServer, library: dict[str, str], page: Any, shot: Any
) -> None:
    with httpx.Client(base_url=ui_server.url, timeout=60) as http:
        for mode in ("blend", "full", "reuse", "blend"):
            response = http.post("/ask", json={"question": "Zorblat?", "mode": mode, "max_tokens": 2, "stream": False})
            assert response.status_code == 200
    page.goto(f"{ui_server.url}/admin")
    page.wait_for_selector("#ttft-chart circle", timeout=TIMEOUT_MS)
    modes = page.eval_on_selector_all("#ttft-chart g[data-mode]", "gs => gs.map(g => g.dataset.mode)")
    assert {"blend", "full", "reuse"} <= set(modes)
    legend = page.inner_text("#ttft-legend")
    assert re.search(r"blend p50 \d", legend), legend
    shot(page, "admin-ttft")

    row = f"tr[data-doc-id='{library['bread']}']"
    page.click(f"{row} [data-action=delete]")
    assert page.inner_text(f"{row} [data-action=delete]") == "Confirm"
    page.click(f"{row} [data-action=delete]")
    page.wait_for_selector(row, state="detached", timeout=TIMEOUT_MS)
    with httpx.Client(base_url=ui_server.url) as http:
        assert http.get(f"/documents/{library['bread']}").status_code == 404


def test_admin_asks_for_the_api_key_when_the_server_has_one(keyed_server: LiveServer, page: Any, console: Any) -> None:
    console.expected.append("status of 401")
    page.goto(f"{keyed_server.url}/admin")
    page.wait_for_selector("#keybar:not([hidden])", timeout=TIMEOUT_MS)
    assert page.inner_text("#card-docs") == "–"
    page.fill("#api-key", KEY)
    page.click("#key-save")
    page.wait_for_selector("#keybar", state="hidden")
    page.wait_for_function("document.getElementById('card-docs').textContent === '0'", timeout=TIMEOUT_MS)
    assert page.inner_text("#docs-body") == "No documents yet. Upload some above."
    assert page.evaluate("localStorage.getItem('blendrag.apiKey')") == KEY


def test_api_docs_render_offline(ui_server: LiveServer, page: Any, shot: Any) -> None:
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(ui_server.url) else None)
    page.goto(f"{ui_server.url}/docs")
    page.wait_for_selector(".opblock-summary-path[data-path='/ask']", timeout=TIMEOUT_MS)
    assert page.inner_text(".info .title").startswith("blendrag")
    assert outside == []
    shot(page, "api-docs")


HOSTILE_DOC = (
    "# Timeouts\n\nSet a timeout on the client:\n\n```python\nclient = httpx.Client(timeout=10.0)\n```\n\n"
    '<img src="https://example.invalid/' + "a" * 300 + '.png" onerror="window.__pwned = 1">\n\n'
    "<script>window.__pwned = 2</script>\n"
)
CANNED_ANSWER = (
    "### `timeout`\n\nSet it on the client.\n\n```python\nclient = httpx.Client(timeout=5)\n```\n\n"
    "Or pass `connect_timeout=5` to it.\n"
)
CITED = "Set it on the client."


def _citation(answer: str, sentence: str, rank: int) -> dict:
    start = answer.index(sentence)
    return {"start": start, "end": start + len(sentence), "rank": rank, "score": 0.9}


def _sse(event: str, data: dict) -> str:
    import json

    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def test_answers_and_passages_render_as_markdown_and_nothing_executes(
    ui_server: LiveServer, browser: Any, console: Any, shot: Any
) -> None:
    with httpx.Client(base_url=ui_server.url, timeout=60) as http:
        accepted = http.post("/ingest", json={"documents": [{"title": "Timeouts", "text": HOSTILE_DOC}]}).json()
        assert wait_for_job(http, accepted["job_id"])["status"] == "succeeded"
        real = http.post("/ask", json={"question": "How do I set a timeout?", "top_k": 1, "stream": False}).json()
    [source] = real["sources"]
    assert (source["title"], source["section"]) == ("Timeouts", "Timeouts")  # the page's H1 opens the passage
    # A second passage of the same page under another heading: the chips tell the two apart by it.
    shown = [source, {**source, "rank": 2, "section": "Client options and their defaults in every transport"}]
    # The answer: a fixed Markdown stream (the tiny test model writes random tokens), split mid-fence so the
    # page renders an unclosed fence while streaming; sources and stats as the server sends them.
    half = CANNED_ANSWER.index("timeout=5")
    body = (
        _sse("sources", {"sources": shown, "retrieval_ms": 1.0})
        + _sse("token", {"text": CANNED_ANSWER[:half]})
        + _sse("token", {"text": CANNED_ANSWER[half:]})
        + _sse(
            "done",
            {k: v for k, v in real.items() if k != "sources"}
            | {
                "answer": CANNED_ANSWER,
                "citations": [_citation(CANNED_ANSWER, CITED, 1)],
                # The server's own check of this answer against this source: connect_timeout is in neither.
                "unsupported_identifiers": [
                    dataclasses.asdict(u)
                    for u in unsupported_identifiers(CANNED_ANSWER, [SourceText(1, source["text"])])
                ],
                # The answer ended on the repeated-line stop: the page says so, with what was withheld.
                "finish_reason": "repetition",
                "repeated_line": {"text": CITED, "earlier_start": CANNED_ANSWER.index(CITED)},
            },
        )
    )
    for width in (1280, 390):
        context = browser.new_context(viewport={"width": width, "height": 900}, **BYPASS_CSP)
        page = context.new_page()
        page.on("pageerror", lambda exc: console.errors.append(str(exc)))
        page.route("**/ask", lambda route: route.fulfill(status=200, content_type="text/event-stream", body=body))
        page.goto(ui_server.url + "/")
        page.wait_for_selector("#server-status .dot.ok")
        page.fill("#question", "How do I set a timeout?")
        page.press("#question", "Enter")
        answer = page.wait_for_selector("article.turn[data-rendered=true] [data-testid=answer]", timeout=TIMEOUT_MS)
        assert answer.query_selector("h3 code").inner_text() == "timeout"
        code = answer.query_selector("pre code.language-python")
        assert code.inner_text().strip() == "client = httpx.Client(timeout=5)"
        assert page.eval_on_selector("pre code", "e => getComputedStyle(e).fontFamily").startswith("ui-monospace")
        assert "```" not in answer.inner_text() and "###" not in answer.inner_text()
        cite = answer.query_selector("button.cite")
        assert cite.inner_text() == "[1]"
        assert answer.query_selector("p:nth-of-type(1)").inner_text() == "Set it on the client [1]."
        # A section equal to the title is not repeated; another one is shown beside the title, within the page.
        chips = page.query_selector_all("article.turn button.source")
        assert [c.query_selector(".t").inner_text() for c in chips] == ["Timeouts", "Timeouts"]
        assert [c.inner_text() for c in page.query_selector_all("article.turn button.source .sec")] == [
            "Client options and their defaults in every transport"
        ]
        assert all(c.bounding_box()["x"] + c.bounding_box()["width"] <= width for c in chips)
        # An identifier no source contains is marked where it stands and named under the answer.
        assert [m.inner_text() for m in answer.query_selector_all("mark.unsupported")] == ["connect_timeout"]
        assert answer.query_selector("pre mark") is None  # `timeout=5` in the example is not checked
        note = page.inner_text("article.turn [data-testid=unsupported]")
        assert note == "Not in any source (may be invented): connect_timeout"
        stopped = page.inner_text("article.turn [data-testid=finish-note]")
        assert stopped == "stopped: the answer started repeating: «Set it on the client.»"
        shot(page, f"chat-markdown-{width}")
        cite.click()  # the [1] mark opens the source, itself rendered
        page.wait_for_selector("dialog#passage[open] #passage-text.markdown pre code")
        text = page.inner_text("#passage-text")
        assert "client = httpx.Client(timeout=10.0)" in text and '<img src="https://example.invalid/' in text
        assert page.query_selector("#passage-text img, #passage-text script") is None
        assert page.evaluate("window.__pwned") is None
        overflow = page.eval_on_selector("#passage-text", "e => e.scrollWidth - e.clientWidth")
        assert overflow <= 0, overflow  # the long <img …> text wraps inside the dialog
        shot(page, f"chat-markdown-passage-{width}")
        context.close()
    with httpx.Client(base_url=ui_server.url, timeout=60) as http:
        http.delete(f"/documents/{source['document_id']}")
    assert console.unexpected() == []


@pytest.fixture(scope="module")
def empty_server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[LiveServer]:
    settings = server_settings(tmp_path_factory.mktemp("ui-empty") / "data", tiny_llama_dir)
    with LiveServer(create_app(settings, load_in_background=False)) as server:
        yield server


def test_asking_with_nothing_ingested_says_so(empty_server: LiveServer, page: Any, shot: Any) -> None:
    page.goto(empty_server.url + "/")
    page.wait_for_selector("#server-status .dot.ok")
    page.fill("#question", "When is the launch?")
    page.press("#question", "Enter")
    page.wait_for_selector("article.turn[data-state=done]", timeout=TIMEOUT_MS)
    assert page.inner_text("[data-testid=notice]") == (
        "Nothing ingested yet: the answer comes from the model alone, not from your documents"
    )
    shot(page, "chat-nothing-ingested")
