"""A real full disk (a small tmpfs, so root only): deleting frees space instead of answering 507, job
status reads the same everywhere, a failed job stays failed, and shutdown releases the data-dir lock even
when the index cannot be saved."""

from __future__ import annotations

import os
from pathlib import Path

from apitools import server_settings, wait_for_job
from disk_tools import fill_disk
from fastapi.testclient import TestClient

from app.datadir_lock import DataDirLock
from app.main import create_app
from app.services.storage_faults import RESERVE_FILE


def test_full_disk_deletes_and_keeps_outcomes(small_fs: Path, tiny_llama_dir: Path) -> None:
    data_dir = small_fs / "data"
    settings = server_settings(data_dir, tiny_llama_dir)
    docs = [{"title": f"Doc {n}", "text": f"Paragraph {n} about the rivers of Zorblat and kites."} for n in range(3)]
    with TestClient(create_app(settings, load_in_background=False)) as client:
        assert (data_dir / RESERVE_FILE).stat().st_size > 0  # set aside while there is room
        accepted = client.post("/ingest", json={"documents": docs}).json()
        assert wait_for_job(client, accepted["job_id"])["status"] == "succeeded"
        first, deleted, _ = accepted["document_ids"]
        filler = fill_disk(small_fs)
        late = client.post("/ingest", json={"documents": [{"title": "late", "text": "Text that finds no room."}]})
        if late.status_code == 202:  # the catalog found room in its log: the job fails on the KV or index write
            failed_job = wait_for_job(client, late.json()["job_id"])
            assert failed_job["status"] == "failed", failed_job
            listed = {j["job_id"]: j for j in client.get("/ingest/jobs").json()["jobs"]}[failed_job["job_id"]]
            assert listed["status"] == "failed"
        else:
            assert late.status_code == 507
            failed_job = None

        # deletion works on the full disk: it is how space is freed
        assert client.delete(f"/documents/{deleted}").status_code == 204
        purged = client.delete("/documents", params={"status": "failed"})
        assert purged.status_code == 200, purged.text
        assert client.get(f"/documents/{deleted}").status_code == 404
        assert client.get("/documents", params={"status": "failed"}).json()["total"] == 0

        filler.unlink()  # space returns: the failed job is not run again, and ingest works
        if failed_job is not None:
            assert client.get(f"/ingest/jobs/{failed_job['job_id']}").json()["status"] == "failed"
        again = client.post("/ingest", json={"documents": [{"title": "after", "text": "Room again for text."}]})
        assert wait_for_job(client, again.json()["job_id"])["status"] == "succeeded"

        # shutdown on a full disk with an unsaved index: the lock is released all the same
        filler = fill_disk(small_fs)
        assert client.delete(f"/documents/{first}").status_code == 204
    lock = DataDirLock(data_dir)
    assert lock.acquire("test").pid == os.getpid()
    lock.release()
    filler.unlink()
    with TestClient(create_app(settings, load_in_background=False)) as client:  # and the dir starts again
        assert client.get("/ready").status_code == 200
        assert client.get(f"/documents/{first}").status_code == 404
        assert sorted(d["title"] for d in client.get("/documents").json()["documents"]) == ["Doc 2", "after"]
        assert client.get("/api/index").json()["chunks"] == 2  # the unsaved deletion did not come back
