"""A job's progress per stage, written to its job row (throttled), and the cancel check between steps."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.catalog.records import JobUpdate
from app.services.ingest.types import STAGES, JobCancelled, JobInterrupted

if TYPE_CHECKING:
    from app.catalog import Catalog
    from app.catalog.records import JobRecord

CANCEL_POLL_S = 0.2  # how often a running job looks for a cancel request
WRITE_EVERY_S = 0.25  # how often progress inside a stage is written to the job row

ProgressCallback = Callable[["JobRecord"], None]


class Progress:
    """Writes stage progress to the job row (throttled) and tells an optional listener."""

    def __init__(
        self,
        catalog: Catalog,
        job_id: str,
        listener: ProgressCallback | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        """`stopping`: set when the process shuts down; the job then stops at its next check (JobInterrupted)."""
        self._catalog = catalog
        self.job_id = job_id
        self._listener = listener
        self._stopping = stopping
        self._progress: dict[str, dict[str, int]] = {s: {"done": 0, "total": 0} for s in STAGES}
        self._stage = STAGES[0]
        self._last_write = 0.0
        self._last_cancel_check = float("-inf")

    def counts(self) -> dict[str, dict[str, int]]:
        """A copy of the counts per stage, as the job row holds them."""
        return {k: dict(v) for k, v in self._progress.items()}

    def stage(self, name: str, total: int) -> None:
        self._stage = name
        self._progress[name] = {"done": 0, "total": total}
        self._write(force=True)

    def advance(self, done: int) -> None:
        self._progress[self._stage]["done"] = done
        self._write(force=done >= self._progress[self._stage]["total"])

    def add_kv(self, num_bytes: int, num_tokens: int, num_computed: int = 0, seconds: float = 0.0) -> None:
        """KV bytes (as stored) and tokens this job added: the kv stage's `bytes` and `tokens`; `computed`, the
        chunks whose KV it computed (the others the store held: content-addressed), and `seconds`, the stage's
        time: what a re-ingest of a changed file pays."""
        kv = self._progress["kv"]
        kv["bytes"] = kv.get("bytes", 0) + num_bytes
        kv["tokens"] = kv.get("tokens", 0) + num_tokens
        kv["computed"] = kv.get("computed", 0) + num_computed
        kv["seconds"] = round(kv.get("seconds", 0.0) + seconds, 3)

    def set_ready(self, num_documents: int) -> None:
        """The documents the commit made ready: the commit stage's `ready`, what the job added to the library
        (its duplicates and failures aside, which its errors list)."""
        self._progress["commit"]["ready"] = num_documents
        self._write(force=True)

    def grow(self, extra: int) -> None:
        """The current stage has `extra` more items than announced (records found while parsing)."""
        self._progress[self._stage]["total"] += extra

    def check_cancel(self, force: bool = False) -> None:
        """Raise JobCancelled once a cancel was requested. Looked up at most every CANCEL_POLL_S inside a
        stage; `force` looks now (before the commit, the last point where a cancel can still take effect).
        A shutdown (`stopping`) raises JobInterrupted at once: the job is resumed at the next start."""
        if self._stopping is not None and self._stopping.is_set():
            raise JobInterrupted()
        now = time.monotonic()
        if not force and now - self._last_cancel_check < CANCEL_POLL_S:
            return
        self._last_cancel_check = now
        job = self._catalog.get_job(self.job_id)
        if job is not None and job.cancel_requested:
            raise JobCancelled()

    def emit(self) -> JobRecord:
        job = self._catalog.get_job(self.job_id)
        assert job is not None
        if self._listener is not None:
            self._listener(job)
        return job

    def _write(self, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last_write < WRITE_EVERY_S:
            return
        self._last_write = now
        self._catalog.update_job(self.job_id, JobUpdate(stage=self._stage, progress=self.counts()))
        self.emit()
