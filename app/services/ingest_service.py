"""IngestService: parse → chunk → embed → precompute KV → commit, as background jobs.

A document is visible (status `pending`) as soon as its job is accepted and answerable only once the job
commits it (`ready`): its chunk rows, FAISS entries and KV entries all exist by then. Commit order is
chosen so a crash at any point leaves nothing half-visible: chunks are written while the document is
still pending, the index is saved, and only then does the document flip to ready. `recover()` (run at
start-up) re-queues interrupted jobs after removing what they had half-written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from app.catalog import DocumentStatus, JobStatus
from app.catalog.models import DEFAULT_COLLECTION
from app.catalog.repository import ChunkRecord, JobRecord, NewChunk
from app.services.estimates import PrefillRate
from app.services.storage_faults import is_storage_full
from app.services.text_checks import is_blank, is_valid_utf8

if TYPE_CHECKING:
    import numpy as np

    from app.components import Components
    from engine.scheduler import Scheduler
    from ingest.chunker import Chunk
    from ingest.types import LoadedDocument

logger = logging.getLogger(__name__)

STAGES = ("parse", "chunk", "embed", "kv", "commit")
UNSETTLED_RETRY_S = 5.0  # how often the worker retries marking a job failed that the catalog refused
KV_BATCH_CHUNKS = 8  # chunks prefilled per engine pass at ingest (padded to the longest of the batch)
ACTIVE_DOCUMENT_STATUSES = (DocumentStatus.READY, DocumentStatus.PENDING)
CATALOG_BATCH = 1000  # documents per catalog transaction when a JSON file fans out into many
CANCEL_POLL_S = 0.2  # how often a running job looks for a cancel request
FILE_HASH_KEY = "file_sha256"  # document metadata: SHA-256 of the ingested file's bytes


class IngestError(ValueError):
    """A request to ingest that cannot be accepted at all (nothing to ingest, unknown job …)."""


class IngestTooLarge(IngestError):
    """A request over an ingest cap (documents per job, tokens per document or job): HTTP 413."""


class JobCancelled(Exception):
    pass


@dataclass(frozen=True)
class IngestSource:
    """One thing to ingest: inline text, or a file on this machine (an upload saved under the data dir)."""

    kind: Literal["text", "file"]
    title: str
    text: str | None = None
    path: str | None = None
    source_path: str | None = None  # identity for re-ingest: same source + new content replaces the old
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_spec(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "title": self.title,
            "text": self.text,
            "path": self.path,
            "source_path": self.source_path,
            "tags": self.tags,
            "metadata": self.metadata,
        }

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> IngestSource:
        return cls(**spec)


@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    document_ids: list[str]


@dataclass
class _WorkItem:
    """One document moving through the stages of a job."""

    document_id: str
    source: IngestSource
    loaded: LoadedDocument | None = None
    chunks: list[Chunk] = field(default_factory=list)
    vectors: np.ndarray | None = None
    kv_keys: list[str] = field(default_factory=list)
    failed: str | None = None
    collection: str = DEFAULT_COLLECTION


ProgressCallback = Callable[[JobRecord], None]


class IngestService:
    def __init__(
        self,
        components: Components,
        on_chunks_committed: Callable[[int, float], None] | None = None,
        prefill_rate: PrefillRate | None = None,
        scheduler: Scheduler | None = None,
        on_storage_fault: Callable[[str], None] | None = None,
        dispatch: Callable[[str], object] | None = None,
        free_space: Callable[[], bool] | None = None,
    ) -> None:
        """`scheduler` computes the chunks' KV (questions go first); without one, an unstarted scheduler
        of its own computes them in the ingest thread (CLI ingest, tests). `dispatch(job_id)` hands
        submitted jobs elsewhere (the PostgreSQL queue of `blendrag worker`); by default they run on this
        service's own worker thread."""
        from app.components import build_scheduler

        self._c = components
        self._dispatch = dispatch
        self._scheduler = scheduler if scheduler is not None else build_scheduler(components)
        self._on_storage_fault = on_storage_fault
        # Releases the storage reserve (True if it did): a failure the client is told of must be written
        # down, or a restart would run the job again and report another outcome.
        self._free_space = free_space
        # Jobs whose failure could not be written (the catalog itself was full): job id → error. They read
        # as failed (get_job) and the worker writes them down as soon as the catalog takes writes again.
        self._unsettled: dict[str, str] = {}
        self._unsettled_lock = threading.Lock()
        self._prefill_rate = prefill_rate
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()  # one job mutates the index at a time
        # KV keys the running job relies on but has not committed chunk rows for yet: a concurrent delete
        # of another document sharing such an entry must not remove it.
        self._inflight_keys: set[str] = set()
        self._inflight_lock = threading.Lock()
        self._on_chunks_committed = on_chunks_committed

    # ---- submission ------------------------------------------------------------------------------

    def submit(
        self, sources: list[IngestSource], *, enqueue: bool = True, collection: str = DEFAULT_COLLECTION
    ) -> SubmitResult:
        """Queue a job adding `sources` to `collection`. Duplicates and replaced sources are found within
        that collection only: the same text in two collections is two documents, each its keys'."""
        if not sources:
            raise IngestError("nothing to ingest: give at least one document or file")
        limits = self._c.settings.ingest
        if len(sources) > limits.max_job_documents:
            raise IngestTooLarge(
                f"{len(sources)} documents in one request; the limit is "
                f"{limits.max_job_documents} (ingest.max_job_documents)"
            )
        job_tokens = 0
        for s in sources:
            if s.kind == "text" and is_blank(s.text or ""):
                raise IngestError(f"document {s.title!r} has no text")
            if s.kind == "text":
                # Inline text is counted now, so an oversized request is refused before anything is stored.
                num_tokens = self._count_tokens(s.text or "")
                if num_tokens > limits.max_document_tokens:
                    raise IngestTooLarge(
                        f"document {s.title!r} has {num_tokens} tokens; the limit is "
                        f"{limits.max_document_tokens} (ingest.max_document_tokens)"
                    )
                job_tokens += num_tokens
        if job_tokens > limits.max_job_tokens:
            raise IngestTooLarge(
                f"the documents have {job_tokens} tokens together; the limit per request is "
                f"{limits.max_job_tokens} (ingest.max_job_tokens)"
            )
        # Content already stored (same text, or the same file bytes) is answered with the existing
        # document's id right here, so the id in the 202 always resolves.
        sources = [self._with_file_hash(s) for s in sources]
        job = self._c.catalog.create_job({}, collection=collection)
        fresh: list[IngestSource] = []
        fresh_ids: list[str] = []
        duplicates: list[dict[str, Any]] = []
        document_ids: list[str] = []
        first_of: dict[tuple[str, str], str] = {}  # identity → document id within this request
        for s in sources:
            identity, stored = self._identity(s, collection)
            dup = stored or (first_of.get(identity) if identity is not None else None)
            if dup is not None:
                duplicates.append(
                    {
                        "source": s.source_path or s.title,
                        "error": f"duplicate of document {dup}",
                        "code": "duplicate",
                        "document_id": dup,
                    }
                )
                document_ids.append(dup)
                continue
            if identity is not None:
                self._replace_failed(identity, collection)
            doc = self._c.catalog.add_document(
                title=s.title,
                source_path=s.source_path,
                content_hash=None,
                tags=s.tags,
                metadata=s.metadata,
                job_id=job.id,
                collection=collection,
            )
            if identity is not None:
                first_of[identity] = doc.id
            fresh.append(s)
            fresh_ids.append(doc.id)
            document_ids.append(doc.id)
        self._c.catalog.update_job(
            job.id,
            spec={"sources": [s.to_spec() for s in fresh], "duplicates": duplicates},
            document_ids=fresh_ids,
            duplicate_ids=[d["document_id"] for d in duplicates],
            errors=duplicates,
            progress={stage: {"done": 0, "total": 0} for stage in STAGES},
        )
        if enqueue:
            (self._dispatch or self._queue.put)(job.id)
        return SubmitResult(job_id=job.id, document_ids=document_ids)

    @staticmethod
    def _with_file_hash(source: IngestSource) -> IngestSource:
        """A file source carries the SHA-256 of its bytes in its metadata (`file_sha256`)."""
        if source.kind != "file" or not source.path or FILE_HASH_KEY in source.metadata:
            return source
        digest = hashlib.sha256()
        try:
            with open(source.path, "rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
        except OSError:
            return source  # parse reports the unreadable file
        return replace(source, metadata={**source.metadata, FILE_HASH_KEY: digest.hexdigest()})

    def _identity(self, source: IngestSource, collection: str) -> tuple[tuple[str, str] | None, str | None]:
        """(what makes two sources the same, the id of an active stored document of `collection` that is
        the same)."""
        from ingest.errors import LoaderError
        from ingest.loaders import load_text

        if source.kind == "text":
            try:
                loaded = load_text(
                    source.text or "", source.title, source_path=source.source_path, metadata=source.metadata
                )
            except LoaderError:
                return None, None  # parse reports it
            existing = self._c.catalog.find_by_hash(loaded.content_hash, ACTIVE_DOCUMENT_STATUSES, collection)
            identity = ("text", loaded.content_hash)
        elif FILE_HASH_KEY in source.metadata:
            identity = ("file", str(source.metadata[FILE_HASH_KEY]))
            existing = self._c.catalog.find_by_metadata(
                FILE_HASH_KEY, identity[1], ACTIVE_DOCUMENT_STATUSES, collection
            )
        else:
            return None, None
        return identity, existing.id if existing is not None else None

    def _replace_failed(self, identity: tuple[str, str], collection: str) -> None:
        """A retry of content whose earlier ingest failed replaces the failed document(s), so retries after
        a failure do not pile up failed copies of the same bytes."""
        kind, digest = identity
        failed = (DocumentStatus.FAILED,)
        while True:
            if kind == "file":
                old = self._c.catalog.find_by_metadata(FILE_HASH_KEY, digest, failed, collection)
            else:
                old = self._c.catalog.find_by_hash(digest, failed, collection)
            if old is None or not self.delete_document(old.id):
                return
            logger.info("replacing failed document %s with a retry of the same content", old.id)

    def _count_tokens(self, text: str) -> int:
        return len(self._c.engine.tokenizer(text, add_special_tokens=False)["input_ids"])

    def recent_jobs(self, limit: int, collections: Collection[str] | None = None) -> list[JobRecord]:
        """The newest jobs (of `collections`; None: all)."""
        # Each as get_job reports it: a job whose failure is not yet written reads failed in both.
        return [self._settled_view(job) for job in self._c.catalog.list_jobs(limit=limit, collections=collections)]

    def get_job(self, job_id: str) -> JobRecord | None:
        job = self._c.catalog.get_job(job_id)
        return self._settled_view(job) if job is not None else None

    def _settled_view(self, job: JobRecord) -> JobRecord:
        with self._unsettled_lock:
            error = self._unsettled.get(job.id)
        if error is not None and not job.status.finished:
            return dataclasses.replace(
                job,
                status=JobStatus.FAILED,
                stage=None,
                errors=[*job.errors, {"source": None, "error": error, "code": "storage"}],
            )
        return job

    def cancel(self, job_id: str) -> JobRecord:
        job = self._c.catalog.get_job(job_id)
        if job is None:
            raise KeyError(job_id)
        if not job.status.finished:
            self._c.catalog.update_job(job_id, cancel_requested=True)
            if job.status == JobStatus.QUEUED:
                self._finish_cancelled(job_id, [])
        return self._c.catalog.get_job(job_id)  # type: ignore[return-value]

    # ---- the worker ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="ingest-worker", daemon=True)
            self._worker.start()

    def stop(self) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=60)
            self._worker = None
        self._settle()  # a failure reported but not yet written: last chance before a restart re-runs it

    def _work(self) -> None:
        while True:
            try:
                job_id = self._queue.get(timeout=UNSETTLED_RETRY_S if self._unsettled else None)
            except queue.Empty:
                self._settle()
                continue
            if job_id is None:
                return
            try:
                self.run_job(job_id)
            except Exception as exc:  # the worker must outlive any one job
                logger.exception("ingest job %s crashed", job_id)
                self._unsettle(job_id, f"{type(exc).__name__}: {exc}")
            self._settle()

    def _with_reserve(self, write: Callable[[], None]) -> None:
        """Run a catalog write; on a full disk, once more after releasing the storage reserve."""
        try:
            write()
        except Exception as exc:
            if self._free_space is None or not is_storage_full(exc) or not self._free_space():
                raise
            write()

    def _unsettle(self, job_id: str, error: str) -> None:
        """A job whose own failure handling failed: never leave it `running`."""
        with self._unsettled_lock:
            self._unsettled[job_id] = error
        self._storage_fault(error)

    def _settle(self) -> None:
        """Write down the failure of jobs that could not be marked failed before (retried by the worker)."""
        with self._unsettled_lock:
            pending = dict(self._unsettled)
        for job_id, error in pending.items():

            def mark_failed(job_id: str = job_id, error: str = error) -> None:
                job = self._c.catalog.get_job(job_id)
                if job is not None and not job.status.finished:
                    for doc_id in job.document_ids:
                        doc = self._c.catalog.get_document(doc_id)
                        if doc is not None and doc.status == DocumentStatus.PENDING:
                            self._c.catalog.set_document_status(doc_id, DocumentStatus.FAILED, error=error)
                    self._c.catalog.update_job(
                        job_id,
                        status=JobStatus.FAILED,
                        stage=None,
                        errors=[*job.errors, {"source": None, "error": error, "code": "storage"}],
                    )

            try:
                self._with_reserve(mark_failed)
            except Exception as exc:
                logger.warning("ingest job %s still cannot be marked failed: %s", job_id, exc)
                continue
            with self._unsettled_lock:
                self._unsettled.pop(job_id, None)

    def _storage_fault(self, message: str) -> None:
        if self._on_storage_fault is not None:
            self._on_storage_fault(message)

    def recover(self) -> list[str]:
        """At start-up: undo what interrupted jobs half-wrote and queue them again. Returns their ids."""
        resumed = []
        for job in self._c.catalog.jobs_with_status([JobStatus.RUNNING, JobStatus.QUEUED]):
            self.reset_interrupted(job)
            logger.warning("resuming interrupted ingest job %s", job.id)
            self._queue.put(job.id)
            resumed.append(job.id)
        if resumed:
            self._c.retriever.save()
        return resumed

    def reset_interrupted(self, job: JobRecord) -> None:
        """Remove what an interrupted run of `job` half-wrote and mark it queued, ready to run again."""
        num_sources = len(job.spec.get("sources", []))
        for doc_id in job.document_ids[num_sources:]:
            # Documents fanned out of a json/jsonl file: parse creates them again.
            self._c.catalog.delete_document(doc_id)
        if len(job.document_ids) > num_sources:
            self._c.catalog.update_job(job.id, document_ids=job.document_ids[:num_sources])
        for doc_id in job.document_ids[:num_sources]:
            doc = self._c.catalog.get_document(doc_id)
            if doc is not None and doc.status == DocumentStatus.PENDING:
                chunk_ids = [c.id for c in self._c.catalog.chunks_of(doc_id)]
                self._c.retriever.remove(chunk_ids)
                self._c.catalog.replace_chunks(doc_id, [])
        self._c.catalog.update_job(job.id, status=JobStatus.QUEUED, stage=None)

    # ---- one job ---------------------------------------------------------------------------------

    def run_job(self, job_id: str, on_progress: ProgressCallback | None = None) -> JobRecord:
        """Run every stage of a job in this thread; returns the finished job."""
        job = self._c.catalog.get_job(job_id)
        if job is None:
            raise IngestError(f"no ingest job {job_id}")
        if job.status.finished:
            return job
        with self._lock:
            return self._run_locked(job, on_progress)

    def _run_locked(self, job: JobRecord, on_progress: ProgressCallback | None) -> JobRecord:
        sources = [IngestSource.from_spec(s) for s in job.spec.get("sources", [])]
        # document_ids may be longer than sources: records of a json/jsonl file fan out at parse time.
        items = [
            _WorkItem(doc_id, src, collection=job.collection)
            for doc_id, src in zip(job.document_ids, sources, strict=False)
        ]
        tracker = _Progress(self._c, job.id, on_progress)
        # Duplicates of stored documents were answered at submit; they stay reported.
        errors: list[dict[str, Any]] = list(job.spec.get("duplicates", []))
        duplicates: list[str] = [d["document_id"] for d in errors]
        self._c.catalog.update_job(job.id, status=JobStatus.RUNNING, errors=errors)
        started = time.perf_counter()
        try:
            return self._run_stages(job, items, tracker, errors, duplicates, started)
        finally:
            with self._inflight_lock:
                self._inflight_keys.clear()

    def _run_stages(
        self,
        job: JobRecord,
        items: list[_WorkItem],
        tracker: _Progress,
        errors: list[dict[str, Any]],
        duplicates: list[str],
        started: float,
    ) -> JobRecord:
        try:
            self._parse(items, tracker, errors, duplicates)
            self._chunk(items, tracker, errors)
            self._embed(items, tracker)
            self._precompute_kv(items, tracker, errors)
            num_chunks = self._commit(items, tracker)
        except JobCancelled:
            self._finish_cancelled(job.id, errors)
            return self._c.catalog.get_job(job.id)  # type: ignore[return-value]
        except Exception as exc:
            logger.exception("ingest job %s failed", job.id)
            full = is_storage_full(exc)
            if full:
                self._storage_fault(f"{type(exc).__name__}: {exc}")
            message = f"storage full: {exc}" if full else f"ingest failed: {exc}"
            self._drop_unused_kv(items, failed_only=False)  # frees space for the failure to be written
            errors.append(
                {
                    "source": None,
                    "error": f"{type(exc).__name__}: {exc}",
                    "code": "storage_full" if full else "internal",
                }
            )

            def mark_failed() -> None:
                for item in items:
                    self._fail_document(item, message)
                self._c.catalog.update_job(
                    job.id, status=JobStatus.FAILED, stage=None, errors=errors, duplicate_ids=duplicates
                )

            # Every document of the job is failed now: none may keep index entries a commit already added
            # (the index must hold exactly the catalog's ready chunks).
            for item in items:
                self._c.retriever.remove_document(item.document_id)
            try:
                self._with_reserve(mark_failed)
            except Exception as handler_exc:  # e.g. the catalog is full too: never leave the job `running`
                logger.error("could not mark ingest job %s failed: %s", job.id, handler_exc)
                self._unsettle(job.id, message)
                return self.get_job(job.id)  # type: ignore[return-value]
            return tracker.emit()
        self._drop_unused_kv(items, failed_only=True)
        ok = [i for i in items if i.failed is None]
        # A duplicate is not a failure: its content is stored, under the id the 202 gave.
        failures = [e for e in errors if e.get("code") != "duplicate"]
        status = JobStatus.SUCCEEDED if ok or not failures else JobStatus.FAILED
        self._c.catalog.update_job(job.id, status=status, stage=None, errors=errors, duplicate_ids=duplicates)
        if self._on_chunks_committed is not None:
            self._on_chunks_committed(num_chunks, time.perf_counter() - started)
        return tracker.emit()

    def _parse(
        self, items: list[_WorkItem], tracker: _Progress, errors: list[dict[str, Any]], duplicates: list[str]
    ) -> None:
        """Parse every source. A JSON / JSONL file is read record by record (progress and cancel per
        record); its records past the first become documents of their own, written in batches."""
        from ingest.errors import LoaderError
        from ingest.loaders import iter_documents, load_text

        tracker.stage("parse", len(items))
        settings = self._c.settings.ingest
        seen_hashes: dict[str, str] = {}
        done = 0
        for item in list(items):
            tracker.check_cancel()
            src = item.source
            loaded_docs: list[LoadedDocument] = []
            try:
                if src.kind == "text":
                    loaded_docs.append(
                        load_text(src.text or "", src.title, source_path=src.source_path, metadata=src.metadata)
                    )
                else:
                    for loaded in iter_documents(Path(src.path or ""), settings):
                        loaded_docs.append(loaded)
                        if len(loaded_docs) > 1:
                            tracker.grow(1)  # one more document to parse
                            tracker.advance(done + len(loaded_docs) - 1)
                            tracker.check_cancel()
            except LoaderError as exc:
                tracker.grow(-max(len(loaded_docs) - 1, 0))
                self._fail_document(item, exc.message)
                errors.append({"source": src.source_path or src.title, "error": exc.message, "code": exc.code})
                done += 1
                tracker.advance(done)
                continue
            # A file's title comes from its content (heading, PDF metadata …); the file name was only the
            # placeholder shown while the job was queued.
            self._accept_parsed(item, loaded_docs[0], tracker.job_id, seen_hashes, errors, duplicates)
            if len(loaded_docs) > 1:
                items.extend(
                    self._accept_records(item, loaded_docs[1:], tracker, seen_hashes, errors, duplicates, items)
                )
            done += len(loaded_docs)
            tracker.advance(done)

    def _accept_records(
        self,
        item: _WorkItem,
        docs: list[LoadedDocument],
        tracker: _Progress,
        seen_hashes: dict[str, str],
        errors: list[dict[str, Any]],
        duplicates: list[str],
        items: list[_WorkItem],
    ) -> list[_WorkItem]:
        """Documents for the records after a file's first, created in batched catalog writes."""
        src, job_id = item.source, tracker.job_id
        existing = self._c.catalog.find_by_hashes(
            {d.content_hash for d in docs}, ACTIVE_DOCUMENT_STATUSES, item.collection
        )
        new_items: list[_WorkItem] = []
        rows: list[dict[str, Any]] = []
        for i, loaded in enumerate(docs, 1):
            source_path = f"{src.source_path}#{i}" if src.source_path else None
            stored = existing.get(loaded.content_hash)
            duplicate_of = seen_hashes.get(loaded.content_hash) or (
                stored.id if stored is not None and stored.job_id != job_id else None
            )
            if duplicate_of is not None:
                duplicates.append(duplicate_of)
                errors.append(
                    {
                        "source": source_path or loaded.title,
                        "error": f"duplicate of document {duplicate_of}",
                        "code": "duplicate",
                        "document_id": duplicate_of,
                    }
                )
                continue
            doc_id = str(uuid.uuid4())
            seen_hashes[loaded.content_hash] = doc_id
            rows.append(
                {
                    "id": doc_id,
                    "title": loaded.title,
                    "source_path": source_path,
                    "content_hash": loaded.content_hash,
                    "tags": src.tags,
                    "metadata": dict(loaded.metadata),
                    "job_id": job_id,
                    "collection": item.collection,
                }
            )
            new_items.append(
                _WorkItem(
                    doc_id,
                    IngestSource(
                        kind="file", title=loaded.title, path=src.path, source_path=source_path, tags=src.tags
                    ),
                    loaded=loaded,
                    collection=item.collection,
                )
            )
        for start in range(0, len(rows), CATALOG_BATCH):
            tracker.check_cancel()
            self._c.catalog.add_documents(rows[start : start + CATALOG_BATCH])
            # Recorded at once, so a restart (recover) or a cancel finds every document of the job.
            written = len(items) + min(start + CATALOG_BATCH, len(rows))
            self._c.catalog.update_job(job_id, document_ids=[i.document_id for i in (items + new_items)[:written]])
        return new_items

    def _accept_parsed(
        self,
        item: _WorkItem,
        loaded: LoadedDocument,
        job_id: str,
        seen_hashes: dict[str, str],
        errors: list[dict[str, Any]],
        duplicates: list[str],
    ) -> None:
        existing = self._c.catalog.find_by_hash(loaded.content_hash, ACTIVE_DOCUMENT_STATUSES, item.collection)
        duplicate_of = seen_hashes.get(loaded.content_hash)
        if existing is not None and existing.job_id != job_id:
            duplicate_of = existing.id
        if duplicate_of is None:
            seen_hashes[loaded.content_hash] = item.document_id
            item.loaded = loaded
            metadata = dict(loaded.metadata)
            if FILE_HASH_KEY in item.source.metadata:
                metadata[FILE_HASH_KEY] = item.source.metadata[FILE_HASH_KEY]
            self._c.catalog.set_content_hash(item.document_id, loaded.content_hash, metadata)
            if loaded.title != item.source.title:
                self._c.catalog.set_title(item.document_id, loaded.title)
            return
        # Same content is already stored: keep one copy and report this one as a duplicate.
        self._c.catalog.delete_document(item.document_id)
        item.failed = f"duplicate of {duplicate_of}"
        duplicates.append(item.document_id)
        errors.append(
            {
                "source": item.source.source_path or item.source.title,
                "error": f"duplicate of document {duplicate_of}",
                "code": "duplicate",
                "document_id": duplicate_of,
            }
        )

    def _chunk(self, items: list[_WorkItem], tracker: _Progress, errors: list[dict[str, Any]]) -> None:
        from ingest.chunker import Chunker

        live = [i for i in items if i.failed is None]
        tracker.stage("chunk", len(live))
        limits = self._c.settings.ingest
        chunker = Chunker.from_settings(self._c.engine.tokenizer, limits)
        job_tokens = 0
        for n, item in enumerate(live, 1):
            tracker.check_cancel()
            assert item.loaded is not None
            item.chunks = chunker.chunk_document(item.loaded)
            num_tokens = sum(len(c.token_ids) for c in item.chunks)
            problem: tuple[str, str] | None = None
            if not item.chunks:
                problem = ("document has no text to index", "empty_document")
            elif num_tokens > limits.max_document_tokens:
                problem = (
                    f"document has {num_tokens} tokens in {len(item.chunks)} chunks; the limit is "
                    f"{limits.max_document_tokens} (ingest.max_document_tokens)",
                    "too_large",
                )
            elif job_tokens + num_tokens > limits.max_job_tokens:
                problem = (
                    f"the job reached {limits.max_job_tokens} tokens (ingest.max_job_tokens) before "
                    f"this document's {num_tokens}",
                    "job_too_large",
                )
            if problem is not None:
                item.chunks = []
                self._fail_document(item, problem[0])
                errors.append(
                    {"source": item.source.source_path or item.source.title, "error": problem[0], "code": problem[1]}
                )
            else:
                job_tokens += num_tokens
            tracker.advance(n)

    def _embed(self, items: list[_WorkItem], tracker: _Progress) -> None:
        from retrieval.types import IndexedChunk

        live = [i for i in items if i.failed is None]
        total = sum(len(i.chunks) for i in live)
        tracker.stage("embed", total)
        # Ids are not assigned until commit; embedding only reads text and title. Chunks of all documents
        # go through the embedder in full batches (one document per call was ~30x slower on short docs).
        flat = [
            (
                item,
                IndexedChunk(
                    chunk_id=c.index,
                    document_id=item.document_id,
                    text=c.text,
                    title=item.loaded.title if item.loaded else "",
                ),
            )
            for item in live
            for c in item.chunks
        ]
        batch = max(1, self._c.settings.retrieval.embed_batch_size)
        parts = []
        for start in range(0, len(flat), batch):
            tracker.check_cancel()
            parts.append(self._c.retriever.embed_chunks([chunk for _, chunk in flat[start : start + batch]]))
            tracker.advance(min(start + batch, total))
        if not parts:
            return
        import numpy as np

        vectors = np.concatenate(parts)  # (num_chunks, dim), in item order
        offset = 0
        for item in live:
            item.vectors = vectors[offset : offset + len(item.chunks)]
            offset += len(item.chunks)

    def _precompute_kv(self, items: list[_WorkItem], tracker: _Progress, errors: list[dict[str, Any]]) -> None:
        from engine.scheduler import PrefillPriority
        from kvcache.writer import ensure_chunk_kv

        engine = self._c.engine
        live = [i for i in items if i.failed is None]
        token_ids = [chunk.token_ids for item in live for chunk in item.chunks]
        tracker.stage("kv", len(token_ids))
        for item in live:
            item.kv_keys = [self._c.expected_kv_key(chunk.token_ids) for chunk in item.chunks]
            with self._inflight_lock:
                self._inflight_keys.update(item.kv_keys)

        def on_batch(num_done: int) -> None:
            tracker.check_cancel()
            tracker.advance(num_done)

        tracker.check_cancel()

        # Content-addressed: a chunk already stored (same text, model and prompt) costs nothing. The rest is
        # prefilled KV_BATCH_CHUNKS at a time (exactly the same KV as one at a time; on short chunks the
        # per-layer overhead otherwise dominates), by the scheduler between questions' work, so ingest never
        # delays an answer by more than one unit. A chunk precompute is a plain prefill of the chunk behind
        # the cached prefix, so its compute time feeds the full-prefill estimate (short prompts prefill
        # faster per token than long ones: until a full-mode answer is observed it is on the low side).
        written = ensure_chunk_kv(
            self._c.store,
            token_ids,
            model_fingerprint=engine.fingerprint,
            prefix_ids=engine.prompt.prefix_ids,
            compute=lambda todo: self._scheduler.prefill_chunks(
                todo,
                priority=PrefillPriority.INGEST,
                on_unit=self._prefill_rate.observe if self._prefill_rate is not None else None,
            ),
            batch_chunks=KV_BATCH_CHUNKS,
            on_batch=on_batch,
        )
        tracker.advance(len(token_ids))
        tracker.add_kv(written.num_bytes_written, written.num_tokens_written)  # the cache's bill
        if written.unwritten:
            self._fail_unstored(live, set(written.unwritten), errors)

    def _fail_unstored(self, live: list[_WorkItem], unstored: set[str], errors: list[dict[str, Any]]) -> None:
        """Documents with KV that could not be stored fail (their chunks are not committed): a job never reads
        `succeeded` while part of its KV lives only in memory."""
        message_tail = "could not be written to the KV store (disk full or unwritable; see /ready and the logs)"
        self._storage_fault(f"KV write failed for {len(unstored)} chunk(s)")
        for item in live:
            missing = sum(1 for k in item.kv_keys if k in unstored)
            if missing:
                message = f"the KV of {missing} of {len(item.kv_keys)} chunks {message_tail}"
                self._fail_document(item, message)
                errors.append(
                    {
                        "source": item.source.source_path or item.source.title,
                        "error": message,
                        "code": "kv_write_failed",
                    }
                )

    def _commit(self, items: list[_WorkItem], tracker: _Progress) -> int:
        from retrieval.types import IndexedChunk

        live = [i for i in items if i.failed is None]
        tracker.stage("commit", len(live))
        tracker.check_cancel(force=True)
        catalog, retriever = self._c.catalog, self._c.retriever
        num_chunks = 0
        for n, item in enumerate(live, 1):
            doc = catalog.get_document(item.document_id)
            assert doc is not None and item.vectors is not None
            chunk_ids = catalog.replace_chunks(
                item.document_id,
                [
                    NewChunk(
                        index=c.index,
                        text=c.text,
                        token_ids=list(c.token_ids),
                        page=c.page,
                        char_start=c.char_start,
                        char_end=c.char_end,
                        kv_key=key,
                        embedding=vector,
                    )
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
            tracker.advance(n)
        retriever.save()
        for item in live:
            catalog.set_document_status(item.document_id, DocumentStatus.READY)
            # Re-ingest of a changed file: the new version is live, now drop the old one. Only versions from
            # earlier jobs: two sources of one request never replace each other (that lost an upload).
            if item.source.source_path:
                for old in catalog.find_by_source(
                    item.source.source_path, exclude_id=item.document_id, collection=item.collection
                ):
                    if old.job_id == tracker.job_id:
                        continue
                    logger.info("replacing document %s (%s)", old.id, item.source.source_path)
                    self.delete_document(old.id)
        return num_chunks

    # ---- deletion --------------------------------------------------------------------------------

    def delete_document(self, document_id: str) -> bool:
        """Delete a document with its chunks, index entries and (unshared) KV entries. Idempotent."""
        deleted = self._c.catalog.delete_document(document_id)
        if deleted is None:
            return False
        self._drop_chunks(deleted)
        return True

    def purge_failed(self, collections: Collection[str] | None = None) -> int:
        """Delete every failed document (of `collections`; None: all) with whatever chunks it had, in bulk;
        returns how many."""
        num_deleted, chunks = self._c.catalog.delete_documents_with_status(DocumentStatus.FAILED, collections)
        self._drop_chunks(chunks)
        logger.info("purged %d failed documents", num_deleted)
        return num_deleted

    def _drop_chunks(self, deleted: list[ChunkRecord]) -> None:
        """Index entries and unshared KV entries of chunks just deleted from the catalog."""
        if not deleted:
            return
        self._c.retriever.remove([c.id for c in deleted])
        keys = {c.kv_key for c in deleted if c.kv_key}
        still_used = self._c.catalog.referenced_kv_keys(keys)
        with self._inflight_lock:
            still_used |= keys & self._inflight_keys
        for key in keys - still_used:  # first: it frees the space the snapshot below needs
            self._c.store.delete(key)
        try:
            self._c.retriever.save()
        except OSError as exc:
            if not is_storage_full(exc):
                raise
            # The catalog (the truth) and the in-memory index are right; the snapshot is written at the next
            # save, or brought level with the catalog at the next start.
            logger.warning("index snapshot not saved after a deletion (disk full): %s", exc)
            self._storage_fault(f"{type(exc).__name__}: {exc}")

    def _drop_unused_kv(self, items: list[_WorkItem], *, failed_only: bool) -> None:
        """KV entries this job stored for documents that then failed, which no committed chunk uses: left
        behind they would only fill the disk (on a full disk, deleting them is what makes room)."""
        keys = {k for i in items if (i.failed is not None or not failed_only) for k in i.kv_keys}
        if not keys:
            return
        try:
            keep = self._c.catalog.referenced_kv_keys(keys)
            if failed_only:
                keep |= {k for i in items if i.failed is None for k in i.kv_keys}
            for key in keys - keep:
                self._c.store.delete(key)
        except Exception as exc:  # best effort: doctor --repair removes what is left
            logger.warning("could not remove the KV entries of failed documents: %s", exc)

    # ---- helpers ---------------------------------------------------------------------------------

    def _fail_document(self, item: _WorkItem, message: str) -> None:
        item.failed = message
        if self._c.catalog.get_document(item.document_id) is not None:
            self._c.catalog.set_document_status(item.document_id, DocumentStatus.FAILED, error=message)

    def _finish_cancelled(self, job_id: str, errors: list[dict[str, Any]]) -> None:
        job = self._c.catalog.get_job(job_id)
        if job is None:
            return
        dropped = self._c.catalog.fail_pending(job.document_ids, "ingest cancelled")
        if dropped:
            self._c.retriever.remove(dropped)
        self._c.catalog.update_job(job_id, status=JobStatus.CANCELLED, errors=errors)


class _Progress:
    """Writes stage progress to the job row (throttled) and tells an optional listener."""

    def __init__(self, components: Components, job_id: str, listener: ProgressCallback | None) -> None:
        self._c = components
        self.job_id = job_id
        self._listener = listener
        self._progress: dict[str, dict[str, int]] = {s: {"done": 0, "total": 0} for s in STAGES}
        self._stage = STAGES[0]
        self._last_write = 0.0
        self._last_cancel_check = float("-inf")

    def stage(self, name: str, total: int) -> None:
        self._stage = name
        self._progress[name] = {"done": 0, "total": total}
        self._write(force=True)

    def advance(self, done: int) -> None:
        self._progress[self._stage]["done"] = done
        self._write(force=done >= self._progress[self._stage]["total"])

    def add_kv(self, num_bytes: int, num_tokens: int) -> None:
        """KV bytes (as stored) and tokens this job added: the kv stage's `bytes` and `tokens`."""
        kv = self._progress["kv"]
        kv["bytes"] = kv.get("bytes", 0) + num_bytes
        kv["tokens"] = kv.get("tokens", 0) + num_tokens

    def grow(self, extra: int) -> None:
        """The current stage has `extra` more items than announced (records found while parsing)."""
        self._progress[self._stage]["total"] += extra

    def check_cancel(self, force: bool = False) -> None:
        """Raise JobCancelled once a cancel was requested. Looked up at most every CANCEL_POLL_S inside a
        stage; `force` looks now (before the commit, the last point where a cancel can still take effect)."""
        now = time.monotonic()
        if not force and now - self._last_cancel_check < CANCEL_POLL_S:
            return
        self._last_cancel_check = now
        job = self._c.catalog.get_job(self.job_id)
        if job is not None and job.cancel_requested:
            raise JobCancelled()

    def emit(self) -> JobRecord:
        job = self._c.catalog.get_job(self.job_id)
        assert job is not None
        if self._listener is not None:
            self._listener(job)
        return job

    def _write(self, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last_write < 0.25:
            return
        self._last_write = now
        self._c.catalog.update_job(
            self.job_id, stage=self._stage, progress={k: dict(v) for k, v in self._progress.items()}
        )
        self.emit()


MAX_FILENAME_BYTES = 255  # what common file systems store in one path component


def check_upload_name(filename: str) -> str:
    """The base name an upload is stored under; IngestError for one no file system can store."""
    name = Path(filename.replace("\\", "/")).name
    if "\x00" in filename:
        raise IngestError(f"file name {filename!r} contains a NUL character")
    if len(name.encode("utf-8", errors="surrogatepass")) > MAX_FILENAME_BYTES:
        raise IngestError(f"file name {name[:40]!r}… is longer than {MAX_FILENAME_BYTES} bytes")
    if not is_valid_utf8(name):
        raise IngestError(f"file name {name!r} is not valid Unicode")
    return name or "upload"


def save_upload(uploads_dir: Path, job_hint: str, index: int, filename: str, data_path: Path) -> Path:
    """Move an uploaded temp file under the data dir so the job can be re-run after a restart.

    Each file of a request gets its own directory (`<batch>/<index>/<name>`): two files with the same name
    in one request are two uploads, never one overwriting the other, and each keeps its own name.
    """
    target_dir = uploads_dir / job_hint / str(index)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / check_upload_name(filename)
    try:
        shutil.move(str(data_path), target)
    except BaseException:
        data_path.unlink(missing_ok=True)
        raise
    return target
