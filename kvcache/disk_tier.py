"""Local-disk tier: one safetensors file per entry, within a byte budget that is never exceeded.

Layout: `<root>/<key[:2]>/<key>.safetensors` (256 shards keep directories small). Files are written
atomically (`fsio.atomic`). The index (key -> size) is rebuilt by scanning `root` at start, which
also deletes temp files left by crashed writers: at once when the pid in the name no longer runs, else once
older than `stale_tmp_age_s`.

Budget: a write first evicts until the new entry fits, then writes, so the bytes the tier accounts
never pass `budget_bytes`. `budget_bytes=None` takes what the tier holds at start plus `free_share` of
the free space of its file system (logged). Which entry goes is the `policy`'s choice (see
`kvcache.eviction`): "lru" or "frequency" (retrievals recorded by the store through
`record_retrieval`). Recency survives a restart as the file mtime, bumped on every hit; the frequency
policy's counts are saved to `<root>/eviction-counts.json` by `close()` and read back at start.

Several processes may share `root` (server replicas, the `blendrag cache` CLI): a lookup that misses
the index stats the file and adopts it, and a file deleted behind our back is noticed (fault
"missing_file"), dropped from the index, and reported as a miss.

`DiskTier(root, budget_bytes, *, fsync=True, stale_tmp_age_s=3600.0, policy=None, free_share=0.5)`:
`path_for(key)`, `contains(key)`, `nbytes_of(key)`, `put_bytes(key, data, *, overwrite=False) -> bool`
(never raises for I/O: a failed write is a fault, leaves no file, returns False),
`open_reader(key) -> FileEntryReader | None` (caller closes it), `get(key, *, verify=True) ->
StoredEntry | None`, `read_bytes(key)`, `replace_bytes(key, data) -> bool` (rewrite a held entry in
place, e.g. in another format), `delete(key) -> bool`, `remove_corrupt(key, exc)`,
`record_retrieval(keys)`, `keys()` (next victim first), `evict_to(max_bytes) -> list[str]`,
`rescan() -> int`, `stats()`, `close()`. Thread-safe. `policy=None` is LRU; the store passes the one
`kvcache.eviction` makes (frequency by default).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from fsio.atomic import is_temp_name, write_bytes_atomic, writer_is_gone
from kvcache.errors import KVEntryCorrupt
from kvcache.eviction import EvictionPolicy, LRUPolicy
from kvcache.format import StoredEntry
from kvcache.keys import check_key
from kvcache.reader import FileEntryReader
from kvcache.stats import TierCounters, TierStats

logger = logging.getLogger(__name__)

ENTRY_SUFFIX = ".safetensors"
_NAME_RE = re.compile(r"^([0-9a-f]{64})\.safetensors$")
_SHARD_RE = re.compile(r"^[0-9a-f]{2}$")
COUNTS_FILE = "eviction-counts.json"
MIN_AUTO_BUDGET = 64 * 1024 * 1024  # a nearly full disk still gets a usable tier


class DiskTier:
    name = "disk"

    def __init__(
        self,
        root: Path,
        budget_bytes: int | None,
        *,
        fsync: bool = True,
        stale_tmp_age_s: float = 3600.0,
        policy: EvictionPolicy | None = None,
        free_share: float = 0.5,
    ) -> None:
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError("disk tier budget must be positive")
        self.root = Path(root)
        self.fsync = fsync
        self.stale_tmp_age_s = stale_tmp_age_s
        self.counters = TierCounters()
        self._lock = threading.Lock()
        self._policy: EvictionPolicy = policy or LRUPolicy()
        self._index: dict[str, int] = {}  # key -> file size
        self._num_bytes = 0  # sizes of the indexed files plus writes in flight
        self.root.mkdir(parents=True, exist_ok=True)
        self.rescan()
        self._load_counts()
        if budget_bytes is None:
            free = shutil.disk_usage(self.root).free
            budget_bytes = max(MIN_AUTO_BUDGET, self._num_bytes + int(free * free_share))
            logger.info(
                "disk tier %s: budget %.1f GiB (%.1f GiB held + %.0f%% of %.1f GiB free); set kvcache.disk_bytes "
                "to choose it",
                self.root,
                budget_bytes / 2**30,
                self._num_bytes / 2**30,
                100 * free_share,
                free / 2**30,
            )
        self.budget_bytes: int = budget_bytes

    @property
    def policy_name(self) -> str:
        return self._policy.name

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
                            if now - st.st_mtime > self.stale_tmp_age_s or writer_is_gone(f.name):
                                with contextlib.suppress(FileNotFoundError):
                                    os.unlink(f.path)
                                logger.info("disk tier: removed stale temp file %s", f.path)
                            continue
                        m = _NAME_RE.match(f.name)
                        if m and m.group(1)[:2] == shard.name and f.is_file(follow_symlinks=False):
                            found.append((st.st_mtime, m.group(1), st.st_size))
        found.sort()
        with self._lock:
            for key in list(self._index):
                self._policy.forget(key)
            self._index = {key: size for _, key, size in found}
            self._num_bytes = sum(size for _, _, size in found)
            for _, key, _ in found:  # least recently used first
                self._policy.admit(key)
        logger.info("disk tier %s: %d entries, %d bytes", self.root, len(found), self._num_bytes)
        return len(found)

    def _load_counts(self) -> None:
        path = self.root / COUNTS_FILE
        try:
            saved = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            logger.warning("disk tier: ignoring unreadable %s: %s", path, exc)
            return
        if isinstance(saved, dict):
            with self._lock:
                self._policy.load_priorities(
                    {k: float(v) for k, v in saved.items() if isinstance(v, int | float) and k in self._index}
                )

    def close(self) -> None:
        """Save the eviction policy's retrieval counts (best effort) for the next start."""
        with self._lock:
            counts = self._policy.priorities()
        if not counts:
            return
        try:
            write_bytes_atomic(self.root / COUNTS_FILE, json.dumps(counts).encode(), fsync=False)
        except OSError as exc:
            logger.warning("disk tier: could not save eviction counts: %s", exc)

    def record_retrieval(self, keys: Iterable[str]) -> None:
        """Questions retrieved these chunks (held here or not): what the frequency policy counts."""
        with self._lock:
            for key in keys:
                self._policy.record_retrieval(key)

    def _drop(self, key: str) -> bool:
        with self._lock:
            return self._drop_unlocked(key)

    def _drop_unlocked(self, key: str) -> bool:
        size = self._index.pop(key, None)
        if size is not None:
            self._num_bytes -= size
            self._policy.forget(key)
        return size is not None

    def _record(self, key: str, size: int, *, reserved: int = 0) -> None:
        """Insert `key` or refresh it (most recent for LRU). `reserved` bytes set aside for its write are
        released under the same lock: released apart, a concurrent writer would see the file's bytes counted
        nowhere and admit past the budget."""
        with self._lock:
            old = self._index.pop(key, None)
            self._num_bytes += size - (old or 0) - reserved
            self._index[key] = size
            self._policy.admit(key)

    def _vanished(self, key: str) -> None:
        """A read found no file for `key`. Checked again under the lock before anything is dropped: between
        the failed open and here this process may have evicted the entry and written it again (a writer
        records a key only once its file is in place, and eviction drops a key before unlinking it), and
        that new entry is neither to be dropped nor a fault."""
        with self._lock:
            if self.path_for(key).exists() or not self._drop_unlocked(key):
                return
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
        """Held keys, the policy's next victim first."""
        with self._lock:
            return [k for k in self._policy.order() if k in self._index]

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
        return self._write(key, path, data)

    def replace_bytes(self, key: str, data: bytes) -> bool:
        """Rewrite an entry the tier holds (atomically: readers see the old or the new file)."""
        if self.nbytes_of(key) is None:
            return False
        return self.put_bytes(key, data, overwrite=True)

    def _write(self, key: str, path: Path, data: bytes) -> bool:
        size = len(data)
        with self._lock:
            # make room first and reserve it in one step, so the accounted bytes (which, while an
            # entry is rewritten, count its old and its new file) never pass the budget
            evicted = self._evict_unlocked(self.budget_bytes - size, keep=key)
            self._num_bytes += size
        self._count_evicted(evicted)
        try:
            write_bytes_atomic(path, data, fsync=self.fsync)
        except OSError as exc:
            with self._lock:
                self._num_bytes -= size
            kind = "disk_full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "write_failed"
            self.counters.fault(kind)
            logger.warning("disk tier: could not write %s (%s): %s", key[:12], kind, exc)
            return False
        self._record(key, size, reserved=size)  # the reservation becomes the indexed size, in one step
        # files another process wrote, adopted meanwhile, may have pushed it over
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
        """Delete entries, the policy's victims first, until the tier holds at most `max_bytes`."""
        with self._lock:
            evicted = self._evict_unlocked(max_bytes, keep=keep)
        self._count_evicted(evicted)
        return evicted

    def _evict_unlocked(self, max_bytes: int, *, keep: str | None) -> list[str]:
        evicted: list[str] = []
        while self._num_bytes > max_bytes:
            key = self._policy.victim(exclude=keep)
            if key is None:
                break
            size = self._index.pop(key, None)
            self._policy.forget(key)
            if size is None:
                continue
            self._num_bytes -= size
            with contextlib.suppress(FileNotFoundError):
                self.path_for(key).unlink()
            evicted.append(key)
        return evicted

    def _count_evicted(self, evicted: list[str]) -> None:
        if evicted:
            self.counters.evicted(len(evicted))
            logger.debug("disk tier: evicted %d entries", len(evicted))

    def stats(self) -> TierStats:
        with self._lock:
            num_entries, num_bytes = len(self._index), self._num_bytes
        return self.counters.snapshot(
            name=self.name, available=True, num_entries=num_entries, num_bytes=num_bytes, budget_bytes=self.budget_bytes
        )
