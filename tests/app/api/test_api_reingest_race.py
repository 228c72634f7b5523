"""A re-ingest of a source while the previous ingest of it still runs: the newer version wins.

Job 1 is held inside its chunk stage (an event, not a sleep) while job 2, a new version of the same source,
is submitted behind it; then job 1 goes on. Both jobs end without an internal error, and the source's only
document afterwards is the newer version, ready."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apitools import server_settings, wait_for_job
from fastapi.testclient import TestClient

from app.main import create_app
from app.services.ingest import stages

LONG_V1 = " ".join(f"Handbook version one, paragraph {i}: the office opens at nine." for i in range(40))
SHORT_V2 = "Handbook version two: the office opens at ten."


@pytest.fixture
def client(tmp_path: Path, tiny_llama_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(server_settings(tmp_path / "data", tiny_llama_dir), load_in_background=False)) as c:
        yield c


class HeldChunkStage:
    """The real chunk stage, held at its start for the first job that enters it until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self._real = stages.chunk
        self._held = False

    def __call__(self, ctx: Any) -> None:
        if not self._held:
            self._held = True
            self.entered.set()
            assert self.release.wait(timeout=60)
        self._real(ctx)


def reingest_while_the_first_runs(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, post_v1: Any, post_v2: Any
) -> tuple[dict[str, Any], dict[str, Any], str]:
    held = HeldChunkStage()
    monkeypatch.setattr(stages, "chunk", held)
    first = post_v1()
    assert first.status_code == 202, first.text
    assert held.entered.wait(timeout=60)
    second = post_v2()
    assert second.status_code == 202, second.text
    held.release.set()
    job_1 = wait_for_job(client, first.json()["job_id"])
    job_2 = wait_for_job(client, second.json()["job_id"])
    return job_1, job_2, second.json()["document_ids"][0]


def documents_of(client: TestClient, source: str) -> list[dict[str, Any]]:
    page = client.get("/documents", params={"limit": 100}).json()
    return [d for d in page["documents"] if d["source"] == source]


def test_a_json_reingest_during_the_first_ingest_keeps_the_newer_version(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def post(title: str, text: str) -> Any:
        return client.post("/ingest", json={"documents": [{"title": title, "text": text, "source": "h.md"}]})

    job_1, job_2, v2_id = reingest_while_the_first_runs(
        client, monkeypatch, lambda: post("Handbook v1", LONG_V1), lambda: post("Handbook v2", SHORT_V2)
    )
    assert (job_1["status"], job_1["errors"]) == ("succeeded", [])
    assert (job_2["status"], job_2["errors"]) == ("succeeded", [])
    assert [(d["id"], d["title"], d["status"]) for d in documents_of(client, "h.md")] == [
        (v2_id, "Handbook v2", "ready")
    ]


def test_a_multipart_reingest_during_the_first_ingest_keeps_the_newer_version(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def upload(text: str) -> Any:
        return client.post("/ingest", files=[("files", ("guide.md", text.encode(), "text/markdown"))])

    job_1, job_2, v2_id = reingest_while_the_first_runs(
        client, monkeypatch, lambda: upload(f"# Guide v1\n\n{LONG_V1}\n"), lambda: upload(f"# Guide v2\n\n{SHORT_V2}\n")
    )
    assert (job_1["status"], job_1["errors"]) == ("succeeded", [])
    assert (job_2["status"], job_2["errors"]) == ("succeeded", [])
    assert [(d["id"], d["title"], d["status"]) for d in documents_of(client, "guide.md")] == [
        (v2_id, "Guide v2", "ready")
    ]
    chunks = client.get(f"/documents/{v2_id}").json()
    assert "version two" in str(chunks)
