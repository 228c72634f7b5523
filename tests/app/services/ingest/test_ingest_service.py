"""IngestService on the fast stack (tiny random Llama, hash embedder) with real FAISS, SQLite and disk KV."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from app.build import Services, build_services, new_ingest, new_scheduler
from app.catalog import DocumentStatus, JobStatus
from app.catalog.records import JobUpdate
from app.services.doctor import run_doctor
from app.services.ingest import IngestError, IngestService, IngestSource

TEXT_A = "Quintaro is the capital of Zorblat. It has purple rivers.\n\nThe kite festival is in May."
TEXT_B = "Sourdough needs flour, water, salt and a starter. Bake it at 250 degrees."


def text(title: str, body: str, source: str | None = None, tags: list[str] | None = None) -> IngestSource:
    return IngestSource(kind="text", title=title, text=body, source_path=source, tags=tags or [])


def run(service: IngestService, sources: list[IngestSource]):
    submitted = service.submit(sources, enqueue=False)
    return submitted, service.run_job(submitted.job_id)


def test_text_documents_become_ready_with_index_and_kv(services: Services) -> None:
    service = new_ingest(services)
    submitted, job = run(service, [text("A", TEXT_A), text("B", TEXT_B)])
    assert job.status == JobStatus.SUCCEEDED
    assert job.errors == []
    assert {k: v["done"] == v["total"] for k, v in job.progress.items()} == {
        "parse": True,
        "chunk": True,
        "embed": True,
        "kv": True,
        "commit": True,
    }
    for doc_id in submitted.document_ids:
        doc = services.catalog.get_document(doc_id)
        assert doc.status == DocumentStatus.READY
        chunks = services.catalog.chunks_of(doc_id)
        assert len(chunks) == doc.num_chunks >= 1
        for c in chunks:
            assert c.kv_key == services.kv_space.key(c.token_ids)
            assert services.store.contains(c.kv_key) is not None
    assert set(services.retriever.chunk_ids()) == {c.id for c in services.catalog.iter_chunks()}
    report = run_doctor(services.doctor_parts(), repair=False)
    assert report.problems == 0
    # the kv stage reports what it added to the store: every entry's bytes as stored, and their tokens
    chunks = list(services.catalog.iter_chunks())
    store = services.store
    located = store.locate_many([c.kv_key for c in chunks if c.kv_key])
    assert job.progress["kv"]["bytes"] == sum(loc.num_bytes_by_tier["disk"] for loc in located.values())
    assert job.progress["kv"]["tokens"] == sum(len(c.token_ids) for c in chunks)
    _, again = run(service, [text("A2", TEXT_A + " More.")])
    assert again.progress["kv"]["bytes"] > 0  # only the new chunks count; stored ones cost nothing


def test_duplicate_content_is_reported_and_not_stored_twice(services: Services) -> None:
    service = new_ingest(services)
    first, _ = run(service, [text("A", TEXT_A)])
    second, job = run(service, [text("A again", TEXT_A), text("B", TEXT_B)])
    assert job.status == JobStatus.SUCCEEDED
    # The duplicate's id is the stored document's: it resolves, and nothing is stored twice.
    assert second.document_ids[0] == first.document_ids[0]
    assert job.duplicate_ids == [first.document_ids[0]]
    assert [e["code"] for e in job.errors] == ["duplicate"]
    assert job.errors[0]["document_id"] == first.document_ids[0]
    assert services.catalog.get_document(second.document_ids[0]).status == DocumentStatus.READY
    _, total = services.catalog.list_documents()
    assert total == 2


def test_a_duplicate_file_answers_with_the_stored_documents_id(services: Services, tmp_path: Path) -> None:
    service = new_ingest(services)
    for name in ("notes.md", "copy-of-notes.md", "other.md"):
        (tmp_path / name).write_text("# Notes\n\n" + (TEXT_B if name == "other.md" else TEXT_A))

    def file(name: str) -> IngestSource:
        return IngestSource(kind="file", title=name, path=str(tmp_path / name), source_path=f"upload:{name}")

    first, job = run(service, [file("notes.md")])
    assert job.status == JobStatus.SUCCEEDED
    stored = services.catalog.get_document(first.document_ids[0])
    assert stored.metadata["file_sha256"] == hashlib.sha256((tmp_path / "notes.md").read_bytes()).hexdigest()
    # Same bytes again (under another name), twice in one request, next to a new file.
    second, job = run(service, [file("copy-of-notes.md"), file("other.md"), file("copy-of-notes.md")])
    assert second.document_ids[0] == second.document_ids[2] == first.document_ids[0]
    assert job.status == JobStatus.SUCCEEDED and job.duplicate_ids == [first.document_ids[0]] * 2
    assert services.catalog.get_document(second.document_ids[1]).status == DocumentStatus.READY
    _, total = services.catalog.list_documents()
    assert total == 2
    # Only duplicates: nothing to do, nothing failed.
    third, job = run(service, [file("notes.md")])
    assert (third.document_ids, job.status, job.document_ids) == (first.document_ids, JobStatus.SUCCEEDED, [])


def test_reingest_of_changed_source_replaces_chunks_index_and_kv(services: Services) -> None:
    service = new_ingest(services)
    old, _ = run(service, [text("notes", TEXT_A, source="/docs/notes.md")])
    old_chunks = services.catalog.chunks_of(old.document_ids[0])
    new, job = run(service, [text("notes", TEXT_B, source="/docs/notes.md")])
    assert job.status == JobStatus.SUCCEEDED
    assert services.catalog.get_document(old.document_ids[0]) is None
    assert services.catalog.get_document(new.document_ids[0]).status == DocumentStatus.READY
    indexed = set(services.retriever.chunk_ids())
    assert indexed.isdisjoint({c.id for c in old_chunks})
    for c in old_chunks:
        assert services.store.contains(c.kv_key) is None


def test_delete_is_complete_idempotent_and_keeps_shared_kv(services: Services) -> None:
    service = new_ingest(services)
    a, _ = run(service, [text("A", TEXT_A)])
    b, _ = run(service, [text("B", TEXT_B + "\n\n" + TEXT_A)])  # shares no whole chunk with A
    a_chunks = services.catalog.chunks_of(a.document_ids[0])
    assert service.delete_document(a.document_ids[0]) is True
    assert service.delete_document(a.document_ids[0]) is False
    assert set(services.retriever.chunk_ids()).isdisjoint({c.id for c in a_chunks})
    b_keys = {c.kv_key for c in services.catalog.chunks_of(b.document_ids[0])}
    for c in a_chunks:
        assert (services.store.contains(c.kv_key) is not None) == (c.kv_key in b_keys)
    assert run_doctor(services.doctor_parts(), repair=False).problems == 0


def test_bad_file_is_a_per_file_error_and_the_rest_goes_on(services: Services, tmp_path: Path) -> None:
    good = tmp_path / "good.md"
    good.write_text("# Title\n\n" + TEXT_A)
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    weird = tmp_path / "data.xyz"
    weird.write_bytes(b"\x00\x01")
    service = new_ingest(services)
    sources = [IngestSource(kind="file", title=p.name, path=str(p), source_path=str(p)) for p in (good, empty, weird)]
    submitted, job = run(service, sources)
    assert job.status == JobStatus.SUCCEEDED
    assert sorted(e["code"] for e in job.errors) == ["empty_document", "unsupported_format"]
    statuses = [services.catalog.get_document(d).status for d in submitted.document_ids]
    assert statuses == [DocumentStatus.READY, DocumentStatus.FAILED, DocumentStatus.FAILED]
    # a failed document can be deleted like any other
    assert service.delete_document(submitted.document_ids[1]) is True


def test_nothing_to_ingest_is_rejected(services: Services) -> None:
    service = new_ingest(services)
    with pytest.raises(IngestError):
        service.submit([])
    with pytest.raises(IngestError):
        service.submit([text("blank", "   ")])


def test_cancel_before_start_fails_its_documents(services: Services) -> None:
    service = new_ingest(services)
    submitted = service.submit([text("A", TEXT_A)], enqueue=False)
    job = service.cancel(submitted.job_id)
    assert job.status == JobStatus.CANCELLED
    assert service.run_job(submitted.job_id).status == JobStatus.CANCELLED
    doc = services.catalog.get_document(submitted.document_ids[0])
    assert (doc.status, doc.error) == (DocumentStatus.FAILED, "ingest cancelled")


def test_cancel_mid_job_leaves_nothing_half_visible(services: Services) -> None:
    service = new_ingest(services)
    submitted = service.submit([text("A", TEXT_A), text("B", TEXT_B)], enqueue=False)

    def cancel_during_kv(job) -> None:
        if job.stage == "kv":
            services.catalog.update_job(job.id, JobUpdate(cancel_requested=True))

    job = service.run_job(submitted.job_id, on_progress=cancel_during_kv)
    assert job.status == JobStatus.CANCELLED
    assert set(services.retriever.chunk_ids()) == set()
    assert all(services.catalog.get_document(d).status == DocumentStatus.FAILED for d in submitted.document_ids)
    assert run_doctor(services.doctor_parts(), repair=False).problems == 0


def test_crash_mid_commit_is_recovered_on_restart(services: Services, make_fast_services) -> None:
    """Simulate a process that died after writing chunks + index entries but before flipping to ready."""
    from app.catalog.records import NewChunk

    service = new_ingest(services)
    submitted = service.submit([text("A", TEXT_A)], enqueue=False)
    doc_id = submitted.document_ids[0]
    services.catalog.update_job(submitted.job_id, JobUpdate(status=JobStatus.RUNNING, stage="commit"))
    ids = services.catalog.replace_chunks(doc_id, [NewChunk(0, "half", [1, 2, 3], None, 0, 4, None)])
    from retrieval.types import IndexedChunk

    services.retriever.add([IndexedChunk(chunk_id=ids[0], document_id=doc_id, text="half")])
    services.retriever.save()
    # (the "crashed" process is simply abandoned; a second set of services opens the same data dir)

    restarted = make_fast_services(services.settings)
    try:
        # Opening the index checks it against the catalog (app/index_sync.py): the entry of the uncommitted
        # chunk is gone before anything reads it, and doctor says what the start-up fixed.
        before = run_doctor(restarted.doctor_parts(), repair=False)
        assert before.orphan_index_ids == []
        assert before.index_repair_note == "the index disagreed with the catalog: 0 chunks added, 1 removed"
        fresh = new_ingest(restarted)
        assert fresh.recover() == [submitted.job_id]
        assert ids[0] not in set(restarted.retriever.chunk_ids())
        job = fresh.run_job(submitted.job_id)
        assert job.status == JobStatus.SUCCEEDED
        assert restarted.catalog.get_document(doc_id).status == DocumentStatus.READY
        assert run_doctor(restarted.doctor_parts(), repair=False).problems == 0
    finally:
        restarted.close()


def _upload(services: Services, name: str, body: str) -> IngestSource:
    path = services.settings.uploads_dir / "batch" / "0" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    return IngestSource(kind="file", title=name, path=str(path), source_path=f"upload:{name}")


def test_whoever_sees_a_job_finished_sees_its_uploads_gone(services: Services, monkeypatch) -> None:
    """The uploads go before the final status is written, not after: a client polling the job (or a
    test) that sees it finished must not find the files still there or half-removed."""
    catalog, seen = services.catalog, []
    real_update = catalog.update_job

    def watching_update(job_id: str, update: JobUpdate):
        if update.status is not None and update.status.finished:
            seen.append((update.status, sorted(p.name for p in services.settings.uploads_dir.rglob("*"))))
        return real_update(job_id, update)

    monkeypatch.setattr(catalog, "update_job", watching_update)
    service = new_ingest(services)
    _, job = run(service, [_upload(services, "a.txt", TEXT_A)])
    _, failed = run(service, [_upload(services, "empty.txt", "")])
    assert (job.status, failed.status) == (JobStatus.SUCCEEDED, JobStatus.FAILED)
    assert seen == [(JobStatus.SUCCEEDED, []), (JobStatus.FAILED, [])]


def test_a_job_stopped_after_its_commit_is_settled_on_restart_not_run_again(
    services: Services, make_fast_services
) -> None:
    """The process died after the commit and the upload's removal but before the job's status was
    written: re-running it would parse a file that is gone and fail a document that is READY."""
    service = new_ingest(services)
    old, _ = run(service, [_upload(services, "a.txt", TEXT_B)])
    submitted, job = run(service, [_upload(services, "a.txt", TEXT_A)])
    doc_id = submitted.document_ids[0]
    assert services.catalog.get_document(old.document_ids[0]) is None  # the new version replaced the old
    services.catalog.update_job(submitted.job_id, JobUpdate(status=JobStatus.RUNNING, stage="commit"))
    assert [p for p in services.settings.uploads_dir.rglob("*") if p.is_file()] == []

    restarted = make_fast_services(services.settings)
    try:
        fresh = new_ingest(restarted)
        assert fresh.recover() == []
        settled = restarted.catalog.get_job(submitted.job_id)
        assert (settled.status, settled.errors, settled.stage) == (JobStatus.SUCCEEDED, job.errors, None)
        assert restarted.catalog.get_document(doc_id).status == DocumentStatus.READY
        assert run_doctor(restarted.doctor_parts(), repair=False).problems == 0
    finally:
        restarted.close()


def test_a_job_whose_documents_all_failed_before_it_stopped_is_settled_failed(
    services: Services, make_fast_services
) -> None:
    service = new_ingest(services)
    submitted = service.submit([text("A", TEXT_A)], enqueue=False)
    doc_id = submitted.document_ids[0]
    services.catalog.update_job(submitted.job_id, JobUpdate(status=JobStatus.RUNNING, stage="kv"))
    services.catalog.set_document_status(doc_id, DocumentStatus.FAILED, error="disk full")

    restarted = make_fast_services(services.settings)
    try:
        assert new_ingest(restarted).recover() == []
        settled = restarted.catalog.get_job(submitted.job_id)
        assert settled.status == JobStatus.FAILED
        assert [(e["source"], e["error"], e["code"]) for e in settled.errors] == [("A", "disk full", "failed")]
    finally:
        restarted.close()


def test_delete_during_ingest_keeps_kv_entries_the_running_job_shares(make_fast_settings, make_fast_services) -> None:
    settings = make_fast_settings(ingest={"chunk_tokens": 32, "chunk_overlap": 0})  # one chunk per paragraph
    services = make_fast_services(settings)
    try:
        service = new_ingest(services)
        shared = "Quintaro is the capital of Zorblat."
        old, _ = run(service, [text("old", shared + "\n\nThe kite festival is in May.")])
        old_keys = {c.kv_key for c in services.catalog.chunks_of(old.document_ids[0])}
        new = service.submit([text("new", shared + "\n\nSourdough needs a starter.")], enqueue=False)

        def delete_old_during_kv(job) -> None:
            # after the shared chunk was found already stored (so skipped), before the commit
            if (
                job.stage == "kv"
                and job.progress["kv"]["done"] >= 1
                and services.catalog.get_document(old.document_ids[0]) is not None
            ):
                assert service.delete_document(old.document_ids[0])

        job = service.run_job(new.job_id, on_progress=delete_old_during_kv)
        assert job.status == JobStatus.SUCCEEDED
        new_keys = {c.kv_key for c in services.catalog.chunks_of(new.document_ids[0])}
        assert len(old_keys & new_keys) == 1  # the shared paragraph is one content-addressed entry
        for key in new_keys:
            assert services.store.contains(key) is not None
        for key in old_keys - new_keys:
            assert services.store.contains(key) is None
    finally:
        services.close()


def _records_file(path: Path, n: int, start: int = 0) -> Path:
    import json

    path.write_text(
        json.dumps([{"title": f"R{i}", "text": f"Record number {i} says hello."} for i in range(start, start + n)])
    )
    return path


def test_a_records_file_is_parsed_per_record_and_written_in_batches(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.services.ingest.stages as ingest_module

    monkeypatch.setattr(ingest_module, "CATALOG_BATCH", 100)
    calls = {"add_document": 0, "add_documents": []}
    add_document, add_documents = services.catalog.add_document, services.catalog.add_documents
    monkeypatch.setattr(
        services.catalog,
        "add_document",
        lambda new: calls.__setitem__("add_document", calls["add_document"] + 1) or add_document(new),
    )
    monkeypatch.setattr(
        services.catalog,
        "add_documents",
        lambda rows: calls["add_documents"].append(len(rows)) or add_documents(rows),
    )
    path = _records_file(tmp_path / "records.json", 250)
    service = new_ingest(services)
    submitted, job = run(
        service, [IngestSource(kind="file", title="records.json", path=str(path), source_path="upload:records.json")]
    )
    assert job.status == JobStatus.SUCCEEDED, job.errors
    assert job.progress["parse"] == {"done": 250, "total": 250}  # one step per record, not per file
    assert calls == {"add_document": 1, "add_documents": [100, 100, 49]}  # the file's own + 3 batches
    assert len(job.document_ids) == 250
    assert services.catalog.list_documents(status=DocumentStatus.READY)[1] == 250
    assert services.catalog.get_document(job.document_ids[-1]).source_path == "upload:records.json#249"


def test_a_file_over_the_record_cap_fails_with_a_clear_error_and_nothing_else(tiny_settings, tmp_path: Path) -> None:

    tiny_settings.ingest.max_records_per_file = 10
    services = build_services(tiny_settings, {"doctor", "ingest"})
    try:
        path = _records_file(tmp_path / "eleven.json", 11)
        submitted, job = run(new_ingest(services), [IngestSource(kind="file", title="eleven.json", path=str(path))])
        assert job.status == JobStatus.FAILED
        assert [(e["code"], e["error"]) for e in job.errors] == [
            (
                "too_many_records",
                "more than 10 records (ingest.max_records_per_file); split the file or raise the setting",
            )
        ]
        assert job.progress["parse"] == {"done": 1, "total": 1}
        assert services.catalog.list_documents()[1] == 1  # only the file's own (failed) document
    finally:
        services.close()


def test_cancel_takes_effect_within_two_seconds_while_a_big_records_file_is_parsed(
    tiny_settings, tmp_path: Path
) -> None:
    import threading
    import time

    tiny_settings.ingest.max_records_per_file = 100_000
    services = build_services(tiny_settings, {"doctor", "ingest"})
    try:
        path = _records_file(tmp_path / "big.json", 30_000)
        service = new_ingest(services)
        submitted = service.submit([IngestSource(kind="file", title="big.json", path=str(path))], enqueue=False)
        thread = threading.Thread(target=service.run_job, args=(submitted.job_id,))
        thread.start()
        deadline = time.monotonic() + 60
        while (
            services.catalog.get_job(submitted.job_id).progress.get("parse", {}).get("done", 0) < 2
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        job = services.catalog.get_job(submitted.job_id)
        assert job.stage == "parse" and job.progress["parse"]["done"] < 30_000  # mid-parse, per record
        asked = time.monotonic()
        service.cancel(submitted.job_id)
        thread.join(timeout=30)
        took = time.monotonic() - asked
        job = services.catalog.get_job(submitted.job_id)
        assert job.status == JobStatus.CANCELLED and took < 2.0, took
        docs, total = services.catalog.list_documents(limit=500)
        assert {d.status for d in docs} == {DocumentStatus.FAILED}
        # …and what the cancel left behind goes in one call.
        assert service.purge_failed() == total
        assert services.catalog.list_documents()[1] == 0
    finally:
        services.close()


def test_chunk_kv_is_computed_by_the_engine_worker_when_the_scheduler_runs(services: Services, monkeypatch) -> None:
    """In the server, ingest shares the model with questions through the scheduler (questions first)."""
    import threading

    engine = services.engine
    real = engine.precompute_chunks
    threads: list[str] = []

    def recording(chunks, prefix_ids=None, max_batch_tokens=4096):
        threads.append(threading.current_thread().name)
        return real(chunks, prefix_ids, max_batch_tokens)

    monkeypatch.setattr(engine, "precompute_chunks", recording)
    scheduler = new_scheduler(services.settings, services.engine)
    scheduler.start()
    try:
        _, job = run(new_ingest(services, scheduler=scheduler), [text("A", TEXT_A)])
    finally:
        scheduler.stop()
    assert job.status == JobStatus.SUCCEEDED
    assert threads and set(threads) == {"blendrag-engine"}
    # Without a running scheduler (CLI ingest) the ingest thread computes them itself.
    threads.clear()
    _, job = run(new_ingest(services), [text("B", TEXT_B)])
    assert job.status == JobStatus.SUCCEEDED
    assert threads and set(threads) == {threading.current_thread().name}


def test_a_job_failing_in_commit_leaves_no_index_entries(services: Services, monkeypatch) -> None:
    """Its documents are failed, so the index (which must hold exactly the ready chunks) drops what the
    commit had already added."""
    service = new_ingest(services)
    real = services.catalog.set_document_status

    def refuse_ready(document_id: str, status: DocumentStatus, error: str | None = None) -> None:
        if status == DocumentStatus.READY:
            raise RuntimeError("the document went away mid-commit")
        real(document_id, status, error=error)

    monkeypatch.setattr(services.catalog, "set_document_status", refuse_ready)
    submitted, job = run(service, [text("a", "Alpha text about kites."), text("b", "Beta text about rivers.")])
    assert job.status == JobStatus.FAILED
    assert services.retriever.count == 0
    assert [services.catalog.get_document(d).status for d in submitted.document_ids] == [DocumentStatus.FAILED] * 2


def test_a_shutdown_stops_a_running_job_inside_chunk_and_the_next_start_resumes_it(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ingest.chunker import Chunker

    service = new_ingest(services)
    real_count = Chunker._count
    counted: list[str] = []

    def count_then_shut_down(self: Chunker, text: str) -> int:
        counted.append(text)
        if len(counted) == 1:
            service.request_stop()  # what stop() does first, from inside the job's chunk stage
        return real_count(self, text)

    monkeypatch.setattr(Chunker, "_count", count_then_shut_down)
    long_text = "\n\n".join(f"Paragraph {i} says something." for i in range(500))
    submitted = service.submit([text("Long", long_text)], enqueue=False)
    job = service.run_job(submitted.job_id)
    assert (job.status, job.stage) == (JobStatus.RUNNING, "chunk")  # stopped, not failed, not finished
    assert len(counted) == 1  # the first paragraph: the check after it saw the shutdown
    monkeypatch.setattr(Chunker, "_count", real_count)
    restarted = new_ingest(services)
    assert restarted.recover() == [submitted.job_id]
    assert restarted.run_job(submitted.job_id).status == JobStatus.SUCCEEDED
