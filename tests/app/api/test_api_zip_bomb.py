"""A DOCX zip bomb uploaded to a running server fails fast with a clear error, and the job queued behind it
runs: one upload never stalls ingest for everyone."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from apitools import server_settings, wait_for_job
from docx_bomb import write_docx_bomb
from fastapi.testclient import TestClient

from app.main import create_app

MAX_UNPACKED = 8 * 1024 * 1024  # lowered from the default (100 MiB) so the test's bomb trips it fast


@pytest.fixture
def client(tmp_path: Path, tiny_llama_dir: Path) -> Iterator[TestClient]:
    settings = server_settings(
        tmp_path / "data",
        tiny_llama_dir,
        ingest={"max_file_bytes": 4 * 1024 * 1024, "max_unpacked_bytes": MAX_UNPACKED},
    )
    with TestClient(create_app(settings, load_in_background=False)) as c:
        yield c


def test_a_docx_zip_bomb_fails_with_its_size_and_the_next_job_runs(client: TestClient, tmp_path: Path) -> None:
    bomb = write_docx_bomb(tmp_path / "bomb.docx", 64 * 1024 * 1024)
    with zipfile.ZipFile(bomb) as package:
        num_unpacked = sum(info.file_size for info in package.infolist())
    docx_type = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    first = client.post("/ingest", files=[("files", ("bomb.docx", bomb.read_bytes(), docx_type))])
    second = client.post("/ingest", json={"documents": [{"title": "After", "text": "Queued behind the bomb."}]})
    assert (first.status_code, second.status_code) == (202, 202)
    bombed = wait_for_job(client, first.json()["job_id"])
    after = wait_for_job(client, second.json()["job_id"])
    message = f"DOCX unpacks to {num_unpacked} bytes; the limit is {MAX_UNPACKED} (ingest.max_unpacked_bytes)"
    assert (bombed["status"], bombed["errors"]) == (
        "failed",
        [{"source": "bomb.docx", "error": message, "code": "document_too_large"}],
    )
    assert (after["status"], after["errors"]) == ("succeeded", [])
