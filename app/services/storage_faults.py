"""Storage faults (disk full, database full): recognised once, remembered, and reported.

`is_storage_full(exc)` says whether an exception means "no space": OSError ENOSPC/EDQUOT, or SQLite's
"database or disk is full" (SQLITE_FULL) however SQLAlchemy wrapped it. The HTTP layer answers those 507;
`StorageMonitor` remembers the last fault so /ready and the admin stats can show it, with the free space
under the data dir.
"""

from __future__ import annotations

import errno
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
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
    def __init__(self, data_dir: Path, min_free_bytes: int = 64 * 1024 * 1024) -> None:
        self._data_dir = data_dir
        self._min_free_bytes = min_free_bytes
        self._lock = threading.Lock()
        self._last: tuple[str, float] | None = None

    def record(self, message: str) -> None:
        with self._lock:
            self._last = (message, time.time())

    def clear(self) -> None:
        with self._lock:
            self._last = None

    def status(self, recent_s: float = 600.0) -> StorageStatus:
        try:
            free: int | None = shutil.disk_usage(self._data_dir).free
        except OSError:
            free = None
        with self._lock:
            last = self._last
        recent = last is not None and time.time() - last[1] < recent_s
        ok = not recent and (free is None or free >= self._min_free_bytes)
        return StorageStatus(
            ok=ok, free_bytes=free, last_fault=last[0] if last else None, last_fault_at=last[1] if last else None
        )
