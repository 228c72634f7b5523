"""Content never bricks a data dir: a document quoting line separators (U+2028, U+2029, U+0085) survives a
restart, a snapshot that cannot be read is rebuilt from the catalog, an index moved aside is refilled
before /ready says 200, doctor reports, and the CLI's stream reader reads such an answer whole."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from apitools import LiveServer, server_settings, wait_for_job
from fastapi.testclient import TestClient

from app.build import build_services
from app.main import create_app
from app.remote import RemoteServer
from app.settings import Settings

HOSTILE_DOC = {
    "title": "Q3\u2028report",
    "tags": ["fin\u2029ance"],
    "text": "Revenue grew by four percent.\x85Costs fell\u2028by two.",
}


def _ingest(client: TestClient, docs: list[dict]) -> list[str]:
    accepted = client.post("/ingest", json={"documents": docs})
    assert accepted.status_code == 202, accepted.text
    assert wait_for_job(client, accepted.json()["job_id"])["status"] == "succeeded"
    return accepted.json()["document_ids"]


def _start(settings: Settings) -> TestClient:
    return TestClient(create_app(settings, load_in_background=False))


def _ask_titles(client: TestClient) -> list[str]:
    body = client.post("/ask", json={"question": "How much did revenue grow?", "stream": False, "max_tokens": 2})
    assert body.status_code == 200, body.text
    return [s["title"] for s in body.json()["sources"]]


def _write_format_1_snapshot(index_dir: Path) -> None:
    """What the server wrote before the fix: raw separators in the JSON, manifest format 1."""
    manifest = json.loads((index_dir / "MANIFEST.json").read_text())
    chunks_file = index_dir / manifest["files"]["chunks"]
    records = [json.loads(line) for line in chunks_file.read_bytes().split(b"\n") if line.strip()]
    chunks_file.write_bytes("\n".join(json.dumps(r, ensure_ascii=False) for r in records).encode())
    (index_dir / "MANIFEST.json").write_text(json.dumps({**manifest, "format": 1}))
    assert len(chunks_file.read_text().splitlines()) > len(records)  # what broke the old reader


def test_separator_in_title_tags_text_survives_restarts(tmp_path: Path, tiny_llama_dir: Path) -> None:
    settings = server_settings(tmp_path / "data", tiny_llama_dir)
    with _start(settings) as client:
        [doc_id] = _ingest(client, [HOSTILE_DOC])
        num_chunks = client.get("/api/index").json()["chunks"]
        assert num_chunks >= 1
    with _start(settings) as client:  # plain restart
        assert client.get("/ready").status_code == 200, client.get("/ready").text
        assert _ask_titles(client) == ["Q3\u2028report"] * num_chunks
    _write_format_1_snapshot(settings.index_dir)
    with _start(settings) as client:  # a data dir written by the old version starts again
        assert client.get("/ready").status_code == 200, client.get("/ready").text
        assert client.get("/api/index").json()["chunks"] == num_chunks
        assert client.get(f"/documents/{doc_id}").json()["tags"] == ["fin\u2029ance"]


def test_unreadable_snapshot_is_rebuilt_and_moved_index_refilled(tmp_path: Path, tiny_llama_dir: Path) -> None:
    from app.services.doctor import run_doctor

    settings = server_settings(tmp_path / "data", tiny_llama_dir)
    with _start(settings) as client:
        _ingest(client, [HOSTILE_DOC, {"title": "Other", "text": "Bread needs flour and water."}])
        num_chunks = client.get("/api/index").json()["chunks"]
    manifest = json.loads((settings.index_dir / "MANIFEST.json").read_text())
    (settings.index_dir / manifest["files"]["chunks"]).write_bytes(
        b'{"chunk_id": 1, "text": "Unterminated \xe2\x80\xa8'
    )
    with _start(settings) as client:
        assert client.get("/ready").status_code == 200, client.get("/ready").text
        assert client.get("/api/index").json()["chunks"] == num_chunks
        assert "Q3\u2028report" in _ask_titles(client)
    # Moving index/ aside used to give a "ready" server with 0 chunks that answered without context.
    (settings.index_dir).rename(tmp_path / "index-aside")
    with _start(settings) as client:
        assert client.get("/api/index").json()["chunks"] == num_chunks
        assert "Q3\u2028report" in _ask_titles(client)
    # doctor on a broken snapshot reports what it fixed instead of crashing
    (settings.index_dir / "MANIFEST.json").write_text("{not json")
    services = build_services(settings, {"doctor", "ingest"})
    try:
        report = run_doctor(services.doctor_parts(), repair=False)
    finally:
        services.close()
    assert report.index_repair_note is not None and "rebuilt from the catalog" in report.index_repair_note
    assert (report.num_chunks, report.problems) == (num_chunks, 0)


def test_cli_stream_reader_reads_an_answer_quoting_separators(tmp_path: Path, tiny_llama_dir: Path) -> None:
    settings = server_settings(tmp_path / "data", tiny_llama_dir)
    app = create_app(settings, load_in_background=False)
    with LiveServer(app) as live, httpx.Client(base_url=live.url) as http:
        accepted = http.post("/ingest", json={"documents": [HOSTILE_DOC]}).json()
        assert wait_for_job(http, accepted["job_id"])["status"] == "succeeded"
        with RemoteServer(live.url) as remote:
            events = list(remote.ask({"question": "How much did revenue grow?", "max_tokens": 2}))
    names = [name for name, _ in events]
    assert names[0] == "sources" and names[-1] == "done"
    assert events[0][1]["sources"][0]["title"] == "Q3\u2028report"  # ingest keeps titles as given
