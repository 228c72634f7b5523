"""Local-disk tier: one safetensors file per entry, LRU within a byte budget.

Layout: `<root>/<key[:2]>/<key>.safetensors` (256 shards keep directories small). Files are written
atomically (`kvcache.atomic`); the LRU order is the file mtime, bumped on every hit, so it survives a
restart: the index (key -> size, least recently used first) is rebuilt by scanning `root` at start,
which also deletes temp files older than `stale_tmp_age_s` left by crashed writers.

Several processes may share `root` (server replicas, the `blendrag cache` CLI): a lookup that misses
the index stats the file and adopts it, and a file deleted behind our back is noticed (fault
"missing_file"), dropped from the index, and reported as a miss.

`DiskTier(root, budget_bytes, *, fsync=True, stale_tmp_age_s=3600.0)`:
`path_for(key)`, `contains(key)`, `nbytes_of(key)`, `put_bytes(key, data, *, overwrite=False) -> bool`
(never raises for I/O: a failed write is a fault, leaves no file, returns False),
`open_reader(key) -> FileEntryReader | None` (caller closes it), `get(key, *, verify=True) ->
StoredEntry | None`, `read_bytes(key)`, `delete(key) -> bool`, `remove_corrupt(key, exc)`, `keys()`
(LRU first), `evict_to(max_bytes) -> list[str]`, `rescan() -> int`, `stats()`. Thread-safe.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from pathlib import Path

from kvcache.atomic import is_temp_name, write_file_atomic
from kvcache.errors import KVEntryCorrupt
from kvcache.format import StoredEntry
from kvcache.keys import check_key
from kvcache.reader import FileEntryReader
from kvcache.stats import TierCounters, TierStats

logger = logging.getLogger(__name__)

ENTRY_SUFFIX = ".safetensors"
_NAME_RE = re.compile(r"^([0-9a-f]{64})\.safetensors$")
_SHARD_RE = re.compile(r"^[0-9a-f]{2}$")


class DiskTier:
    name = "disk"

    def __init__(self, root: Path, budget_bytes: int, *, fsync: bool = True, stale_tmp_age_s: float = 3600.0) -> None:
        if budget_bytes <= 0:
            raise ValueError("disk tier budget must be positive")
        self.root = Path(root)
        self.budget_bytes = budget_bytes
        self.fsync = fsync
        self.stale_tmp_age_s = stale_tmp_age_s
        self.counters = TierCounters()
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()  # key -> file size, least recently used first
        self._num_bytes = 0
        self.root.mkdir(parents=True, exist_ok=True)
        self.rescan()

    # -- index ---------------------------------------------------------------------------------------

    def path_for(self, key: str) -> Path:
        check_key(key)
        return self.root / key[:2] / f"{key}{ENTRY_SUFFIX}"

    def rescan(self) -> int:
        """Rebuild the index from the directory; returns the number of entries found."""
        now = time.time()
        found: list[tuple[float, str, int]] = []
        with os.scandir(self.root) as shards:
            for shard in shards:
                if not (_SHARD_RE.match(shard.name) and shard.is_dir(follow_symlinks=False)):
                    continue
                with os.scandir(shard.path) as files:
                    for f in files:
                        try:
                            st = f.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        if is_temp_name(f.name):
                            if now - st.st_mtime > self.stale_tmp_age_s:
                                with contextlib.suppress(FileNotFoundError):
                                    os.unlink(f.path)
                                logger.info("disk tier: removed stale temp file %s", f.path)
                            continue
                        m = _NAME_RE.match(f.name)
                        if m and m.group(1)[:2] == shard.name and f.is_file(follow_symlinks=False):
                            found.append((st.st_mtime, m.group(1), st.st_size))
        found.sort()
        with self._lock:
            self._index = OrderedDict((key, size) for _, key, size in found)
            self._num_bytes = sum(size for _, _, size in found)
        logger.info("disk tier %s: %d entries, %d bytes", self.root, len(found), self._num_bytes)
        return len(found)

    def _drop(self, key: str) -> bool:
        with self._lock:
            size = self._index.pop(key, None)
            if size is not None:
                self._num_bytes -= size
        return size is not None

    def _record(self, key: str, size: int) -> None:
        """Insert or refresh `key` as most recently used."""
        with self._lock:
            old = self._index.pop(key, None)
            self._num_bytes += size - (old or 0)
            self._index[key] = size

    def _vanished(self, key: str) -> None:
        if self._drop(key):
            self.counters.fault("missing_file")
            logger.warning("disk tier: entry %s was deleted behind the store's back", key[:12])

    def nbytes_of(self, key: str) -> int | None:
        """File size, or None; keeps the index in step with the directory (see module docstring)."""
        path = self.path_for(key)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            self._vanished(key)
            return None
        with self._lock:
            known = self._index.get(key)
        if known != size:
            self._record(key, size)  # written by another process (or replaced)
        return size

    def contains(self, key: str) -> bool:
        return self.nbytes_of(key) is not None

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._index)

    def _touch(self, key: str, size: int) -> None:
        self._record(key, size)
        with contextlib.suppress(OSError):  # persisting the LRU order is best effort
            os.utime(self.path_for(key))

    # -- reads ---------------------------------------------------------------------------------------

    def _open(self, key: str) -> FileEntryReader | None:
        try:
            return FileEntryReader(self.path_for(key), key)
        except FileNotFoundError:
            self._vanished(key)
        except KVEntryCorrupt as exc:
            self.remove_corrupt(key, exc)
        except OSError as exc:
            self.counters.fault("io")
            logger.warning("disk tier: cannot open %s: %s", key[:12], exc)
        return None

    def open_reader(self, key: str) -> FileEntryReader | None:
        """A validated reader (header checked; tensors are verified as they are read), or None."""
        reader = self._open(key)
        if reader is None:
            self.counters.miss()
            return None
        self.counters.hit()
        self._touch(key, reader.nbytes)
        return reader

    def get(self, key: str, *, verify: bool = True) -> StoredEntry | None:
        reader = self._open(key)
        if reader is None:
            self.counters.miss()
            return None
        try:
            entry = reader.read_all(verify=verify)
        except KVEntryCorrupt as exc:
            self.remove_corrupt(key, exc)
            self.counters.miss()
            return None
        finally:
            reader.close()
        self.counters.hit()
        self._touch(key, reader.nbytes)
        return entry

    def read_bytes(self, key: str) -> bytes | None:
        try:
            return self.path_for(key).read_bytes()
        except FileNotFoundError:
            self._vanished(key)
            return None

    # -- writes --------------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes, *, overwrite: bool = False) -> bool:
        path = self.path_for(key)
        size = len(data)
        if size > self.budget_bytes:
            self.counters.rejected()
            logger.warning("disk tier: entry %s (%d B) exceeds the budget %d B", key[:12], size, self.budget_bytes)
            return False
        if not overwrite:
            existing = self.nbytes_of(key)
            if existing is not None:
                self._touch(key, existing)
                return True
        try:
            write_file_atomic(path, data, fsync=self.fsync)
        except OSError as exc:
            kind = "disk_full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "write_failed"
            self.counters.fault(kind)
            logger.warning("disk tier: could not write %s (%s): %s", key[:12], kind, exc)
            return False
        self._record(key, size)
        self.evict_to(self.budget_bytes, keep=key)
        return True

    def delete(self, key: str) -> bool:
        path = self.path_for(key)
        known = self._drop(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return known
        return True

    def remove_corrupt(self, key: str, exc: KVEntryCorrupt) -> None:
        """Delete an entry found unreadable and count the fault (kind from the exception)."""
        self.delete(key)
        self.counters.fault(exc.kind)
        logger.warning("disk tier: removed corrupt entry %s: %s", key[:12], exc.reason)

    def evict_to(self, max_bytes: int, *, keep: str | None = None) -> list[str]:
        """Delete least recently used entries until the tier holds at most `max_bytes`."""
        evicted: list[str] = []
        with self._lock:
            if self._num_bytes <= max_bytes:
                return evicted
            victims = (k for k in list(self._index) if k != keep)
            while self._num_bytes > max_bytes:
                key = next(victims, None)
                if key is None:
                    break
                self._num_bytes -= self._index.pop(key)
                with contextlib.suppress(FileNotFoundError):
                    self.path_for(key).unlink()
                evicted.append(key)
        if evicted:
            self.counters.evicted(len(evicted))
            logger.debug("disk tier: evicted %d entries", len(evicted))
        return evicted

    def stats(self) -> TierStats:
        with self._lock:
            num_entries, num_bytes = len(self._index), self._num_bytes
        return self.counters.snapshot(
            name=self.name, available=True, num_entries=num_entries, num_bytes=num_bytes, budget_bytes=self.budget_bytes
        )
