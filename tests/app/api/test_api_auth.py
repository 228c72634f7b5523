"""With `server.api_key` set: admin routes need the key, asking and the UI pages stay open."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from apitools import server_settings, wait_for_job
from fastapi.testclient import TestClient

from app.main import create_app

KEY = "s3cret-key"
BEARER = {"Authorization": f"Bearer {KEY}"}
DENIED = {"detail": "missing or wrong API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"}

PROTECTED = [
    ("POST", "/ingest"),
    ("GET", "/ingest/jobs/some-job"),
    ("POST", "/ingest/jobs/some-job/cancel"),
    ("GET", "/ingest/jobs/some-job/events"),
    ("GET", "/documents"),
    ("GET", "/documents/some-doc"),
    ("DELETE", "/documents/some-doc"),
    ("GET", "/api/coverage"),
    ("GET", "/api/stats"),
    ("GET", "/metrics"),
]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[TestClient]:
    # Many wrong keys from one address here: the wrong-key limit (429) is tested in test_api_rate_keys.py.
    settings = server_settings(
        tmp_path_factory.mktemp("auth") / "data", tiny_llama_dir, server={"api_key": KEY, "wrong_key_burst": 1000}
    )
    with TestClient(create_app(settings, load_in_background=False)) as client:
        yield client


@pytest.mark.parametrize(("method", "path"), PROTECTED)
def test_admin_routes_need_the_key(keyed: TestClient, method: str, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "wrong"}, {"Authorization": KEY}):
        response = keyed.request(method, path, headers=headers)
        assert response.status_code == 401, (path, headers)
        assert response.json() == DENIED
        assert response.headers["www-authenticate"] == "Bearer"


def test_the_key_opens_them_as_bearer_or_header(keyed: TestClient) -> None:
    accepted = keyed.post(
        "/ingest",
        headers=BEARER,
        json={"documents": [{"title": "Keyed", "text": "Only key holders may add documents like this one."}]},
    )
    assert accepted.status_code == 202
    job = wait_for_job(keyed, accepted.json()["job_id"], headers=BEARER)
    assert job["status"] == "succeeded"
    doc_id = accepted.json()["document_ids"][0]
    assert keyed.get(f"/documents/{doc_id}", headers={"X-API-Key": KEY}).status_code == 200
    assert keyed.get("/documents", headers={"authorization": f"bearer {KEY}"}).json()["total"] == 1
    assert keyed.get("/api/coverage", headers=BEARER).json()["chunks_fresh"] == 1
    assert keyed.get("/api/stats", headers=BEARER).status_code == 200
    assert keyed.get("/metrics", headers=BEARER).status_code == 200
    assert keyed.delete(f"/documents/{doc_id}", headers=BEARER).status_code == 204


def test_asking_health_docs_and_pages_stay_open(keyed: TestClient) -> None:
    assert (
        keyed.post("/ask", json={"question": "Who may add documents?", "max_tokens": 1, "stream": False}).status_code
        == 200
    )
    chat = keyed.post(
        "/v1/chat/completions",
        json={"model": "blendrag", "max_tokens": 1, "messages": [{"role": "user", "content": "Who?"}]},
    )
    assert chat.status_code == 200
    for path in ("/v1/models", "/health", "/ready", "/docs", "/openapi.json", "/", "/admin", "/static/js/admin.js"):
        assert keyed.get(path).status_code == 200, path
