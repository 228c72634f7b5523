"""Bounded work per request (body size, tokens per document and per job) and uploads that are never lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from apitools import server_settings, wait_for_job
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

MAX_BODY = 32 * 1024
MAX_UPLOAD = 96 * 1024
MAX_DOC_TOKENS = 300
MAX_JOB_TOKENS = 500


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Settings:
    return server_settings(
        tmp_path_factory.mktemp("limits") / "data",
        tiny_llama_dir,
        server={"max_body_bytes": MAX_BODY, "max_upload_bytes": MAX_UPLOAD},
        ingest={"max_document_tokens": MAX_DOC_TOKENS, "max_job_tokens": MAX_JOB_TOKENS, "max_job_documents": 3},
    )


@pytest.fixture(scope="module")
def http(limited: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(limited, load_in_background=False)) as c:
        yield c


def _leftovers(settings: Settings) -> list[str]:
    uploads = settings.uploads_dir
    return sorted(p.name for p in uploads.rglob(".upload-*")) if uploads.exists() else []


def test_two_uploads_with_one_name_are_two_documents(http: TestClient, limited: Settings) -> None:
    files = [
        ("files", ("same.txt", b"The first file talks about red apples.", "text/plain")),
        ("files", ("same.txt", b"The second file talks about blue whales.", "text/plain")),
    ]
    accepted = http.post("/ingest", files=files)
    assert accepted.status_code == 202, accepted.text
    job = wait_for_job(http, accepted.json()["job_id"])
    assert job["status"] == "succeeded", job
    texts = sorted(
        http.get(f"/documents/{doc_id}").json()["chunks"][0]["text"].strip() for doc_id in job["document_ids"]
    )
    assert texts == ["The first file talks about red apples.", "The second file talks about blue whales."]
    assert list(limited.uploads_dir.rglob("same.txt")) == []  # both read, then removed when the job ended


@pytest.mark.parametrize("name", [b"a\x00b.txt", ("x" * 252 + "é.txt").encode()])
def test_unstorable_file_names_are_422_and_leave_no_temp_file(http: TestClient, limited: Settings, name: bytes) -> None:
    # Written by hand: httpx would percent-encode the NUL; a raw client sends it as is.
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="files"; filename="' + name + b'"\r\n'
        b"Content-Type: text/plain\r\n\r\nsome text\r\n--XyZ--\r\n"
    )
    response = http.post("/ingest", content=body, headers={"content-type": "multipart/form-data; boundary=XyZ"})
    assert response.status_code == 422, response.text
    assert "file name" in response.json()["detail"]
    assert _leftovers(limited) == []


def test_json_body_over_the_limit_is_413(http: TestClient) -> None:
    big = {"documents": [{"title": "big", "text": "word " * (MAX_BODY // 4)}]}
    response = http.post("/ingest", json=big)
    assert response.status_code == 413
    assert response.json() == {"detail": f"request body larger than the {MAX_BODY}-byte limit (server.max_body_bytes)"}
    ask = http.post("/ask", json={"question": "q?", "filters": {"tags": ["t" * 1000] * 40}})
    assert ask.status_code == 413
    chat = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "system", "content": "s" * MAX_BODY}, {"role": "user", "content": "q?"}]},
    )
    assert chat.status_code == 413
    assert chat.json()["error"]["code"] == "request_too_large"


def test_chunked_body_over_the_limit_is_413(http: TestClient) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while the body streams in
        yield b'{"documents": [{"title": "t", "text": "'
        for _ in range(MAX_BODY // 1024 + 2):
            yield b"x" * 1024
        yield b'"}]}'

    response = http.post("/ingest", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert "server.max_body_bytes" in response.json()["detail"]


def test_multipart_over_the_upload_limit_is_413_and_leaves_nothing(http: TestClient, limited: Settings) -> None:
    files = [("files", (f"f{i}.txt", b"y" * (40 * 1024), "text/plain")) for i in range(3)]
    response = http.post("/ingest", files=files)
    assert response.status_code == 413
    assert "server.max_upload_bytes" in response.json()["detail"]
    assert _leftovers(limited) == []


def test_inline_document_over_the_token_cap_is_413(http: TestClient) -> None:
    text = " ".join(f"word{i}" for i in range(400))  # well over 300 tokens
    response = http.post("/ingest", json={"documents": [{"title": "long", "text": text}]})
    assert response.status_code == 413
    detail = response.json()["detail"]
    assert detail.startswith("document 'long' has ") and detail.endswith(
        f"tokens; the limit is {MAX_DOC_TOKENS} (ingest.max_document_tokens)"
    )


def test_job_over_the_token_cap_is_413(http: TestClient) -> None:
    text = " ".join(f"w{i}" for i in range(90))  # ~200 tokens each, three of them over 500
    docs = [{"title": f"d{i}", "text": f"{i} {text}"} for i in range(3)]
    response = http.post("/ingest", json={"documents": docs})
    assert response.status_code == 413, response.text
    assert response.json()["detail"].endswith(f"the limit per request is {MAX_JOB_TOKENS} (ingest.max_job_tokens)")
    too_many = http.post("/ingest", json={"documents": [{"title": f"t{i}", "text": "x"} for i in range(4)]})
    assert too_many.status_code == 413
    assert too_many.json()["detail"] == "4 documents in one request; the limit is 3 (ingest.max_job_documents)"


def test_uploaded_file_over_the_token_cap_fails_its_document(http: TestClient) -> None:
    text = " ".join(f"token{i}" for i in range(400)).encode()
    accepted = http.post(
        "/ingest",
        files=[
            ("files", ("long.txt", text, "text/plain")),
            ("files", ("short.txt", b"A short note about kites.", "text/plain")),
        ],
    )
    assert accepted.status_code == 202
    job = wait_for_job(http, accepted.json()["job_id"])
    assert job["status"] == "succeeded"  # the short file made it
    [error] = job["errors"]
    assert error["code"] == "too_large" and error["source"] == "long.txt"
    assert error["error"].endswith(f"the limit is {MAX_DOC_TOKENS} (ingest.max_document_tokens)")
    statuses = [http.get(f"/documents/{d}").json()["status"] for d in job["document_ids"]]
    assert statuses == ["failed", "ready"]
