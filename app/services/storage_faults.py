"""Storage faults (disk full, database full): recognised once, remembered, and reported.

`is_storage_full(exc)` says whether an exception means "no space": OSError ENOSPC/EDQUOT, or SQLite's
"database or disk is full" (SQLITE_FULL) however SQLAlchemy wrapped it. The HTTP layer answers those 507;
`StorageMonitor` remembers the last fault so /ready and the admin stats can show it, with the free space
under the data dir.

A full disk must still let deletions through (they are how space is freed), but a SQLite transaction —
a DELETE included — needs room for its write-ahead log. So the monitor keeps a small *reserve* file in the
data dir (`storage-reserve`, `RESERVE_BYTES`), created when there is room and released by a deletion that
hits "no space": the deletion is retried in the space it frees, and the reserve comes back once the disk
has room again.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
RESERVE_FILE = "storage-reserve"
RESERVE_BYTES = 8 * 1024 * 1024  # room for the WAL of a deletion and a small index snapshot
_SQLITE_FULL = "database or disk is full"


def is_storage_full(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        if _SQLITE_FULL in str(current).lower():
            return True
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False


@dataclass(frozen=True)
class StorageStatus:
    ok: bool
    free_bytes: int | None  # on the file system of the data dir
    last_fault: str | None
    last_fault_at: float | None  # unix time


class StorageMonitor:
    def __init__(
        self, data_dir: Path, min_free_bytes: int = 64 * 1024 * 1024, reserve_bytes: int = RESERVE_BYTES
    ) -> None:
        self._data_dir = data_dir
        self._min_free_bytes = min_free_bytes
        self._reserve_bytes = reserve_bytes
        self._lock = threading.Lock()
        self._last: tuple[str, float] | None = None
        self._fault_open = False  # the last fault has not been followed by a successful write yet

    @property
    def reserve_path(self) -> Path:
        return self._data_dir / RESERVE_FILE

    def ensure_reserve(self) -> bool:
        """Create the reserve file when it is missing and the disk has room for it twice. Returns whether
        the reserve is in place."""
        path = self.reserve_path
        with self._lock:
            try:
                if path.exists() and path.stat().st_size >= self._reserve_bytes:
                    return True
                if shutil.disk_usage(self._data_dir).free < 2 * self._reserve_bytes:
                    return False
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                try:
                    # Real blocks (not a sparse file): releasing it must free space.
                    os.posix_fallocate(fd, 0, self._reserve_bytes)
                finally:
                    os.close(fd)
                return True
            except OSError as exc:
                logger.warning("could not set aside the %d-byte storage reserve: %s", self._reserve_bytes, exc)
                with contextlib.suppress(OSError):
                    path.unlink()
                return False

    def release_reserve(self) -> bool:
        """Delete the reserve file so a deletion can run on a full disk. Returns whether one was released."""
        with self._lock:
            try:
                self.reserve_path.unlink()
            except FileNotFoundError:
                return False
        logger.warning("disk full: released the %d-byte storage reserve for a deletion", self._reserve_bytes)
        return True

    def record(self, message: str) -> None:
        with self._lock:
            self._last = (message, time.time())
            self._fault_open = True

    def clear(self) -> None:
        with self._lock:
            self._last = None
            self._fault_open = False

    def recovered(self) -> None:
        """A write that needs room (an ingest commit, a stored conversation turn) succeeded: the last fault no
        longer makes the status bad (it stays reported in `last_fault`)."""
        with self._lock:
            self._fault_open = False

    def status(self, recent_s: float = 600.0) -> StorageStatus:
        """`ok`: room left, and no fault in the last `recent_s` that a successful write has not ended since."""
        try:
            free: int | None = shutil.disk_usage(self._data_dir).free
        except OSError:
            free = None
        with self._lock:
            last, fault_open = self._last, self._fault_open
        recent = last is not None and fault_open and time.time() - last[1] < recent_s
        ok = not recent and (free is None or free >= self._min_free_bytes)
        return StorageStatus(
            ok=ok, free_bytes=free, last_fault=last[0] if last else None, last_fault_at=last[1] if last else None
        )
