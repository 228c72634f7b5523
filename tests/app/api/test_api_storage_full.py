"""A full disk or database: 507 with a message, no job left `running`, KV write failures on the job,
and the fault shown by /ready and the admin stats."""

from __future__ import annotations

import errno
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apitools import server_settings, wait_for_job
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from app.catalog.records import JobUpdate
from app.main import create_app
from app.services.storage_faults import is_storage_full


def _sqlite_full() -> OperationalError:
    return OperationalError("INSERT INTO documents …", {}, sqlite3.OperationalError("database or disk is full"))


def test_is_storage_full() -> None:
    assert is_storage_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_storage_full(_sqlite_full())
    wrapped = RuntimeError("commit failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert is_storage_full(wrapped)
    assert not is_storage_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_storage_full(ValueError("database is locked"))


@pytest.fixture
def http(tmp_path: Path, tiny_llama_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(server_settings(tmp_path / "data", tiny_llama_dir), load_in_background=False)) as c:
        yield c


def _services(http: TestClient) -> Any:
    return http.app.state.blendrag.services  # type: ignore[attr-defined]


def test_full_database_is_507_and_shows_in_ready(http: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = _services(http).catalog

    def full(*args: Any, **kwargs: Any) -> Any:
        raise _sqlite_full()

    monkeypatch.setattr(catalog, "create_job", full)
    response = http.post("/ingest", json={"documents": [{"title": "t", "text": "Some text."}]})
    assert response.status_code == 507
    assert response.json()["detail"].startswith("insufficient storage: the disk or the catalog database is full")
    monkeypatch.setattr(catalog, "delete_document", full)
    assert http.delete("/documents/whatever").status_code == 507
    storage = http.get("/ready").json()["storage"]
    assert http.get("/ready").status_code == 200  # questions are still answered
    assert storage["ok"] is False and "database or disk is full" in storage["last_fault"]
    assert http.get("/api/stats").json()["storage"]["ok"] is False


def test_kv_write_failure_fails_the_document_not_succeeded(http: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvcache.disk_tier

    def no_space(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kvcache.disk_tier, "write_bytes_atomic", no_space)
    accepted = http.post("/ingest", json={"documents": [{"title": "t", "text": "Kites fly in May over Quintaro."}]})
    assert accepted.status_code == 202
    job = wait_for_job(http, accepted.json()["job_id"])
    assert job["status"] == "failed"
    [error] = job["errors"]
    assert error["code"] == "kv_write_failed"
    assert error["error"] == (
        "the KV of 1 of 1 chunks could not be written to the KV store (disk full or "
        "unwritable; see /ready and the logs)"
    )
    doc = http.get(f"/documents/{job['document_ids'][0]}").json()
    assert doc["status"] == "failed" and doc["num_chunks"] == 0
    assert http.get("/ready").json()["storage"]["last_fault"] == "KV write failed for 1 chunk(s)"


def test_job_whose_failure_cannot_be_written_is_never_left_running(
    http: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.services.ingest.worker as ingest_worker

    services = _services(http)
    catalog, retriever = services.catalog, services.retriever
    real_update = catalog.update_job

    def embed_full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    def update_refusing_failed(job_id: str, change: JobUpdate) -> Any:
        if change.status is not None and change.status.value == "failed":
            raise _sqlite_full()
        return real_update(job_id, change)

    monkeypatch.setattr(ingest_worker, "UNSETTLED_RETRY_S", 0.2)
    monkeypatch.setattr(retriever, "embed_chunks", embed_full)
    monkeypatch.setattr(catalog, "update_job", update_refusing_failed)
    accepted = http.post("/ingest", json={"documents": [{"title": "t", "text": "Rivers of Zorblat are purple."}]})
    job = wait_for_job(http, accepted.json()["job_id"])
    assert job["status"] == "failed"  # reported failed although the catalog still says running
    assert job["errors"][-1]["code"] == "storage"
    listed = {j["job_id"]: j for j in http.get("/ingest/jobs").json()["jobs"]}[job["job_id"]]
    assert (listed["status"], listed["stage"], listed["errors"]) == ("failed", None, job["errors"])  # one answer
    assert catalog.get_job(job["job_id"]).status.value == "running"

    monkeypatch.setattr(catalog, "update_job", real_update)  # space freed: the worker writes it down
    deadline = time.monotonic() + 10
    while catalog.get_job(job["job_id"]).status.value != "failed":
        assert time.monotonic() < deadline, "the failed job was never written down"
        time.sleep(0.05)
    assert catalog.get_document(job["document_ids"][0]).status.value == "failed"


def test_failure_is_written_with_the_reserve_so_a_restart_cannot_rerun_the_job(
    http: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client is told `failed`; the catalog must say so too, or a restart would run the job again."""
    services = _services(http)
    catalog, retriever = services.catalog, services.retriever
    storage = http.app.state.blendrag.storage  # type: ignore[attr-defined]
    assert storage.reserve_path.is_file()
    real_update = catalog.update_job

    def embed_full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    def update_while_full(job_id: str, change: JobUpdate) -> Any:
        if storage.reserve_path.exists() and getattr(change.status, "value", None) == "failed":
            raise _sqlite_full()  # the disk is full until the reserve is given up
        return real_update(job_id, change)

    monkeypatch.setattr(retriever, "embed_chunks", embed_full)
    monkeypatch.setattr(catalog, "update_job", update_while_full)
    accepted = http.post("/ingest", json={"documents": [{"title": "t", "text": "Moons of Zorblat are green."}]})
    job = wait_for_job(http, accepted.json()["job_id"])
    assert job["status"] == "failed" and job["errors"][-1]["code"] == "storage_full"
    assert catalog.get_job(job["job_id"]).status.value == "failed"  # written down, not only reported
    assert not storage.reserve_path.exists()
    assert http.app.state.blendrag.services.ingest.recover() == []  # type: ignore[attr-defined]
