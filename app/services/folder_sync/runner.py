"""One sync of a folder, run where the folder is: scan, plan, copy the files to ingest, ingest them, finish.

The same steps whether the collection lives in this process (`LocalTarget`) or on a running server
(`RemoteTarget`, targets.py): the target plans and finishes with `FolderSyncService` and ingests through the
ordinary ingest. Each file to ingest is first copied while it is hashed, so what is ingested is one state of
the file with the hash it is recorded under, even when it changes during the sync; a file that changes while
it is copied is held for the next sync.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from app.services.folder_sync.plan import SyncManifest, SyncPlan
from app.services.folder_sync.scan import FileState, FolderScan, ScannedFile, SkippedFile, current_state, scan_folder
from app.services.folder_sync.service import Removal, SyncOutcome, SyncRequest

logger = logging.getLogger(__name__)

MAX_BUSY_WAITS = 3  # plans that may find documents still being ingested by other jobs before going on anyway
COPY_BLOCK = 1 << 20


@dataclass(frozen=True)
class Snapshot:
    """A copy of a file taken for its ingest, with the SHA-256 of the copied bytes."""

    source: str
    path: Path
    sha256: str


@dataclass
class IngestResult:
    """What the ingest jobs of a sync did: their ids, statuses and errors, and their KV bill."""

    job_ids: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    kv: dict[str, float] = field(default_factory=dict)  # bytes, tokens, computed, seconds (summed over jobs)

    def add_job(self, job_id: str, status: str, errors: list[dict[str, Any]], progress: dict[str, Any]) -> None:
        self.job_ids.append(job_id)
        self.statuses.append(status)
        self.errors += [e for e in errors if e.get("code") != "duplicate"]
        for name, value in (progress.get("kv") or {}).items():
            if name in ("bytes", "tokens", "computed", "seconds", "total") and isinstance(value, int | float):
                self.kv[name] = self.kv.get(name, 0) + value


class SyncTarget(Protocol):
    """Where the collection lives: this process's services, or a server over HTTP."""

    def plan(self, request: SyncRequest) -> SyncPlan: ...

    def wait(self, job_id: str) -> None: ...

    def ingest(self, files: list[Snapshot], collection: str) -> IngestResult: ...

    def remove_gone(self, request: SyncRequest) -> Removal: ...

    def finish(self, request: SyncRequest, plan: SyncPlan, num_skipped: int, removed: list[str]) -> SyncOutcome: ...

    def snapshot_dir(self) -> Path:
        """An empty folder the copies to ingest go into, removed by `run_sync` once the jobs ended."""
        ...


@dataclass
class SyncReport:
    scan: FolderScan
    plan: SyncPlan
    outcome: SyncOutcome
    ingest: IngestResult
    skipped: list[SkippedFile]  # the scan's and the copies' (changed while copied, gone)
    changed_during: list[str]  # files whose state changed after they were scanned: the next sync takes them
    seconds: float = 0.0


def run_sync(
    root: Path,
    target: SyncTarget,
    collection: str,
    *,
    extensions: Collection[str],
    max_file_bytes: int,
    replace_collection: bool = False,
    clock: Callable[[], float] | None = None,
) -> SyncReport:
    """Make `collection` equal to the folder `root`. FolderError for a path that is no readable folder,
    SyncRefused when the collection follows another folder or would lose documents it did not get from it."""
    import time

    clock = clock or time.monotonic
    started = clock()
    root = root.resolve()
    scan = scan_folder(root, extensions, max_file_bytes)
    manifest = SyncManifest(files={f.source: f.sha256 for f in scan.files}, held=scan.held)
    request = SyncRequest(collection, str(root), manifest, replace_collection)
    plan = target.plan(request)
    for _ in range(MAX_BUSY_WAITS):  # an earlier sync's job still running: wait for it, then look again
        if not plan.busy_jobs:
            break
        for job_id in plan.busy_jobs:
            target.wait(job_id)
        plan = target.plan(request)
    removal = target.remove_gone(request)
    files = scan.by_source()
    skipped = list(scan.skipped)
    into = target.snapshot_dir()
    try:
        snapshots, dropped = _snapshot([files[s] for s in plan.upload], into)
        skipped += dropped
        request, plan = _without(request, plan, snapshots, dropped)
        ingested = target.ingest(snapshots, collection) if snapshots else IngestResult()
    finally:
        shutil.rmtree(into, ignore_errors=True)
    outcome = target.finish(request, plan, len(skipped), removal.removed)
    changed_during = [f.source for f in scan.files if current_state(f.path) != f.state]
    return SyncReport(scan, plan, outcome, ingested, skipped, changed_during, clock() - started)


def _snapshot(files: list[ScannedFile], into: Path) -> tuple[list[Snapshot], list[SkippedFile]]:
    """Copies of `files` under `into` (`<n>/<name>`), hashed as they are copied; a file that is gone or
    changed while it was copied is left out (held: the next sync takes it)."""
    import hashlib

    copies: list[Snapshot] = []
    dropped: list[SkippedFile] = []
    for n, f in enumerate(files):
        target = into / str(n) / f.path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        try:
            before = FileState.of(f.path.stat())
            with f.path.open("rb") as src, target.open("wb") as dst:
                while block := src.read(COPY_BLOCK):
                    digest.update(block)
                    dst.write(block)
            after = current_state(f.path)
        except FileNotFoundError:
            dropped.append(SkippedFile(f.source, "deleted during the sync", held=False))
            continue
        except OSError as exc:
            dropped.append(SkippedFile(f.source, f"cannot read: {exc.strerror or exc}"))
            continue
        if after != before:
            dropped.append(SkippedFile(f.source, "changed while it was copied: taken at the next sync"))
            continue
        copies.append(Snapshot(f.source, target, digest.hexdigest()))
    return copies, dropped


def _without(
    request: SyncRequest, plan: SyncPlan, copies: list[Snapshot], dropped: list[SkippedFile]
) -> tuple[SyncRequest, SyncPlan]:
    """The request and plan as the copies left them: a file's hash is its copy's (it may have changed since the
    scan); a file gone since is not in the folder; one that changed while copied is held."""
    files = dict(request.manifest.files)
    files.update({c.source: c.sha256 for c in copies})
    gone = {d.source for d in dropped if not d.held}
    held = [d.source for d in dropped if d.held]
    for source in [*gone, *held]:
        files.pop(source, None)
    manifest = SyncManifest(files=files, held=[*request.manifest.held, *held])
    out = gone | set(held)
    plan = replace(
        plan,
        new=[s for s in plan.new if s not in out],
        changed=[s for s in plan.changed if s not in out],
        upload=[c.source for c in copies],
    )
    return replace(request, manifest=manifest), plan
