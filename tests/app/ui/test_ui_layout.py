"""The web UI on a phone-sized screen and the details a newcomer trips over: counts that agree, jobs
started elsewhere, server defaults, the end of an answer above the composer, purging failed documents."""

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
    {
        "title": "Zorblat guide to the purple rivers and the kite festival of Quintaro, with a long title",
        "text": "Quintaro is the capital of the planet Zorblat. Its purple rivers flow into the Silver Sea.",
        "tags": ["planets", "travel", "a-rather-long-tag-name"],
    },
    {"title": "Kites", "text": "Every May Quintaro holds a kite festival on the Silver Sea shore."},
    {"title": "Rivers", "text": "The purple rivers of Zorblat get their colour from violet clay."},
    {"title": "Bread", "text": "Sourdough needs flour, water, salt and a starter."},
    {"title": "Moon", "text": "The Moon orbits the Earth every 27.3 days."},
]


@pytest.fixture(scope="module")
def api_job(ui_server: LiveServer) -> dict[str, Any]:
    """Documents ingested over the API (not through the page), plus one file that fails to parse."""
    with httpx.Client(base_url=ui_server.url, timeout=60) as http:
        accepted = http.post("/ingest", json={"documents": DOCS}).json()
        job = wait_for_job(http, accepted["job_id"])
        assert job["status"] == "succeeded"
        bad = http.post("/ingest", files=[("files", ("broken.json", b"[{", "application/json"))]).json()
        assert wait_for_job(http, bad["job_id"])["status"] == "failed"
    return job


@pytest.fixture
def phone(browser: Any, console: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=PHONE, device_scale_factor=1, **BYPASS_CSP)
    page = context.new_page()
    page.on("pageerror", lambda exc: console.errors.append(str(exc)))
    page.on("console", lambda msg: console.errors.append(msg.text) if msg.type == "error" else None)
    yield page
    context.close()
    assert console.unexpected() == []


def _no_sideways_scroll(page: Any) -> None:
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    wide = page.evaluate("""() => [...document.querySelectorAll('body *')]
        .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 0.5)
        .map((e) => `${e.tagName}.${e.className}#${e.id} ${Math.round(e.getBoundingClientRect().right)}`)
        .slice(0, 8)""")
    assert widths[0] <= widths[1], (widths, wide)


def test_admin_on_a_phone_keeps_the_table_inside_its_card(
    ui_server: LiveServer, api_job: dict, phone: Any, shot: Any
) -> None:
    phone.goto(f"{ui_server.url}/admin")
    phone.wait_for_selector("#docs-body tr[data-status=ready]", timeout=TIMEOUT_MS)
    _no_sideways_scroll(phone)
    card, scroller = phone.evaluate("""() => {
        const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.right]; };
        return [box(document.querySelector('.table-scroll').closest('.panel')),
                box(document.querySelector('.table-scroll'))]; }""")
    assert card[0] <= scroller[0] and scroller[1] <= card[1], (card, scroller)
    shot(phone, "admin-phone")


def test_chat_on_a_phone_shows_the_last_sources_and_timing_above_the_composer(
    ui_server: LiveServer, api_job: dict, phone: Any, shot: Any
) -> None:
    phone.goto(ui_server.url + "/")
    phone.wait_for_selector("#server-status .dot.ok")
    phone.wait_for_selector("#ask-form[data-defaults=server]")
    assert phone.input_value("#top-k") == "6"  # the server's retrieval.top_k, not a number in the page
    _no_sideways_scroll(phone)
    for n, text in enumerate(("Where do the purple rivers flow?", "When is the kite festival?"), 1):
        phone.fill("#question", text)
        phone.press("#question", "Enter")
        phone.wait_for_selector(f"article.turn:nth-of-type({n})[data-state=done]", timeout=TIMEOUT_MS)
    last = "article.turn:nth-of-type(2)"
    assert len(phone.query_selector_all(f"{last} .source")) == 5  # every document matched: 5 of top-6
    # After the (smooth) scroll the timing line ends above the composer.
    phone.wait_for_function(
        f"""() => {{
        const stats = document.querySelector('{last} [data-testid=stats]').getBoundingClientRect();
        return stats.bottom <= document.getElementById('ask-form').getBoundingClientRect().top + 1;
    }}""",
        timeout=10_000,
    )
    _no_sideways_scroll(phone)
    shot(phone, "chat-phone-answer")


def test_admin_counts_agree_lists_api_jobs_and_purges_failed_documents(
    ui_server: LiveServer, api_job: dict, page: Any, shot: Any
) -> None:
    page.goto(f"{ui_server.url}/admin")
    card = page.wait_for_selector(
        f"li.job[data-job-id='{api_job['job_id']}'][data-status=succeeded]", timeout=TIMEOUT_MS
    )
    assert card.query_selector(".name").inner_text() == f"job {api_job['job_id'][:8]} · 5 documents"
    assert card.query_selector(".stage").inner_text().startswith("done: 5 new document(s)")
    page.wait_for_function("document.getElementById('docs-sub').textContent.endsWith('total')")
    total = int(page.inner_text("#docs-sub").split()[0])
    assert page.inner_text("#card-docs") == str(total)
    detail = page.inner_text("#card-docs-detail")
    assert re.fullmatch(r"(\d+) ready · 0 ingesting · (\d+) failed", detail), detail
    assert sum(int(x) for x in re.findall(r"\d+", detail)) == total
    shot(page, "admin-counts-jobs")

    page.select_option("#status-filter", "failed")
    page.wait_for_function("document.getElementById('docs-sub').textContent.endsWith('failed')")
    rows = page.query_selector_all("#docs-body tr[data-doc-id]")
    assert rows and {r.get_attribute("data-status") for r in rows} == {"failed"}
    page.click("#purge-failed")
    assert page.inner_text("#purge-failed") == "Confirm"
    page.click("#purge-failed")
    page.wait_for_selector("#docs-body tr[data-doc-id]", state="detached", timeout=TIMEOUT_MS)
    assert page.inner_text("#docs-body") == "No failed documents."
    page.wait_for_selector("#purge-failed", state="hidden")
    shot(page, "admin-purged")
    with httpx.Client(base_url=ui_server.url) as http:
        assert http.get("/documents", params={"status": "failed"}).json()["total"] == 0


def test_reuse_answers_do_not_claim_blending_and_the_ttft_axis_has_one_unit(
    ui_server: LiveServer, api_job: dict, page: Any
) -> None:
    page.goto(ui_server.url + "/")
    page.wait_for_selector("#ask-form[data-defaults=server]")
    page.select_option("#mode", "reuse")
    page.fill("#question", "What colour are the rivers?")
    page.press("#question", "Enter")
    turn = page.wait_for_selector("article.turn[data-state=done]", timeout=TIMEOUT_MS)
    saved = turn.query_selector("[data-k=saved]").inner_text()
    assert "blending" not in saved and re.match(r"(reuse mode saved ~|no time saved)", saved), saved

    labels = page.evaluate("""async () => {
        const { axisLabel } = await import('/static/js/chart.js');
        return [[0, 2000, 4000, 6000].map((v) => axisLabel(v, 6000, 2000)),
                [0, 1250, 2500, 5000].map((v) => axisLabel(v, 5000, 1250)),
                [0, 250, 500].map((v) => axisLabel(v, 500, 250))]; }""")
    assert labels == [
        ["0 s", "2 s", "4 s", "6 s"],
        ["0.00 s", "1.25 s", "2.50 s", "5.00 s"],
        ["0 ms", "250 ms", "500 ms"],
    ]
    page.goto(f"{ui_server.url}/admin")
    page.wait_for_selector("#ttft-chart circle", timeout=TIMEOUT_MS)
    ticks = page.eval_on_selector_all("#ttft-chart text.tick", "ts => ts.map(t => t.textContent)")
    assert len(ticks) >= 2 and len({t.split()[-1] for t in ticks}) == 1, ticks


def test_ttft_chart_never_joins_across_gaps_and_marks_answers_without_documents(
    ui_server: LiveServer, page: Any
) -> None:
    page.goto(f"{ui_server.url}/admin")
    page.wait_for_selector("#ttft-chart")
    drawn = page.evaluate("""async () => {
        const { drawTtftChart } = await import('/static/js/chart.js');
        const ask = (mode, ttft, ctx) => ({ mode, selector: null, ttft_ms: ttft, recompute_ratio: 0,
                                            num_prompt_tokens: 40, num_context_tokens: ctx });
        // Two answers with nothing ingested (fast), blend answers, then full answers much later.
        const recent = [ask("full", 180, 0), ask("full", 170, 0), ask("blend", 900, 500), ask("blend", 950, 500),
                        ask("full", 4000, 500), ask("full", 4100, 500)];
        const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
        const legend = document.createElement("div");
        document.body.append(svg, legend);
        drawTtftChart(svg, legend, recent, {});
        const lines = (mode) => [...svg.querySelectorAll(`g[data-mode=${mode}] polyline`)]
            .map((l) => l.getAttribute("points").split(" ").length);
        return { full: lines("full"), blend: lines("blend"),
                 hollow: svg.querySelectorAll("g[data-mode=full] circle.no-context").length };
    }""")
    # full: one line over its last two answers only, never from the no-document answers across the blend ones.
    assert drawn == {"full": [2], "blend": [2], "hollow": 2}


@pytest.mark.parametrize("width", [1280, 390])
def test_admin_kv_tiers_and_serving_cards_read_as_rows(
    ui_server: LiveServer, api_job: dict, browser: Any, console: Any, shot: Any, width: int
) -> None:
    """Each row of the KV-tiers and serving cards is a name and its value side by side, the value a line or
    two, not a narrow right-aligned column many lines tall."""
    context = browser.new_context(viewport={"width": width, "height": 900}, device_scale_factor=1, **BYPASS_CSP)
    page = context.new_page()
    page.on("pageerror", lambda exc: console.errors.append(str(exc)))
    page.goto(f"{ui_server.url}/admin")
    page.wait_for_selector("#card-serving tr", timeout=TIMEOUT_MS)
    page.wait_for_selector("#card-tiers tr[data-tier]", timeout=TIMEOUT_MS)
    _no_sideways_scroll(page)
    rows = page.evaluate("""() => [...document.querySelectorAll(
        '#card-serving tr, #card-tiers tr, #card-footprint tr')].map((tr) => {
          const cell = tr.lastElementChild;
          const line = parseFloat(getComputedStyle(cell).lineHeight);
          return [tr.firstElementChild.textContent, cell.getBoundingClientRect().height / line,
                  getComputedStyle(cell).textAlign]; })""")
    serving = dict(
        page.eval_on_selector_all(
            "#card-serving tr", "trs => trs.map((tr) => [...tr.children].map((td) => td.textContent))"
        )
    )
    shot(page, f"admin-cards-{width}")
    context.close()
    assert len(rows) >= 14
    # The tiny test model has no record: safe settings, no check part recorded (app/calibration/check_parts.py).
    assert serving["check parts"] == "none recorded"
    # Before, at 1280 px: model 7.2 lines, disk budget and compute 4.2, format and default answer 3.2.
    most_lines = 2 if width == 1280 else 3
    tall = [(name, round(lines, 1)) for name, lines, _ in rows if lines > most_lines + 0.5]
    assert tall == [], tall
