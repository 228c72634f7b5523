"""What a sync must do to make a collection equal to a folder, decided from the folder's manifest and the
collection's documents alone (no I/O: the server plans and finishes with the same rules).

A file is identified by its source path (relative to the folder) and the SHA-256 of its bytes, which ingest
records on the document (`file_sha256`). A JSON / JSONL file's records past the first are documents of their
own under `path#n`: they belong to the file `path`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.catalog import DocumentStatus
from app.catalog.records import DocumentRecord
from app.services.ingest.types import FILE_HASH_KEY

RECORD_SUFFIXES = (".json", ".jsonl")


@dataclass(frozen=True)
class SyncManifest:
    """The folder as the scan found it: each ingestible file's SHA-256 by source path, and the sources (or
    folders, with a trailing "/") that could not be read now, whose stored documents are kept as they are."""

    files: dict[str, str]
    held: list[str] = field(default_factory=list)

    def is_held(self, source: str) -> bool:
        return any(source == h or (h.endswith("/") and (h == "./" or source.startswith(h))) for h in self.held)


@dataclass(frozen=True)
class SyncPlan:
    new: list[str]  # files no document of the collection came from
    changed: list[str]  # files whose stored version has other bytes
    upload: list[str]  # the new and changed files to ingest (content the collection serves already is not)
    num_unchanged: int
    remove: dict[str, list[str]]  # source -> its documents' ids, for sources the folder no longer has
    busy_jobs: list[str]  # jobs still ingesting documents of these sources: waited for, then planned again


def base_source(source_path: str) -> str:
    """The file a document came from: "data.jsonl#3" -> "data.jsonl" (a record of it); others as they are."""
    base, sep, tail = source_path.rpartition("#")
    if sep and tail.isdigit() and base.lower().endswith(RECORD_SUFFIXES):
        return base
    return source_path


def source_of(doc: DocumentRecord) -> str:
    """The source a document is grouped under: its file, or (no source path: text sent without one) its id."""
    return base_source(doc.source_path) if doc.source_path else f"(document {doc.id}: {doc.title})"


def by_source(docs: Iterable[DocumentRecord]) -> dict[str, list[DocumentRecord]]:
    grouped: dict[str, list[DocumentRecord]] = defaultdict(list)
    for doc in docs:
        grouped[source_of(doc)].append(doc)
    return grouped


def is_head(doc: DocumentRecord, source: str, sha256: str, statuses: tuple[DocumentStatus, ...]) -> bool:
    """`doc` is the file `source` with exactly these bytes (its first document, the one that carries the hash)."""
    return doc.source_path == source and doc.status in statuses and doc.metadata.get(FILE_HASH_KEY) == sha256


def served_content(manifest: SyncManifest, grouped: dict[str, list[DocumentRecord]]) -> set[str]:
    """The file hashes of the folder that a document of their own file already holds (ready or on its way)."""
    live = (DocumentStatus.READY, DocumentStatus.PENDING)
    return {
        sha
        for source, sha in manifest.files.items()
        if any(is_head(d, source, sha, live) for d in grouped.get(source, ()))
    }


def plan_sync(manifest: SyncManifest, docs: Iterable[DocumentRecord]) -> SyncPlan:
    grouped = by_source(docs)
    live = (DocumentStatus.READY, DocumentStatus.PENDING)
    stored = served_content(manifest, grouped)
    planned: set[str] = set()
    new: list[str] = []
    changed: list[str] = []
    upload: list[str] = []
    num_unchanged = 0
    for source, sha in sorted(manifest.files.items()):
        versions = grouped.get(source, [])
        if any(is_head(d, source, sha, live) for d in versions):
            num_unchanged += 1
            continue
        stale = [d for d in versions if d.status != DocumentStatus.FAILED or d.metadata.get(FILE_HASH_KEY) != sha]
        if sha in stored and not stale:  # the bytes of another file, stored once under that file's path
            num_unchanged += 1
            continue
        (changed if stale else new).append(source)
        if sha not in stored and sha not in planned:  # identical files of one sync are ingested once
            upload.append(source)
            planned.add(sha)
    remove = {
        source: [d.id for d in versions]
        for source, versions in sorted(grouped.items())
        if source not in manifest.files and not manifest.is_held(source)
    }
    busy = sorted(
        {
            d.job_id
            for source, versions in grouped.items()
            if source in manifest.files or source in remove
            for d in versions
            if d.status == DocumentStatus.PENDING and d.job_id
        }
    )
    return SyncPlan(new, changed, upload, num_unchanged, remove, busy)
