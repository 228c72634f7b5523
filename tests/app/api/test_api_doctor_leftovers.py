"""`blendrag doctor` reports, and `--repair` removes, what nothing refers to any more: uploads of finished
jobs (every duplicate upload left its copy) and KV entries no chunk uses."""

from __future__ import annotations

from pathlib import Path

from apitools import server_settings, wait_for_job
from fastapi.testclient import TestClient

from app.build import build_services
from app.main import create_app
from app.services.doctor import run_doctor


def test_doctor_finds_and_repair_removes_unreferenced_uploads_and_kv(tmp_path: Path, tiny_llama_dir: Path) -> None:
    settings = server_settings(tmp_path / "data", tiny_llama_dir)
    note = b"Lighthouses of Zorblat shine purple at night."
    with TestClient(create_app(settings, load_in_background=False)) as client:
        document_ids = set()
        for _ in range(3):  # the same file three times: one document, three stored copies
            accepted = client.post("/ingest", files=[("files", ("note.txt", note))]).json()
            wait_for_job(client, accepted["job_id"])
            document_ids.update(accepted["document_ids"])
        assert len(document_ids) == 1
        gone = client.post("/ingest", json={"documents": [{"title": "Gone", "text": "Soon an orphan entry."}]}).json()
        assert wait_for_job(client, gone["job_id"])["status"] == "succeeded"
        services = client.app.state.blendrag.services  # type: ignore[attr-defined]
        # the row goes without its KV entry (what a crash between the two used to leave)
        services.catalog.delete_document(gone["document_ids"][0])
        num_kv_before = len(services.store.keys())
    # A finished job's uploads are removed when it ends (duplicates' files at once): nothing is left over.
    assert [p for p in settings.uploads_dir.rglob("*")] == []
    # What a crash between storing an upload and queueing its job could leave: doctor finds it.
    stray = settings.uploads_dir / "batch" / "0" / "note.txt"
    stray.parent.mkdir(parents=True)
    for n in range(3):
        stray.with_name(f"note{n}.txt").write_bytes(note)

    def doctor(repair: bool):
        services = build_services(settings, {"doctor", "ingest"})
        try:
            return run_doctor(services.doctor_parts(), repair=repair), len(services.store.keys())
        finally:
            services.close()

    report, _ = doctor(repair=False)
    assert len(report.unreferenced_upload_paths) == 3
    assert report.num_unreferenced_upload_bytes == 3 * len(note)
    assert report.num_unreferenced_kv_entries == 1
    assert report.problems == 0  # leftovers are not inconsistencies (doctor exits 0)
    # the deleted row's index entry was dropped when the index was opened against the catalog
    assert report.index_repair_note == "the index disagreed with the catalog: 0 chunks added, 1 removed"
    repaired, num_kv_after = doctor(repair=True)
    assert num_kv_after == num_kv_before - 1
    assert [p for p in settings.uploads_dir.rglob("*")] == []
    clean, _ = doctor(repair=False)
    assert (clean.unreferenced_upload_paths, clean.num_unreferenced_kv_entries, clean.problems) == ([], 0, 0)


def test_uploads_are_removed_when_their_job_ends(tmp_path: Path, tiny_llama_dir: Path) -> None:
    settings = server_settings(tmp_path / "data", tiny_llama_dir)
    with TestClient(create_app(settings, load_in_background=False)) as client:
        files = [("files", ("a.txt", b"Kites of Zorblat fly in May.")), ("files", ("bad.txt", b"\x00\x01\x02"))]
        succeeded = client.post("/ingest", files=files).json()
        assert wait_for_job(client, succeeded["job_id"])["status"] == "succeeded"
        assert [p for p in settings.uploads_dir.rglob("*")] == []  # the failed file's upload went too
        again = client.post("/ingest", files=[("files", ("a.txt", b"Kites of Zorblat fly in May."))]).json()
        assert again["document_ids"] == succeeded["document_ids"][:1]  # a duplicate: answered at submit
        assert [p for p in settings.uploads_dir.rglob("*")] == []
        services = client.app.state.blendrag.services  # type: ignore[attr-defined]
        assert run_doctor(services.doctor_parts(), repair=False).unreferenced_upload_paths == []
