"""A real full disk (a small tmpfs, root only), what a client is told: a new conversation's turn that could
not be stored says so, a refused upload leaves no temp file, and storage reads ok again once writes succeed."""

from __future__ import annotations

import json
from pathlib import Path

from apitools import ingest_corpus, server_settings, wait_for_job
from disk_tools import fill_disk
from fastapi.testclient import TestClient

from app.main import create_app

NOT_STORED = (
    "this turn was not stored (the server's storage is full): conversation_id is null; ask again later, or send "
    "the earlier turns yourself"
)


def test_a_new_conversation_on_a_full_disk_says_its_turn_was_not_stored(small_fs: Path, tiny_llama_dir: Path) -> None:
    settings = server_settings(small_fs / "data", tiny_llama_dir)
    with TestClient(create_app(settings, load_in_background=False)) as client:
        ingest_corpus(client)
        filler = fill_disk(small_fs)
        try:
            asked = client.post(
                "/ask", json={"question": "Where is Quintaro?", "stream": False, "conversation_id": "new"}
            )
            assert asked.status_code == 200, asked.text
            assert (asked.json()["conversation_id"], asked.json()["notice"]) == (None, NOT_STORED)
            chat = client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "Where is Quintaro?"}], "conversation_id": "new"},
            )
            assert chat.status_code == 200, chat.text
            extras = chat.json()["blendrag"]
            assert (extras["conversation_id"], extras["notice"]) == (None, NOT_STORED)
            assert client.get("/ready").json()["storage"]["last_fault"].startswith("conversation turn not stored")
        finally:
            filler.unlink()


def test_a_multipart_upload_refused_on_a_full_disk_leaves_no_temp_file(small_fs: Path, tiny_llama_dir: Path) -> None:
    settings = server_settings(small_fs / "data", tiny_llama_dir)
    with TestClient(create_app(settings, load_in_background=False)) as client:
        filler = fill_disk(small_fs)
        try:
            body = ("A file that finds no room. " * 70).encode()  # under the write buffer: fails at close
            refused = client.post("/ingest", files=[("files", ("late.txt", body, "text/plain"))])
            assert refused.status_code == 507, refused.text
            assert [p for p in settings.uploads_dir.rglob("*") if p.is_file()] == []
        finally:
            filler.unlink()
        assert json.loads(client.get("/ingest/jobs").text)["jobs"] == []


def test_storage_reads_ok_again_once_writes_succeed(small_fs: Path, tiny_llama_dir: Path) -> None:
    settings = server_settings(small_fs / "data", tiny_llama_dir)
    with TestClient(create_app(settings, load_in_background=False)) as client:
        # The 48 MiB tmpfs is below the 64 MiB free the monitor wants; this test is about the fault alone.
        client.app.state.blendrag.storage._min_free_bytes = 1024 * 1024  # type: ignore[attr-defined]
        assert client.get("/ready").json()["storage"]["ok"] is True
        filler = fill_disk(small_fs)
        late = client.post("/ingest", json={"documents": [{"title": "late", "text": "Text that finds no room."}]})
        if late.status_code == 202:  # the catalog found room in its log: the job fails on the KV or index write
            assert wait_for_job(client, late.json()["job_id"])["status"] == "failed"
        else:
            assert late.status_code == 507
        filler.unlink()
        assert client.get("/ready").json()["storage"]["ok"] is False  # nothing was written since the fault
        accepted = client.post("/ingest", json={"documents": [{"title": "later", "text": "Text that has room now."}]})
        assert wait_for_job(client, accepted.json()["job_id"])["status"] == "succeeded"
        storage = client.get("/ready").json()["storage"]
        assert storage["ok"] is True and storage["last_fault"] is not None  # ok again; what happened stays shown
