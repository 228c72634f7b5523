"""The stages of an ingest job, in order: parse → chunk → embed → precompute_kv → commit.

Each is a plain function over a `JobContext`: it works on the items no earlier stage failed, reports
progress, looks for a cancel between steps (raising `JobCancelled`) and records what fails as a
`JobError`. Commit order is chosen so a crash at any point leaves nothing half-visible: chunks are
written while the document is still pending, the index is saved, and only then is it marked ready.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from app.catalog import DocumentStatus
from app.catalog.records import JobUpdate, NewChunk, NewDocument
from app.services.ingest.submission import find_duplicate, new_document
from app.services.ingest.types import ACTIVE_DOCUMENT_STATUSES, FILE_HASH_KEY, IngestSource, WorkItem

if TYPE_CHECKING:
    from app.catalog.records import DocumentRecord
    from app.services.ingest.context import IngestEnv, JobContext
    from ingest.config import IngestSettings
    from ingest.types import LoadedDocument

logger = logging.getLogger(__name__)

KV_BATCH_CHUNKS = 8  # chunks precomputed per engine pass at ingest (padded to the longest of the batch)
CATALOG_BATCH = 1000  # documents per catalog transaction when a JSON file fans out into many


def parse(ctx: JobContext) -> None:
    """Parse every source. A JSON / JSONL file is read record by record (progress and cancel per
    record); its records past the first become documents of their own, written in batches."""
    from app.services.ingest.parse_process import iter_file_documents
    from ingest.errors import LoaderError
    from ingest.loaders import load_text

    tracker = ctx.progress
    tracker.stage("parse", len(ctx.items))
    settings = ctx.env.settings.ingest
    done = 0
    for item in list(ctx.items):
        tracker.check_cancel()
        src = item.source
        loaded_docs: list[LoadedDocument] = []
        try:
            if src.kind == "text":
                loaded_docs.append(
                    load_text(src.text or "", src.title, source_path=src.source_path, metadata=src.metadata)
                )
            else:
                # In a child process that a cancel, a shutdown or the time limit kills (parse_process.py).
                path = Path(src.path or "")
                for loaded in iter_file_documents(path, settings, check=tracker.check_cancel, server=ctx.parse_server):
                    loaded_docs.append(loaded)
                    if len(loaded_docs) > 1:
                        tracker.grow(1)  # one more document to parse
                        tracker.advance(done + len(loaded_docs) - 1)
                        tracker.check_cancel()
        except LoaderError as exc:
            tracker.grow(-max(len(loaded_docs) - 1, 0))
            ctx.reject(item, exc.message, exc.code)
            done += 1
            tracker.advance(done)
            continue
        # A file's title comes from its content (heading, PDF metadata …); the file name was only the
        # placeholder shown while the job was queued. Under the lock: jobs in other parse lanes look for
        # the same content at the same time.
        with ctx.accept_lock:
            accept(ctx, item, loaded_docs[0])
            if len(loaded_docs) > 1:
                ctx.items.extend(accept_records(ctx, item, loaded_docs[1:]))
        done += len(loaded_docs)
        tracker.advance(done)


def accept(ctx: JobContext, item: WorkItem, loaded: LoadedDocument) -> None:
    """Keep a parsed document, or drop it as a duplicate of stored content (one copy is kept)."""
    catalog = ctx.env.catalog
    stored = catalog.find_by_hash(loaded.content_hash, ACTIVE_DOCUMENT_STATUSES, ctx.collection)
    duplicate_of = find_duplicate(stored, ctx.seen_hashes.get(loaded.content_hash), ctx.job_id)
    if duplicate_of is None:
        ctx.seen_hashes[loaded.content_hash] = item.document_id
        item.loaded = loaded
        metadata = dict(loaded.metadata)
        if FILE_HASH_KEY in item.source.metadata:
            metadata[FILE_HASH_KEY] = item.source.metadata[FILE_HASH_KEY]
        catalog.set_content_hash(item.document_id, loaded.content_hash, metadata)
        if loaded.title != item.source.title:
            catalog.set_title(item.document_id, loaded.title)
        return
    catalog.delete_document(item.document_id)
    item.failed = f"duplicate of {duplicate_of}"
    ctx.duplicates.append(item.document_id)
    ctx.add_duplicate(item.source, duplicate_of)


def accept_records(ctx: JobContext, item: WorkItem, docs: list[LoadedDocument]) -> list[WorkItem]:
    """Documents for the records after a file's first, created in batched catalog writes."""
    src, job_id, catalog = item.source, ctx.job_id, ctx.env.catalog
    stored = catalog.find_by_hashes({d.content_hash for d in docs}, ACTIVE_DOCUMENT_STATUSES, ctx.collection)
    new_items: list[WorkItem] = []
    rows: list[NewDocument] = []
    for i, loaded in enumerate(docs, 1):
        record = IngestSource(
            kind="file",
            title=loaded.title,
            path=src.path,
            source_path=f"{src.source_path}#{i}" if src.source_path else None,
            tags=src.tags,
        )
        duplicate_of = find_duplicate(stored.get(loaded.content_hash), ctx.seen_hashes.get(loaded.content_hash), job_id)
        if duplicate_of is not None:
            ctx.duplicates.append(duplicate_of)
            ctx.add_duplicate(record, duplicate_of)
            continue
        new = new_document(record, job_id, loaded, collection=ctx.collection)
        doc_id = new.id
        ctx.seen_hashes[loaded.content_hash] = doc_id
        rows.append(new)
        new_items.append(WorkItem(doc_id, record, loaded=loaded))
    for start in range(0, len(rows), CATALOG_BATCH):
        ctx.progress.check_cancel()
        catalog.add_documents(rows[start : start + CATALOG_BATCH])
        # Recorded at once, so a restart (recover) or a cancel finds every document of the job.
        written = len(ctx.items) + min(start + CATALOG_BATCH, len(rows))
        catalog.update_job(job_id, JobUpdate(document_ids=[i.document_id for i in (ctx.items + new_items)[:written]]))
    return new_items


def chunk(ctx: JobContext) -> None:
    """Split each document into chunks; a document over a token cap (its own or the job's) fails."""
    from ingest.chunker import Chunker, OverTokenCap

    live = ctx.live()
    tracker = ctx.progress
    tracker.stage("chunk", len(live))
    limits = ctx.env.settings.ingest
    chunker = Chunker.from_settings(ctx.env.engine.tokenizer, limits)
    job_tokens = 0
    for n, item in enumerate(live, 1):
        tracker.check_cancel()
        assert item.loaded is not None
        problem: tuple[str, str] | None
        try:
            # Tokenizing stops once the document's cap is passed; a cancel is looked for between paragraphs.
            item.chunks = chunker.chunk_document(
                item.loaded, max_tokens=limits.max_document_tokens, check=tracker.check_cancel
            )
            num_tokens = sum(len(c.token_ids) for c in item.chunks)
            problem = _size_problem(len(item.chunks), num_tokens, job_tokens, limits)
        except OverTokenCap:
            cap = limits.max_document_tokens
            message = f"document has more than {cap} tokens; the limit is {cap} (ingest.max_document_tokens)"
            num_tokens, problem = 0, (message, "too_large")
        if problem is not None:
            item.chunks = []
            ctx.reject(item, *problem)
        else:
            job_tokens += num_tokens
        tracker.advance(n)


def _size_problem(num_chunks: int, num_tokens: int, job_tokens: int, limits: IngestSettings) -> tuple[str, str] | None:
    """Why a document of `num_chunks` chunks and `num_tokens` tokens cannot be added to a job holding
    `job_tokens` (message, code), or None."""
    if not num_chunks:
        return ("document has no text to index", "empty_document")
    if num_tokens > limits.max_document_tokens:
        return (
            f"document has {num_tokens} tokens in {num_chunks} chunks; the limit is "
            f"{limits.max_document_tokens} (ingest.max_document_tokens)",
            "too_large",
        )
    if job_tokens + num_tokens > limits.max_job_tokens:
        return (
            f"the job reached {limits.max_job_tokens} tokens (ingest.max_job_tokens) before "
            f"this document's {num_tokens}",
            "job_too_large",
        )
    return None


def embed(ctx: JobContext) -> None:
    """Embed every chunk; chunks of all documents go through the embedder in full batches (one
    document per call was ~30x slower on short documents)."""
    from retrieval.types import IndexedChunk

    live = ctx.live()
    tracker = ctx.progress
    total = sum(len(i.chunks) for i in live)
    tracker.stage("embed", total)
    # Ids are not assigned until commit; embedding only reads text and title.
    flat = [
        IndexedChunk(
            chunk_id=c.index, document_id=item.document_id, text=c.text, title=item.loaded.title if item.loaded else ""
        )
        for item in live
        for c in item.chunks
    ]
    retriever = ctx.env.retriever
    batch = max(1, ctx.env.settings.retrieval.embed_batch_size)
    parts = []
    for start in range(0, len(flat), batch):
        tracker.check_cancel()
        parts.append(retriever.embed_chunks(flat[start : start + batch]))
        tracker.advance(min(start + batch, total))
    if not parts:
        return
    import numpy as np

    vectors = np.concatenate(parts)  # (num_chunks, dim), in item order
    offset = 0
    for item in live:
        item.vectors = vectors[offset : offset + len(item.chunks)]
        offset += len(item.chunks)


def precompute_kv(ctx: JobContext) -> None:
    """Store every chunk's KV. Content-addressed: a chunk already stored (same text, model and prompt)
    costs nothing. The rest is precomputed KV_BATCH_CHUNKS at a time (exactly the same KV as one at a
    time; on short chunks the per-layer overhead otherwise dominates), by the scheduler between
    questions' work, so ingest never delays an answer by more than one unit. A chunk precompute is a
    full pass over the chunk behind the cached prefix, so its compute time feeds the full-pass rate
    (`FullPassRate`; short prompts go faster per token than long ones: until a full-mode answer is
    observed it is on the low side)."""
    from engine.scheduler import PrecomputePriority

    env, tracker = ctx.env, ctx.progress
    live = ctx.live()
    token_ids = [c.token_ids for item in live for c in item.chunks]
    tracker.stage("kv", len(token_ids))
    for item in live:
        item.kv_keys = [env.kv_space.key(c.token_ids) for c in item.chunks]
        env.documents.kv_in_use.add(item.kv_keys)

    def on_batch(num_done: int) -> None:
        tracker.check_cancel()
        tracker.advance(num_done)

    tracker.check_cancel()
    rate = env.full_pass_rate
    started = time.perf_counter()
    written = env.kv_space.ensure(
        token_ids,
        keys=[k for item in live for k in item.kv_keys],  # hashed once, above
        compute=lambda todo: env.scheduler.precompute_chunks(
            todo, priority=PrecomputePriority.INGEST, on_unit=rate.observe if rate is not None else None
        ),
        batch_chunks=KV_BATCH_CHUNKS,
        on_batch=on_batch,
    )
    tracker.advance(len(token_ids))
    tracker.add_kv(  # the cache's bill
        written.num_bytes_written, written.num_tokens_written, written.num_computed, time.perf_counter() - started
    )
    if written.unwritten:
        _fail_unstored(ctx, live, set(written.unwritten))


def _fail_unstored(ctx: JobContext, live: list[WorkItem], unstored: set[str]) -> None:
    """Documents with KV that could not be stored fail (their chunks are not committed): a job never reads
    `succeeded` while part of its KV lives only in memory."""
    message_tail = "could not be written to the KV store (disk full or unwritable; see /ready and the logs)"
    ctx.env.storage_fault(f"KV write failed for {len(unstored)} chunk(s)")
    for item in live:
        missing = sum(1 for k in item.kv_keys if k in unstored)
        if missing:
            ctx.reject(item, f"the KV of {missing} of {len(item.kv_keys)} chunks {message_tail}", "kv_write_failed")


def commit(ctx: JobContext) -> int:
    """Write the chunks and index entries, save the index, then mark the documents ready; a re-ingest's
    earlier version is deleted once the new one is live. Returns the number of chunks committed.

    Versions of one source are ordered by when they were submitted, and the newest always wins: a commit
    deletes only older versions (a newer one still pending replaces this one when it commits), and a
    version older than one already committed (another worker ran the newer job first) is not committed.
    A document deleted while its job ran fails; nothing is asserted about what others may change."""
    from retrieval.types import IndexedChunk

    live = ctx.live()
    tracker = ctx.progress
    tracker.stage("commit", len(live))
    tracker.check_cancel(force=True)
    catalog, retriever = ctx.env.catalog, ctx.env.retriever
    num_chunks = 0
    committed: list[tuple[WorkItem, DocumentRecord]] = []
    for n, item in enumerate(live, 1):
        doc = catalog.get_document(item.document_id)
        newer = _newer_ready_version(ctx, doc, item.source.source_path)
        if doc is None or newer is not None:
            if newer is not None:
                message = f"superseded: a newer version of {newer.source_path} (document {newer.id})"
                ctx.reject(item, f"{message} was committed first", "superseded")
            else:
                ctx.reject(item, "the document was deleted while it was being ingested", "deleted")
            tracker.advance(n)
            continue
        assert item.vectors is not None  # embed gave every live item its vectors
        chunk_ids = catalog.replace_chunks(
            item.document_id,
            [
                NewChunk.of(c, key, vector)
                for c, key, vector in zip(item.chunks, item.kv_keys, item.vectors, strict=True)
            ],
        )
        retriever.add(
            [
                IndexedChunk(
                    chunk_id=cid,
                    document_id=doc.id,
                    text=c.text,
                    title=doc.title,
                    page=c.page,
                    tags=list(doc.tags),
                    collection=doc.collection,
                )
                for cid, c in zip(chunk_ids, item.chunks, strict=True)
            ],
            item.vectors,
        )
        num_chunks += len(chunk_ids)
        committed.append((item, doc))
        tracker.advance(n)
    retriever.save()
    for item, doc in committed:
        catalog.set_document_status(item.document_id, DocumentStatus.READY)
        replace_older_versions(ctx.env, doc)
    tracker.set_ready(len(committed))
    return num_chunks


def replace_older_versions(env: IngestEnv, doc: DocumentRecord) -> None:
    """Re-ingest of a changed file: `doc` is live, now drop the versions of its source submitted before
    it by other jobs of its collection."""
    if not doc.source_path:
        return
    for old in env.catalog.find_by_source(doc.source_path, exclude_id=doc.id, collection=doc.collection):
        if old.job_id != doc.job_id and _version_order(old) < _version_order(doc):
            logger.info("replacing document %s (%s)", old.id, doc.source_path)
            env.documents.delete_document(old.id)


def _version_order(doc: DocumentRecord) -> tuple[datetime, str]:
    """Versions of a source in the order they were submitted (the id only breaks an exact tie)."""
    return (doc.created_at, doc.id)


def _other_versions(ctx: JobContext, source_path: str | None, doc_id: str) -> list[DocumentRecord]:
    """Other documents of `source_path` in the job's collection (another collection's file of the same
    name is its own), from earlier or later jobs: two sources of one request never replace each other
    (that lost an upload)."""
    if not source_path:
        return []
    olds = ctx.env.catalog.find_by_source(source_path, exclude_id=doc_id, collection=ctx.collection)
    return [old for old in olds if old.job_id != ctx.job_id]


def _newer_ready_version(ctx: JobContext, doc: DocumentRecord | None, source_path: str | None) -> DocumentRecord | None:
    """A version of the source submitted after `doc` and committed already, if any. When `doc` is gone, a
    committed version of another job is what deleted it (a commit deletes the older versions)."""
    versions = _other_versions(ctx, doc.source_path if doc is not None else source_path, doc.id if doc else "")
    newer = [
        old
        for old in versions
        if old.status == DocumentStatus.READY and (doc is None or _version_order(old) > _version_order(doc))
    ]
    return max(newer, key=_version_order, default=None)
