"""Accepting a request to ingest: the caps, each source's identity, duplicates, and the job with its documents.

Content already stored (same text, or the same file bytes) is answered with the existing document's id
right away, so every id in the 202 resolves. Everything a job and its documents are created with is
built here (`create_job`, `new_document`), so a new field of theirs is added in one place.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from app.catalog import DocumentStatus
from app.catalog.models import DEFAULT_COLLECTION
from app.catalog.records import JobUpdate, NewDocument
from app.services.ingest.types import (
    ACTIVE_DOCUMENT_STATUSES,
    FILE_HASH_KEY,
    STAGES,
    IngestError,
    IngestSource,
    IngestTooLarge,
    JobError,
    SubmitResult,
    error_rows,
)
from app.services.text_checks import is_blank

if TYPE_CHECKING:
    from app.catalog import Catalog
    from app.catalog.records import DocumentRecord
    from app.services.document_service import DocumentService
    from ingest.config import IngestSettings
    from ingest.types import LoadedDocument

logger = logging.getLogger(__name__)

Identity = tuple[str, str]  # ("text", content hash) or ("file", SHA-256 of the bytes)


def check_caps(sources: list[IngestSource], limits: IngestSettings, count_tokens: Callable[[str], int]) -> None:
    """Refuse a request that is empty or over a cap before anything is stored. Inline text is counted
    now; a file's tokens are counted when it is chunked."""
    if not sources:
        raise IngestError("nothing to ingest: give at least one document or file")
    if len(sources) > limits.max_job_documents:
        raise IngestTooLarge(
            f"{len(sources)} documents in one request; the limit is "
            f"{limits.max_job_documents} (ingest.max_job_documents)"
        )
    job_tokens = 0
    for s in sources:
        if s.kind != "text":
            continue
        if is_blank(s.text or ""):
            raise IngestError(f"document {s.title!r} has no text")
        num_tokens = count_tokens(s.text or "")
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


def with_file_hash(source: IngestSource) -> IngestSource:
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


def identity_of(
    catalog: Catalog, source: IngestSource, collection: str
) -> tuple[Identity | None, DocumentRecord | None]:
    """(what makes two sources the same, an active stored document of `collection` that is the same: the
    same text in two collections is two documents, each visible to its own keys)."""
    from ingest.errors import LoaderError
    from ingest.loaders import load_text

    if source.kind == "text":
        try:
            loaded = load_text(
                source.text or "", source.title, source_path=source.source_path, metadata=source.metadata
            )
        except LoaderError:
            return None, None  # parse reports it
        stored = catalog.find_by_hash(loaded.content_hash, ACTIVE_DOCUMENT_STATUSES, collection)
        return ("text", loaded.content_hash), stored
    if FILE_HASH_KEY in source.metadata:
        digest = str(source.metadata[FILE_HASH_KEY])
        return ("file", digest), catalog.find_by_metadata(FILE_HASH_KEY, digest, ACTIVE_DOCUMENT_STATUSES, collection)
    return None, None


def find_duplicate(stored: DocumentRecord | None, earlier: str | None, job_id: str) -> str | None:
    """The id of the document a source duplicates, if any: an active stored document of another job
    first, else the first document of this job with the same content (`earlier`)."""
    if stored is not None and stored.job_id != job_id:
        return stored.id
    return earlier


def replace_failed(catalog: Catalog, documents: DocumentService, identity: Identity, collection: str) -> None:
    """A retry of content whose earlier ingest failed replaces the failed document(s), so retries after
    a failure do not pile up failed copies of the same bytes."""
    kind, digest = identity
    failed = (DocumentStatus.FAILED,)
    while True:
        if kind == "file":
            old = catalog.find_by_metadata(FILE_HASH_KEY, digest, failed, collection)
        else:
            old = catalog.find_by_hash(digest, failed, collection)
        if old is None or not documents.delete_document(old.id):
            return
        logger.info("replacing failed document %s with a retry of the same content", old.id)


def new_document(
    source: IngestSource, job_id: str, loaded: LoadedDocument | None = None, collection: str = DEFAULT_COLLECTION
) -> NewDocument:
    """A new pending document for `source` (parsed already when `loaded` is given)."""
    return NewDocument(
        title=loaded.title if loaded is not None else source.title,
        source_path=source.source_path,
        content_hash=loaded.content_hash if loaded is not None else None,
        tags=source.tags,
        metadata=dict(loaded.metadata) if loaded is not None else source.metadata,
        job_id=job_id,
        collection=collection,
    )


def create_job(
    catalog: Catalog, documents: DocumentService, sources: list[IngestSource], collection: str = DEFAULT_COLLECTION
) -> SubmitResult:
    """The queued job with a pending document per new source, all in `collection`; duplicates (within it)
    are answered with the stored document's id and reported in the job's errors. Sources are checked
    (`check_caps`) before."""
    sources = [with_file_hash(s) for s in sources]
    job = catalog.create_job({}, collection=collection)
    fresh: list[IngestSource] = []
    fresh_ids: list[str] = []
    duplicates: list[JobError] = []
    document_ids: list[str] = []
    first_of: dict[Identity, str] = {}  # identity → document id within this request
    for s in sources:
        identity, stored = identity_of(catalog, s, collection)
        dup = find_duplicate(stored, first_of.get(identity) if identity is not None else None, job.id)
        if dup is not None:
            duplicates.append(JobError.duplicate(s.label, dup))
            document_ids.append(dup)
            continue
        if identity is not None:
            replace_failed(catalog, documents, identity, collection)
        doc = catalog.add_document(new_document(s, job.id, collection=collection))
        if identity is not None:
            first_of[identity] = doc.id
        fresh.append(s)
        fresh_ids.append(doc.id)
        document_ids.append(doc.id)
    catalog.update_job(
        job.id,
        JobUpdate(
            spec={"sources": [s.to_spec() for s in fresh], "duplicates": error_rows(duplicates)},
            document_ids=fresh_ids,
            duplicate_ids=[d.document_id for d in duplicates],
            errors=error_rows(duplicates),
            progress={stage: {"done": 0, "total": 0} for stage in STAGES},
        ),
    )
    return SubmitResult(job_id=job.id, document_ids=document_ids)
