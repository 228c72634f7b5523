"""The web UI in headless chromium: upload on /admin, watch the job, ask on /, see coverage and TTFT."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from apitools import LiveServer, server_settings, wait_for_job

from app.main import create_app

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
    assert page.inner_text(".job .stage").startswith("done: 1 document(s), 1 chunk(s)")
    assert page.eval_on_selector(".job .progress > span", "e => e.style.width") == "100%"

    with httpx.Client(base_url=ui_server.url) as http:
        [doc_id] = http.get(f"/ingest/jobs/{job.get_attribute('data-job-id')}").json()["document_ids"]
    row = page.wait_for_selector(f"tr[data-doc-id='{doc_id}'][data-status=ready]", timeout=TIMEOUT_MS)
    assert row.query_selector(".title .t").inner_text() == "festival"  # a text file is titled by its name
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
    shot(page, "chat-answer")

    sources[0].click()
    page.wait_for_selector("dialog#passage[open]")
    assert page.inner_text("#passage-title") == "[1] Zorblat guide"
    assert page.inner_text("#passage-text").startswith("Quintaro is the capital of the planet Zorblat.")
    shot(page, "chat-passage")
    page.click("#passage-close")
    assert page.query_selector("dialog#passage[open]") is None

    # Another mode: the ratio control hides, and the answer reports the mode.
    page.select_option("#mode", "full")
    assert not page.is_visible("#ratio-wrap")
    page.fill("#question", "Where do the purple rivers flow?")
    page.click("#ask-btn")
    page.wait_for_selector("article.turn:nth-of-type(2)[data-state=done]", timeout=TIMEOUT_MS)
    assert "mode full" in page.inner_text("article.turn:nth-of-type(2) [data-testid=stats]")


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
