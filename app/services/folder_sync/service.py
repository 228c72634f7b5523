"""FolderSyncService: the server's side of `blendrag sync`, planning a sync and finishing it.

`plan` says which files to ingest and which sources are gone; the client ingests those files through the
ordinary ingest (a changed file is a new version of its source path: the old one is served until the new one
is committed, stages.py `replace_older_versions`); `finish` then deletes, through `DocumentService` (chunks,
index entries, unreferenced KV), the documents of files the folder no longer has and the versions a sync left
behind, and records the sync for the admin page. Unchanged chunks of a changed file keep their KV: it is
keyed by content, so only the chunks with new text are computed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.catalog import DocumentStatus
from app.catalog.records import DocumentRecord
from app.catalog.syncs import FolderSyncRecord
from app.services.document_service import DocumentBusy
from app.services.folder_sync.plan import SyncManifest, SyncPlan, by_source, is_head, plan_sync

if TYPE_CHECKING:
    from app.catalog import Catalog
    from app.services.document_service import DocumentService

logger = logging.getLogger(__name__)

MAX_NAMED = 5  # sources a refusal names before "and n more"


class SyncRefused(ValueError):
    """The sync would delete what the user may not mean to lose; the message says what to do instead."""


@dataclass(frozen=True)
class SyncRequest:
    collection: str
    folder: str  # the folder's absolute path where the client runs
    manifest: SyncManifest
    replace: bool = False  # the collection may follow this folder in place of another, or lose what it lacks


@dataclass(frozen=True)
class SyncChanges:
    """What a sync changed, by file: the admin page's line and the CLI's summary."""

    added: int = 0
    changed: int = 0
    removed: int = 0
    unchanged: int = 0
    failed: int = 0
    skipped: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "added": self.added,
            "changed": self.changed,
            "removed": self.removed,
            "unchanged": self.unchanged,
            "failed": self.failed,
            "skipped": self.skipped,
        }


@dataclass(frozen=True)
class SyncOutcome:
    changes: SyncChanges
    record: FolderSyncRecord
    failed: list[str] = field(default_factory=list)  # files whose new version is not ready (the old one served)
    busy: list[str] = field(default_factory=list)  # sources still being ingested by another job: the next sync


@dataclass(frozen=True)
class Removal:
    removed: list[str]  # sources whose documents were deleted
    busy: list[str]  # sources still being ingested by another job: the next sync removes them


def _named(sources: list[str]) -> str:
    shown = ", ".join(sources[:MAX_NAMED])
    return shown + (f" and {len(sources) - MAX_NAMED} more" if len(sources) > MAX_NAMED else "")


class FolderSyncService:
    def __init__(self, catalog: Catalog, documents: DocumentService) -> None:
        self._catalog = catalog
        self._documents = documents

    def plan(self, request: SyncRequest) -> SyncPlan:
        """What the sync must ingest and remove. SyncRefused when the collection follows another folder, or
        (never synced) holds documents the folder lacks, unless `request.replace`."""
        collection = request.collection
        plan = plan_sync(request.manifest, self._catalog.all_documents([collection]))
        record = self._catalog.syncs.get(collection)
        if not request.replace and record is not None and record.folder != request.folder:
            raise SyncRefused(
                f"collection {collection!r} is kept equal to the folder {record.folder}, not {request.folder}: "
                f"sync this folder into another collection (--collection NAME), or pass --replace to make "
                f"{collection!r} follow it (what the other folder brought and this one lacks is deleted)"
            )
        if not request.replace and record is None and plan.remove:
            raise SyncRefused(
                f"collection {collection!r} holds documents of {len(plan.remove)} source(s) that are not files of "
                f"{request.folder} ({_named(list(plan.remove))}); a sync makes the collection equal to the folder "
                f"and would delete them: sync into another collection (--collection NAME), or pass --replace "
                f"to delete them"
            )
        return plan

    def remove_gone(self, request: SyncRequest) -> Removal:
        """Delete the documents of sources the folder no longer has (before the new files are ingested: a new
        file with a deleted one's bytes is then stored under its own path, not answered as that one's copy)."""
        self.plan(request)  # refused as the plan is
        removed, busy = self._delete_gone(request.collection, request.manifest)
        return Removal(removed=removed, busy=busy)

    def _delete_gone(self, collection: str, manifest: SyncManifest) -> tuple[list[str], list[str]]:
        grouped = by_source(self._catalog.all_documents([collection]))
        removed: list[str] = []
        busy: list[str] = []
        for source, versions in sorted(grouped.items()):
            if source in manifest.files or manifest.is_held(source):
                continue
            pending = [d for d in versions if d.status == DocumentStatus.PENDING]
            if pending or not self._delete([d for d in versions if d.status != DocumentStatus.PENDING]):
                busy.append(source)  # a job still ingests it: the next sync removes it
            else:
                removed.append(source)
        return removed, busy

    def _delete(self, docs: list[DocumentRecord]) -> bool:
        """Delete `docs`; False when one was taken up by a job meanwhile."""
        done = True
        for doc in docs:
            try:
                self._documents.delete(doc.id)
            except DocumentBusy:
                done = False
        return done

    def finish(self, request: SyncRequest, plan: SyncPlan, num_skipped: int, removed: list[str]) -> SyncOutcome:
        """After the plan's files were ingested: delete the versions a file's new version left behind (and what
        the folder no longer has, if anything went since `remove_gone`), and record the sync. A file whose new
        version did not become ready keeps its old one (served until a later sync succeeds). `removed`: the
        sources `remove_gone` removed."""
        self.plan(request)  # refused as the plan is
        manifest = request.manifest
        grouped = by_source(self._catalog.all_documents([request.collection]))
        ready = (DocumentStatus.READY,)
        served = {
            sha
            for source, sha in manifest.files.items()
            if any(is_head(d, source, sha, ready) for d in grouped.get(source, ()))
        }
        doomed: list[DocumentRecord] = []
        for source, sha in manifest.files.items():
            versions = grouped.get(source, [])
            heads = {d.job_id for d in versions if is_head(d, source, sha, ready)}
            if heads:  # older versions, a failed try, records a shorter JSON file no longer has
                doomed += [d for d in versions if d.status != DocumentStatus.PENDING and d.job_id not in heads]
            elif sha in served:  # its bytes are another file's, stored once: its own versions are out of date
                doomed += [d for d in versions if d.status != DocumentStatus.PENDING]
        self._delete(doomed)  # a version a job took up meanwhile is left to the next sync
        removed_now, busy = self._delete_gone(request.collection, manifest)
        present = [s for s in (*plan.new, *plan.changed) if manifest.files.get(s) in served]
        failed = sorted(s for s in (*plan.new, *plan.changed) if manifest.files.get(s) not in served)
        changes = SyncChanges(
            added=sum(1 for s in plan.new if s in present),
            changed=sum(1 for s in plan.changed if s in present),
            removed=len({*removed, *removed_now}),
            unchanged=plan.num_unchanged,
            failed=len(failed),
            skipped=num_skipped,
        )
        record = self._catalog.syncs.record(request.collection, request.folder, changes.as_dict())
        logger.info("synced %s into %s: %s", request.folder, request.collection, changes.as_dict())
        return SyncOutcome(changes=changes, record=record, failed=failed, busy=busy)

    def list(self, collections: Collection[str] | None = None) -> list[FolderSyncRecord]:
        """The synced folders (of `collections`; None: all), most recently synced first."""
        return self._catalog.syncs.all(collections)
