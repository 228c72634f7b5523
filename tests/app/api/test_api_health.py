"""Liveness, readiness, start-up failure, OpenAPI docs and the UI's static pages."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from apitools import server_settings
from fastapi.testclient import TestClient

from app.main import create_app
from app.ui import STATIC_DIR


def test_health_and_ready_once_loaded(client: TestClient) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    ready = client.get("/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready"
    assert body["storage"]["ok"] is True and body["storage"]["last_fault"] is None
    assert body["storage"]["free_bytes"] > 0


def test_before_start_up_only_health_answers(tmp_path: Path, tiny_llama_dir: Path) -> None:
    # No `with`: the lifespan never runs, exactly like the seconds while models load.
    client = TestClient(create_app(server_settings(tmp_path / "data", tiny_llama_dir)))
    assert client.get("/health").json() == {"status": "ok"}
    ready = client.get("/ready")
    assert ready.status_code == 503
    assert ready.json() == {"status": "loading"}
    for method, path, body in (
        ("POST", "/ask", {"question": "q"}),
        ("GET", "/documents", None),
        ("POST", "/ingest", {"documents": [{"title": "t", "text": "x"}]}),
        ("GET", "/api/coverage", None),
    ):
        response = client.request(method, path, json=body)
        assert response.status_code == 503, path
        assert response.json() == {"detail": "models are still loading"}
        assert response.headers["retry-after"] == "5"
    chat = client.post(
        "/v1/chat/completions", json={"model": "blendrag", "messages": [{"role": "user", "content": "q"}]}
    )
    assert chat.status_code == 503
    assert chat.json()["error"]["message"] == "models are still loading"


def test_start_up_logs_each_step_loads_the_embedder_and_ends_with_ready_at(
    tmp_path: Path, tiny_llama_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = server_settings(tmp_path / "data", tiny_llama_dir, server={"host": "0.0.0.0", "port": 8123})
    caplog.set_level(logging.INFO)
    with TestClient(create_app(settings, load_in_background=False)) as client:
        state = client.app.state.blendrag
        assert state.services.retriever.embedder._model is not None  # loaded before the first question
    steps = [r.getMessage() for r in caplog.records if r.name in ("app.build", "app.engine_loader", "app.state")]
    assert [re.sub(r"[\d.]+ s\b", "N s", m.split(" (")[0].split(" …")[0]) for m in steps] == [
        "start-up: catalog open",
        f"start-up: loading the model {tiny_llama_dir}",
        f"start-up: model loaded and its prompt prefix warmed in N s: {tiny_llama_dir.name}",
        "start-up: KV store open",
        "start-up: loading the embedder builtin",
        "start-up: embedder loaded and index of 0 chunks open in N s",
        "start-up: components ready in N s",
        "start-up: blend settings in force: safe settings",  # the tiny model has no calibration record
        "ready at http://127.0.0.1:8123",
    ]


def test_failed_start_up_is_reported(tmp_path: Path, tiny_llama_dir: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    settings = server_settings(tmp_path / "data", tiny_llama_dir, engine={"model": str(broken)})
    with TestClient(create_app(settings, load_in_background=False)) as client:
        assert client.get("/health").status_code == 200
        ready = client.get("/ready")
        assert ready.status_code == 503
        body = ready.json()
        assert body["status"] == "failed"
        assert body["error"]
        response = client.get("/documents")
        assert response.status_code == 503
        assert response.json() == {"detail": f"start-up failed: {body['error']}"}


def test_openapi_documents_every_route(client: TestClient) -> None:
    for path in ("/docs", "/redoc"):
        page = client.get(path)
        assert page.status_code == 200
        assert "/openapi.json" in page.text
        # Served from this app, never from a CDN: self-hosted servers are often offline.
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
        assert assets, path
        for asset in assets:
            assert asset.startswith("/"), asset
            assert client.get(asset).status_code == 200, asset
    spec = client.get("/openapi.json").json()
    assert set(spec["paths"]) == {
        "/health",
        "/ready",
        "/ingest",
        "/ingest/jobs",
        "/ingest/jobs/{job_id}",
        "/ingest/jobs/{job_id}/cancel",
        "/ingest/jobs/{job_id}/events",
        "/documents",
        "/documents/{document_id}",
        "/ask",
        "/conversations",
        "/conversations/{conversation_id}",
        "/v1/models",
        "/v1/chat/completions",
        "/metrics",
        "/api/coverage",
        "/api/stats",
        "/api/defaults",
        "/api/index",
        "/api/render",
        "/collections",
        "/collections/{name}",
        "/admin/keys",
        "/admin/keys/{key_id}",
        "/syncs",
        "/syncs/plan",
        "/syncs/remove",
        "/syncs/finish",
    }
    ask = spec["paths"]["/ask"]["post"]
    assert set(ask["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert ask["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/AskIn"}
    assert spec["components"]["schemas"]["AskIn"]["properties"]["mode"]["anyOf"][0]["enum"] == [
        "blend",
        "full",
        "prefix",
        "reuse",
    ]
    ingest = spec["paths"]["/ingest"]["post"]["requestBody"]["content"]
    assert set(ingest) == {"application/json", "multipart/form-data"}
    assert spec["paths"]["/documents/{document_id}"]["delete"]["responses"]["204"]


def test_ui_pages_and_assets_are_served(client: TestClient) -> None:
    for path, title in (("/", "blendrag · Ask"), ("/admin", "blendrag · Admin")):
        page = client.get(path)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert f"<title>{title}</title>" in page.text
        for asset in re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text):
            assert client.get(asset).status_code == 200, asset
    assert (
        client.get("/static/js/api.js")
        .headers["content-type"]
        .startswith(("text/javascript", "application/javascript"))
    )
    assert client.get("/static/nope.js").status_code == 404


def test_ui_loads_nothing_from_other_hosts() -> None:
    files = [p for p in STATIC_DIR.rglob("*") if p.suffix in (".html", ".js", ".css", ".svg")]
    assert {p.name for p in files} >= {
        "index.html",
        "admin.html",
        "app.css",
        "api.js",
        "chat.js",
        "admin.js",
        "chart.js",
    }
    for path in files:
        text = path.read_text(encoding="utf-8")
        # The only absolute URL allowed is the SVG namespace name (an identifier, never fetched).
        urls = set(re.findall(r"https?://[^\s\"')]+", text)) - {"http://www.w3.org/2000/svg"}
        assert urls == set(), path
