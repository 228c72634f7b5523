"""Where a sync's collection lives: this process's services (`LocalTarget`, the CLI owning the data dir) or a
running server (`RemoteTarget`, over its HTTP API: POST /syncs/plan, /ingest, /syncs/finish)."""

from __future__ import annotations

import logging
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.services.folder_sync.plan import SyncPlan
from app.services.folder_sync.runner import IngestResult, Snapshot
from app.services.folder_sync.service import Removal, SyncChanges, SyncOutcome, SyncRefused, SyncRequest
from app.services.ingest.types import FILE_HASH_KEY, IngestSource

if TYPE_CHECKING:
    from app.remote import RemoteServer
    from app.services.folder_sync.service import FolderSyncService
    from app.services.ingest import IngestService
    from app.services.ingest.progress import ProgressCallback

logger = logging.getLogger(__name__)

UPLOAD_FILES = 200  # files per upload request (one ingest job each)
UPLOAD_BYTES = 128 * 1024 * 1024  # bytes per upload request, under server.max_upload_bytes' default


class LocalTarget:
    """The collection in this process: plan and finish with the service, ingest jobs run in this thread."""

    def __init__(
        self,
        sync: FolderSyncService,
        ingest: IngestService,
        uploads_dir: Path,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self._sync = sync
        self._ingest = ingest
        self._uploads_dir = uploads_dir
        self._on_progress = on_progress

    def plan(self, request: SyncRequest) -> SyncPlan:
        return self._sync.plan(request)

    def wait(self, job_id: str) -> None:
        """A job of an earlier sync that was interrupted (this process owns the data dir: nothing else runs it)
        is run again to its end."""
        from app.catalog import JobStatus

        job = self._ingest.get_job(job_id)
        if job is None or job.status.finished:
            return
        if job.status == JobStatus.RUNNING:
            self._ingest.reset_interrupted(job)
        self._ingest.run_job(job_id, on_progress=self._on_progress)

    def snapshot_dir(self) -> Path:
        # Under the data dir's uploads: a job interrupted with the process finds its files at the next start.
        path = self._uploads_dir / f"sync-{uuid.uuid4().hex[:12]}"
        path.mkdir(parents=True)
        return path

    def ingest(self, files: list[Snapshot], collection: str) -> IngestResult:
        result = IngestResult()
        sources = [
            IngestSource(
                kind="file",
                title=Path(f.source).name,
                path=str(f.path),
                source_path=f.source,
                metadata={FILE_HASH_KEY: f.sha256},
            )
            for f in files
        ]
        for start in range(0, len(sources), UPLOAD_FILES):
            submitted = self._ingest.submit(sources[start : start + UPLOAD_FILES], enqueue=False, collection=collection)
            job = self._ingest.run_job(submitted.job_id, on_progress=self._on_progress)
            result.add_job(job.id, job.status.value, job.errors, job.progress)
        return result

    def remove_gone(self, request: SyncRequest) -> Removal:
        return self._sync.remove_gone(request)

    def finish(self, request: SyncRequest, plan: SyncPlan, num_skipped: int, removed: list[str]) -> SyncOutcome:
        return self._sync.finish(request, plan, num_skipped, removed)


class RemoteTarget:
    """The collection on a running server: the plan and finish over POST /syncs/…, files uploaded to /ingest."""

    def __init__(self, remote: RemoteServer, on_progress: ProgressCallback | None = None) -> None:
        self._remote = remote
        self._on_progress = on_progress

    def plan(self, request: SyncRequest) -> SyncPlan:
        body = self._refusable(self._remote.sync_plan, request)
        return SyncPlan(
            new=list(body["new"]),
            changed=list(body["changed"]),
            upload=list(body["upload"]),
            num_unchanged=int(body["num_unchanged"]),
            remove={str(k): list(v) for k, v in body["remove"].items()},
            busy_jobs=list(body["busy_jobs"]),
        )

    @staticmethod
    def _refusable(call: Callable[[dict[str, Any]], dict[str, Any]], request: SyncRequest) -> dict[str, Any]:
        """The server's 409 is the same SyncRefused a local sync raises."""
        from app.remote import RemoteError

        try:
            return call(_request_body(request))
        except RemoteError as exc:
            if exc.status == 409 and exc.detail:
                raise SyncRefused(exc.detail) from exc
            raise

    def wait(self, job_id: str) -> None:
        self._remote.wait_job(job_id, self._on_progress)

    def snapshot_dir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="blendrag-sync-"))

    def ingest(self, files: list[Snapshot], collection: str) -> IngestResult:
        result = IngestResult()
        batch: list[Snapshot] = []
        size = 0
        for f in files:
            f_size = f.path.stat().st_size
            if batch and (len(batch) >= UPLOAD_FILES or size + f_size > UPLOAD_BYTES):
                self._upload(batch, collection, result)
                batch, size = [], 0
            batch.append(f)
            size += f_size
        if batch:
            self._upload(batch, collection, result)
        return result

    def _upload(self, batch: list[Snapshot], collection: str, result: IngestResult) -> None:
        accepted = self._remote.ingest_files(
            [f.path for f in batch], [], names=[f.source for f in batch], collection=collection
        )
        job = self._remote.wait_job(accepted["job_id"], self._on_progress)
        result.add_job(job["job_id"], job["status"], job.get("errors") or [], job.get("progress") or {})

    def remove_gone(self, request: SyncRequest) -> Removal:
        body = self._refusable(self._remote.sync_remove, request)
        return Removal(removed=list(body["removed"]), busy=list(body["busy"]))

    def finish(self, request: SyncRequest, plan: SyncPlan, num_skipped: int, removed: list[str]) -> SyncOutcome:
        from datetime import datetime

        from app.catalog.syncs import FolderSyncRecord

        body = self._remote.sync_finish(
            {**_request_body(request), "plan": asdict(plan), "num_skipped": num_skipped, "removed": removed}
        )
        record = body["record"]
        return SyncOutcome(
            changes=SyncChanges(**body["changes"]),
            record=FolderSyncRecord(
                collection=record["collection"],
                folder=record["folder"],
                synced_at=datetime.fromisoformat(record["synced_at"]),
                created_at=datetime.fromisoformat(record["created_at"]),
                changes=dict(record["changes"]),
            ),
            failed=list(body["failed"]),
            busy=list(body["busy"]),
        )


def _request_body(request: SyncRequest) -> dict[str, Any]:
    return {
        "collection": request.collection,
        "folder": request.folder,
        "files": request.manifest.files,
        "held": request.manifest.held,
        "replace": request.replace,
    }
