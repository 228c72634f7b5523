"""One rule for blank text (zero-width-only is blank, like white space), JSON numbers only for numeric
fields, `filters.document_ids: []` means no filter, anonymous answers have their own `max_tokens` cap, and
the multipart ingest form accepts what its schema describes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apitools import ingest_corpus, server_settings, wait_for_job
from fastapi.testclient import TestClient

from app.settings import Settings

KEY = "the-key"
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff\u00ad"


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Settings:
    return server_settings(
        tmp_path_factory.mktemp("blank") / "data",
        tiny_llama_dir,
        server={"api_key": KEY, "anonymous_max_tokens": 2},
        engine={"temperature": 1.0},  # sampled: the tiny model does not stop early
    )


@pytest.fixture(scope="module")
def corpus(client: TestClient) -> dict[str, str]:
    return ingest_corpus(client, headers={"X-API-Key": KEY})


def _ask(client: TestClient, body: dict, headers: dict | None = None):
    return client.post("/ask", json={"question": "Where is Quintaro?", "stream": False, **body}, headers=headers)


@pytest.mark.parametrize("text", [ZERO_WIDTH, " \t\n", "\u200b \u3000\x01"])
def test_blank_document_text_is_422_at_once(client: TestClient, text: str) -> None:
    headers = {"X-API-Key": KEY}
    num_jobs = len(client.get("/ingest/jobs", headers=headers).json()["jobs"])
    response = client.post("/ingest", json={"documents": [{"title": "t", "text": text}]}, headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == "document 't' has no text"
    assert len(client.get("/ingest/jobs", headers=headers).json()["jobs"]) == num_jobs  # no job was made


@pytest.mark.parametrize("title", ["   ", ZERO_WIDTH, "\t\u3000"])
def test_a_blank_document_title_is_422_at_once(client: TestClient, title: str) -> None:
    headers = {"X-API-Key": KEY}
    response = client.post("/ingest", json={"documents": [{"title": title, "text": "Some text."}]}, headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == (
        f"invalid ingest body: documents.0: Value error, document title {title!r} is blank (only white space or "
        "invisible characters)"
    )


@pytest.mark.parametrize("question", [ZERO_WIDTH, " ", "\u200b\u2028"])
def test_blank_question_is_422_on_ask_and_v1(client: TestClient, question: str) -> None:
    response = _ask(client, {"question": question})
    assert response.status_code == 422, response.text
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": question}]})
    assert chat.status_code == 400, chat.text


@pytest.mark.parametrize(
    "field", [{"top_k": "6"}, {"max_tokens": "2"}, {"temperature": "0.5"}, {"seed": "1"}, {"top_k": True}]
)
def test_numbers_must_be_json_numbers(client: TestClient, field: dict) -> None:
    response = _ask(client, field)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["loc"] == ["body", next(iter(field))]


def test_empty_document_ids_means_no_filter(client: TestClient, corpus: dict[str, str]) -> None:
    unfiltered = _ask(client, {"top_k": 2, "max_tokens": 1}).json()["sources"]
    assert len(unfiltered) == 2
    for filters in ({"document_ids": []}, {"tags": []}, {"document_ids": [], "tags": []}):
        assert _ask(client, {"top_k": 2, "max_tokens": 1, "filters": filters}).json()["sources"] == unfiltered
    only = _ask(client, {"top_k": 2, "max_tokens": 1, "filters": {"document_ids": [corpus["Moon notes"]]}})
    assert [s["title"] for s in only.json()["sources"]] == ["Moon notes"]


def test_anonymous_answers_are_capped_keyed_ones_are_not(client: TestClient) -> None:
    anonymous = _ask(client, {"max_tokens": 6}).json()
    assert (anonymous["usage"]["completion_tokens"], anonymous["finish_reason"]) == (2, "length")
    chat = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi?"}], "max_tokens": 6}
    ).json()
    assert chat["usage"]["completion_tokens"] == 2
    keyed = _ask(client, {"max_tokens": 6}, headers={"Authorization": f"Bearer {KEY}"}).json()
    assert keyed["usage"]["completion_tokens"] == 6


def test_multipart_form_accepts_what_its_schema_says(client: TestClient) -> None:
    headers = {"X-API-Key": KEY}
    doc = {"title": "Inline", "text": "Inline multipart text about lighthouses."}
    # one part holding the JSON list, or one part per document
    listed = client.post(
        "/ingest", files=[("documents", (None, json.dumps([doc]), "application/json"))], headers=headers
    )
    assert listed.status_code == 202, listed.text
    assert wait_for_job(client, listed.json()["job_id"], headers=headers)["status"] == "succeeded"
    other = {"title": "Second", "text": "Another inline text about harbours."}
    per_part = client.post(
        "/ingest",
        files=[("documents", (None, json.dumps(other))), ("documents", (None, json.dumps({**other, "title": "3"})))],
        headers=headers,
    )
    assert per_part.status_code == 202 and len(per_part.json()["document_ids"]) == 2
    as_file = {"title": "Filed", "text": "Inline documents sent as a file part about quays."}
    filed = client.post("/ingest", files=[("documents", ("docs.json", json.dumps([as_file])))], headers=headers)
    assert filed.status_code == 202, filed.text
    for bad, status in ((("documents", (None, "")), 422), (("files", ("image.gif", b"GIF89a")), 415)):
        response = client.post("/ingest", files=[bad], headers=headers)
        assert response.status_code == status, response.text
    spec = client.get("/openapi.json").json()["paths"]["/ingest"]["post"]["requestBody"]["content"]
    form = spec["multipart/form-data"]
    assert form["schema"]["properties"]["documents"]["type"] == "array"
    assert "txt" in form["encoding"]["files"]["headers"]["Content-Disposition"]["schema"]["pattern"]
