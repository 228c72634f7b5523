"""Each stage of an ingest job as a plain function over its JobContext, without a worker thread."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from app.build import Services
from app.catalog import DocumentStatus
from app.catalog.records import JobUpdate
from app.services.ingest import IngestSource, JobError, stages
from app.services.ingest import progress as progress_module
from app.services.ingest.context import JobContext
from app.services.ingest.types import JobCancelled
from ingest.chunker import Chunker

TEXT_A = "Quintaro is the capital of Zorblat. It has purple rivers.\n\nThe kite festival is in May."
TEXT_B = "Sourdough needs flour, water, salt and a starter. Bake it at 250 degrees."

MakeCtx = Callable[[list[IngestSource]], JobContext]


def text(title: str, body: str, source: str | None = None) -> IngestSource:
    return IngestSource(kind="text", title=title, text=body, source_path=source)


def counts(ctx: JobContext, stage: str) -> dict[str, int]:
    return ctx.progress.counts()[stage]


def test_the_stages_in_order_commit_exact_chunk_ids_with_their_progress(services: Services, make_ctx: MakeCtx) -> None:
    ctx = make_ctx([text("A", TEXT_A), text("B", TEXT_B)])
    doc_a, doc_b = (i.document_id for i in ctx.items)
    stages.parse(ctx)
    assert counts(ctx, "parse") == {"done": 2, "total": 2}
    assert [i.loaded.text for i in ctx.items] == [TEXT_A, TEXT_B]
    stages.chunk(ctx)
    assert counts(ctx, "chunk") == {"done": 2, "total": 2}
    num_a, num_b = (len(i.chunks) for i in ctx.items)
    assert (num_a, num_b) == (1, 1)
    stages.embed(ctx)
    assert counts(ctx, "embed") == {"done": 2, "total": 2}
    assert [i.vectors.shape[0] for i in ctx.items] == [1, 1]
    stages.precompute_kv(ctx)
    kv = counts(ctx, "kv")
    tokens = sum(len(c.token_ids) for i in ctx.items for c in i.chunks)
    assert (kv["done"], kv["total"], kv["tokens"]) == (2, 2, tokens)
    assert [i.kv_keys for i in ctx.items] == [[services.kv_space.key(c.token_ids) for c in i.chunks] for i in ctx.items]
    # Not yet committed: the documents are pending, nothing is searchable, but the KV is stored.
    assert services.catalog.get_document(doc_a).status == DocumentStatus.PENDING
    assert services.retriever.chunk_ids() == []
    assert all(services.store.contains(k) is not None for i in ctx.items for k in i.kv_keys)
    assert stages.commit(ctx) == 2
    assert counts(ctx, "commit") == {"done": 2, "total": 2, "ready": 2}  # the documents it made ready
    assert [c.id for c in services.catalog.chunks_of(doc_a)] == [1]
    assert [c.id for c in services.catalog.chunks_of(doc_b)] == [2]
    assert sorted(services.retriever.chunk_ids()) == [1, 2]
    assert [services.catalog.get_document(d).status for d in (doc_a, doc_b)] == [DocumentStatus.READY] * 2
    assert ctx.errors == []


def test_per_document_failures_are_job_errors_and_the_rest_goes_on(
    services: Services, make_ctx: MakeCtx, tmp_path: Path
) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    weird = tmp_path / "data.xyz"
    weird.write_bytes(b"\x00\x01")
    ctx = make_ctx(
        [
            text("A", TEXT_A, source="notes/a.md"),
            IngestSource(kind="file", title="empty.txt", path=str(empty), source_path="empty.txt"),
            IngestSource(kind="file", title="data.xyz", path=str(weird)),
        ]
    )
    stages.parse(ctx)
    supported = "docx, htm, html, json, jsonl, markdown, md, ndjson, pdf, text, txt, xhtml"
    unsupported = f"unsupported file type .xyz (supported: {supported})"
    assert ctx.errors == [
        JobError(source="empty.txt", error="file is empty", code="empty_document"),
        JobError(source="data.xyz", error=unsupported, code="unsupported_format"),
    ]
    assert [i.failed for i in ctx.items] == [None, "file is empty", unsupported]
    assert [services.catalog.get_document(i.document_id).status for i in ctx.items] == [
        DocumentStatus.PENDING,
        DocumentStatus.FAILED,
        DocumentStatus.FAILED,
    ]
    assert counts(ctx, "parse") == {"done": 3, "total": 3}
    stages.chunk(ctx)
    assert counts(ctx, "chunk") == {"done": 1, "total": 1}  # the failed files never reach it
    assert len(ctx.errors) == 2


def test_a_document_over_the_job_token_cap_fails_in_the_chunk_stage(services: Services, make_ctx: MakeCtx) -> None:
    ctx = make_ctx([text("A", TEXT_A), text("B", TEXT_B)])
    stages.parse(ctx)
    chunker = Chunker.from_settings(services.engine.tokenizer, services.settings.ingest)
    num_a, num_b = (sum(len(c.token_ids) for c in chunker.chunk_document(i.loaded)) for i in ctx.items)
    services.settings.ingest.max_job_tokens = num_a + num_b - 1
    stages.chunk(ctx)
    message = f"the job reached {num_a + num_b - 1} tokens (ingest.max_job_tokens) before this document's {num_b}"
    assert ctx.errors == [JobError(source="B", error=message, code="job_too_large")]
    assert [len(i.chunks) for i in ctx.items] == [1, 0]
    assert [i.document_id for i in ctx.live()] == [ctx.items[0].document_id]


def test_a_cancel_stops_the_job_at_the_next_check_and_nothing_is_committed(
    services: Services, make_ctx: MakeCtx, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress_module, "CANCEL_POLL_S", 0.0)  # every check looks (the default: 5 a second)
    ctx = make_ctx([text("A", TEXT_A), text("B", TEXT_B)])
    stages.parse(ctx)
    services.catalog.update_job(ctx.job_id, JobUpdate(cancel_requested=True))
    with pytest.raises(JobCancelled):
        stages.chunk(ctx)
    assert counts(ctx, "chunk") == {"done": 0, "total": 2}
    assert [i.chunks for i in ctx.items] == [[], []]


def test_the_commit_always_looks_for_a_cancel_first(services: Services, make_ctx: MakeCtx) -> None:
    ctx = make_ctx([text("A", TEXT_A)])
    for stage in (stages.parse, stages.chunk, stages.embed, stages.precompute_kv):
        stage(ctx)
    services.catalog.update_job(ctx.job_id, JobUpdate(cancel_requested=True))
    with pytest.raises(JobCancelled):
        stages.commit(ctx)  # however soon after the last check
    assert counts(ctx, "commit") == {"done": 0, "total": 1}
    assert services.catalog.chunks_of(ctx.items[0].document_id) == []
    assert services.catalog.get_document(ctx.items[0].document_id).status == DocumentStatus.PENDING
    assert services.retriever.chunk_ids() == []


def test_content_already_stored_is_a_duplicate_at_parse(services: Services, make_ctx: MakeCtx, tmp_path: Path) -> None:
    first = make_ctx([text("A", TEXT_A)])
    for stage in (stages.parse, stages.chunk, stages.embed, stages.precompute_kv, stages.commit):
        stage(first)
    stored_id = first.items[0].document_id
    # The same text in a file (submit compares the bytes only), and one text in two files of one job.
    (tmp_path / "a.txt").write_text(TEXT_A)
    (tmp_path / "b.txt").write_text(TEXT_B)
    (tmp_path / "b-copy.md").write_text(TEXT_B + "\n")  # other bytes, the same text
    ctx = make_ctx(
        [
            IngestSource(kind="file", title="a.txt", path=str(tmp_path / "a.txt"), source_path="a.txt"),
            IngestSource(kind="file", title="b.txt", path=str(tmp_path / "b.txt"), source_path="b.txt"),
            IngestSource(kind="file", title="b-copy.md", path=str(tmp_path / "b-copy.md"), source_path="b-copy.md"),
        ]
    )
    a_id, b_id, b_copy_id = (i.document_id for i in ctx.items)
    stages.parse(ctx)
    assert ctx.errors == [JobError.duplicate("a.txt", stored_id), JobError.duplicate("b-copy.md", b_id)]
    assert ctx.duplicates == [a_id, b_copy_id]  # the dropped documents' own ids
    assert [i.document_id for i in ctx.live()] == [b_id]
    assert services.catalog.get_document(a_id) is None and services.catalog.get_document(b_copy_id) is None


def test_records_of_a_file_become_documents_and_repeat_records_are_duplicates(
    services: Services, make_ctx: MakeCtx, tmp_path: Path
) -> None:
    import json

    stored = make_ctx([text("Stored", "Record two is stored already.")])
    stages.parse(stored)
    path = tmp_path / "records.json"
    records = ["Record one.", "Record two is stored already.", "Record one.", "Record three."]
    path.write_text(json.dumps([{"title": f"R{i}", "text": t} for i, t in enumerate(records)]))
    ctx = make_ctx([IngestSource(kind="file", title="records.json", path=str(path), source_path="up/records.json")])
    stages.parse(ctx)
    first_id = ctx.items[0].document_id
    assert counts(ctx, "parse") == {"done": 4, "total": 4}
    stored_id = stored.items[0].document_id
    assert ctx.errors == [
        JobError.duplicate("up/records.json#1", stored_id),
        JobError.duplicate("up/records.json#2", first_id),
    ]
    assert ctx.duplicates == [stored_id, first_id]
    assert [(i.source.source_path, i.loaded.text) for i in ctx.items] == [
        ("up/records.json", "Record one."),
        ("up/records.json#3", "Record three."),
    ]
    job = services.catalog.get_job(ctx.job_id)
    assert job.document_ids == [i.document_id for i in ctx.items]
    assert services.catalog.get_document(ctx.items[1].document_id).title == "R3"


ALL_STAGES = (stages.parse, stages.chunk, stages.embed, stages.precompute_kv, stages.commit)


def test_an_older_version_committed_after_a_newer_one_is_superseded_not_restored(
    services: Services, make_ctx: MakeCtx
) -> None:
    # Two workers: the job of version 2 (submitted second) commits before the job of version 1.
    old = make_ctx([text("v1", TEXT_A, source="h.md")])
    new = make_ctx([text("v2", TEXT_B, source="h.md")])
    for stage in ALL_STAGES:
        stage(new)
    for stage in ALL_STAGES:
        stage(old)
    old_id, new_id = old.items[0].document_id, new.items[0].document_id
    message = f"superseded: a newer version of h.md (document {new_id}) was committed first"
    assert old.errors == [JobError(source="h.md", error=message, code="superseded")]
    assert services.catalog.get_document(old_id) is None  # the newer commit deleted the older version
    assert services.catalog.get_document(new_id).status == DocumentStatus.READY
    assert {services.retriever.get(c).document_id for c in services.retriever.chunk_ids()} == {new_id}


def test_a_newer_version_still_pending_is_not_deleted_by_the_older_commit(
    services: Services, make_ctx: MakeCtx
) -> None:
    old = make_ctx([text("v1", TEXT_A, source="h.md")])
    new = make_ctx([text("v2", TEXT_B, source="h.md")])
    for stage in ALL_STAGES:
        stage(old)
    assert services.catalog.get_document(new.items[0].document_id).status == DocumentStatus.PENDING
    for stage in ALL_STAGES:
        stage(new)
    assert new.errors == []
    assert services.catalog.get_document(old.items[0].document_id) is None  # replaced by the newer version
    assert services.catalog.get_document(new.items[0].document_id).status == DocumentStatus.READY


def test_a_document_deleted_while_its_job_runs_fails_without_an_assert(services: Services, make_ctx: MakeCtx) -> None:
    ctx = make_ctx([text("A", TEXT_A), text("B", TEXT_B)])
    for stage in ALL_STAGES[:-1]:
        stage(ctx)
    a_id, b_id = (i.document_id for i in ctx.items)
    services.catalog.delete_document(a_id)
    assert stages.commit(ctx) == len(ctx.items[1].chunks)
    message = "the document was deleted while it was being ingested"
    assert ctx.errors == [JobError(source="A", error=message, code="deleted")]
    assert services.catalog.get_document(b_id).status == DocumentStatus.READY


def cancel_at_check(monkeypatch: pytest.MonkeyPatch, ctx: JobContext, services: Services, number: int) -> list[int]:
    """Request the job's cancel at the `number`-th cancel check from now (counted in the returned list)."""
    monkeypatch.setattr(progress_module, "CANCEL_POLL_S", 0.0)
    real = ctx.progress.check_cancel
    calls: list[int] = []

    def check_cancel(force: bool = False) -> None:
        calls.append(1)
        if len(calls) == number:
            services.catalog.update_job(ctx.job_id, JobUpdate(cancel_requested=True))
        real(force)

    monkeypatch.setattr(ctx.progress, "check_cancel", check_cancel)
    return calls


def test_a_cancel_stops_the_parse_of_a_long_docx_between_its_paragraphs(
    services: Services, make_ctx: MakeCtx, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from docx_bomb import write_docx_bomb

    path = write_docx_bomb(tmp_path / "long.docx", 1024 * 1024)  # ~22k paragraphs
    ctx = make_ctx([IngestSource(kind="file", title="long.docx", path=str(path), source_path="long.docx")])
    calls = cancel_at_check(monkeypatch, ctx, services, 3)  # 1: the stage's own check, 2…: the loader's
    with pytest.raises(JobCancelled):
        stages.parse(ctx)
    assert len(calls) == 3
    assert counts(ctx, "parse") == {"done": 0, "total": 1}


def test_a_cancel_stops_the_chunking_of_a_long_document_between_its_paragraphs(
    services: Services, make_ctx: MakeCtx, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_ctx([text("Long", "\n\n".join(f"Paragraph {i} says something." for i in range(500)))])
    stages.parse(ctx)
    calls = cancel_at_check(monkeypatch, ctx, services, 3)  # 1: the stage's own check, 2…: the chunker's
    with pytest.raises(JobCancelled):
        stages.chunk(ctx)
    assert len(calls) == 3
    assert ctx.items[0].chunks == []


def test_a_document_far_over_its_token_cap_fails_in_chunk_without_being_tokenized_to_the_end(
    services: Services, make_ctx: MakeCtx
) -> None:
    ctx = make_ctx([text("Long", "\n\n".join(f"Paragraph {i} says something." for i in range(500)))])
    stages.parse(ctx)
    services.settings.ingest.max_document_tokens = 100
    stages.chunk(ctx)
    message = "document has more than 100 tokens; the limit is 100 (ingest.max_document_tokens)"
    assert ctx.errors == [JobError(source="Long", error=message, code="too_large")]
    assert ctx.live() == []
