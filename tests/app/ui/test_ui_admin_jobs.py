"""Ingest jobs on the admin page, in headless chromium (issue 62, item 7c): a re-ingest of stored documents
reports its duplicates as duplicates, not errors, and counts the documents it added; a job waiting for the
originals of its duplicates says so."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from apitools import LiveServer, wait_for_job

pytestmark = pytest.mark.browser

TIMEOUT_MS = 60_000
DOCS = [
    {"title": "Zorblat guide", "text": "Quintaro is the capital of the planet Zorblat."},
    {"title": "Bread notes", "text": "Sourdough needs flour, water, salt and a starter."},
]


def test_a_reingest_of_stored_documents_shows_duplicates_not_errors(
    ui_server: LiveServer, page: Any, shot: Any
) -> None:
    with httpx.Client(base_url=ui_server.url, timeout=60) as http:
        first = http.post("/ingest", json={"documents": DOCS}).json()
        assert wait_for_job(http, first["job_id"])["status"] == "succeeded"
        again = http.post("/ingest", json={"documents": DOCS}).json()
        assert wait_for_job(http, again["job_id"])["status"] == "succeeded"
    page.goto(f"{ui_server.url}/admin")
    card = page.wait_for_selector(f".job[data-job-id='{again['job_id']}']", timeout=TIMEOUT_MS)
    assert card.query_selector(".name").inner_text() == f"job {again['job_id'][:8]} · 2 documents"
    assert (
        card.query_selector(".stage").inner_text()
        == "done: 0 new document(s), 2 duplicate(s) of stored documents, 0 chunk(s)"
    )
    assert card.query_selector_all(".errors li") == []
    assert card.query_selector(".duplicates summary").inner_text() == "2 duplicate(s): already stored"
    card.query_selector(".duplicates summary").click()
    assert [li.inner_text() for li in card.query_selector_all(".duplicates li")] == [
        f"{doc['title']}: same content as document {doc_id[:8]}"
        for doc, doc_id in zip(DOCS, first["document_ids"], strict=True)
    ]
    original = page.query_selector(f".job[data-job-id='{first['job_id']}']")
    assert original.query_selector(".stage").inner_text().startswith("done: 2 new document(s), 2 chunk(s), KV cache +")
    assert original.query_selector(".duplicates").is_hidden()
    shot(page, "admin-job-duplicates")


def test_a_job_waiting_for_the_originals_of_its_duplicates_says_so(ui_server: LiveServer, page: Any) -> None:
    stages = ("parse", "chunk", "embed", "kv", "commit")
    job = {
        "job_id": "0123456789abcdef",
        "status": "running",
        "stage": "waiting",
        "progress": {s: {"done": 1, "total": 1} for s in stages} | {"commit": {"done": 1, "total": 1, "ready": 1}},
        "errors": [
            {
                "source": "copy.pdf",
                "error": "duplicate of document fedcba98",
                "code": "duplicate",
                "document_id": "fedcba9876543210",
            }
        ],
        "document_ids": ["aaaaaaaa11111111"],
        "duplicate_ids": ["fedcba9876543210"],
        "cancel_requested": False,
        "collection": "default",
        "created_at": "2025-01-01T00:00:00Z",
        "updated_at": "2025-01-01T00:00:00Z",
    }
    # The server's own job list and event stream, answered with a job at the `waiting` stage.
    page.route("**/ingest/jobs?limit=*", lambda route: route.fulfill(json={"jobs": [job]}))
    events = f"event: progress\ndata: {json.dumps(job)}\n\n"
    page.route(
        f"**/ingest/jobs/{job['job_id']}/events",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=events),
    )
    page.goto(f"{ui_server.url}/admin")
    card = page.wait_for_selector(f".job[data-job-id='{job['job_id']}'][data-status=running]", timeout=TIMEOUT_MS)
    page.wait_for_function(
        f"document.querySelector(\".job[data-job-id='{job['job_id']}'] .stage\").textContent.startsWith('waiting')"
    )
    assert card.query_selector(".stage").inner_text() == (
        "waiting for the originals of its duplicates (other jobs are ingesting them)"
    )
    assert card.eval_on_selector(".progress > span", "e => e.style.width") == "100%"
    assert card.query_selector(".duplicates summary").inner_text() == "1 duplicate(s): already stored"
