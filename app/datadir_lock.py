"""One process owns a data dir: an exclusive `flock` on `<data_dir>/blendrag.lock`.

The server takes it for its whole life and records its address in the file, so `blendrag ingest`,
`ask`, `cache` and `doctor` can find it and send their work over HTTP instead of writing the catalog,
index and KV store behind the server's back (the server's next index save would silently overwrite
them). A CLI command that works on the data dir itself takes the same lock while it runs. The lock is
held by the kernel for the open file: a process that dies releases it, and a stale file left behind
is simply taken over.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

LOCK_FILE = "blendrag.lock"


@dataclass(frozen=True)
class LockOwner:
    """Who holds a data dir: its pid, the command ("serve", "ingest" …) and, for a server, its URL."""

    pid: int
    command: str
    url: str | None = None
    started_at: float = 0.0

    def describe(self) -> str:
        where = f" at {self.url}" if self.url else ""
        return f"`blendrag {self.command}`{where} (pid {self.pid})"


class DataDirBusy(RuntimeError):
    """Another process holds the data dir's lock."""

    def __init__(self, data_dir: Path, owner: LockOwner | None) -> None:
        self.data_dir = data_dir
        self.owner = owner
        who = owner.describe() if owner is not None else "another blendrag process"
        super().__init__(f"data dir {data_dir} is in use by {who}")


def server_url(host: str, port: int) -> str:
    """The URL a local client reaches a server on that was bound to host:port."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "[::1]"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


class DataDirLock:
    """Exclusive ownership of a data dir for as long as this object holds it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_FILE
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self, command: str, url: str | None = None) -> LockOwner:
        """Take the lock and record who holds it; raise DataDirBusy (naming the holder) if taken."""
        if self._file is not None:
            raise RuntimeError("lock already held by this object")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held open as long as the lock
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise DataDirBusy(self.data_dir, read_owner_record(self.path)) from None
        owner = LockOwner(pid=os.getpid(), command=command, url=url, started_at=time.time())
        f.seek(0)
        f.truncate()
        f.write(json.dumps(asdict(owner)))
        f.flush()
        os.fsync(f.fileno())
        self._file = f
        logger.debug("data dir %s locked by %s", self.data_dir, owner.describe())
        return owner

    def release(self) -> None:
        if self._file is None:
            return
        f, self._file = self._file, None
        with contextlib.suppress(OSError):
            f.seek(0)
            f.truncate()  # no stale address for the next reader
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        f.close()

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_owner_record(path: Path) -> LockOwner | None:
    """The holder recorded in a lock file (None when it cannot be read, e.g. still being written)."""
    for _ in range(20):  # the holder writes its record right after taking the lock
        try:
            data = json.loads(path.read_text(encoding="utf-8") or "null")
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict):
            try:
                return LockOwner(
                    pid=int(data["pid"]),
                    command=str(data["command"]),
                    url=data.get("url"),
                    started_at=float(data.get("started_at", 0.0)),
                )
            except (KeyError, TypeError, ValueError):
                return None
        time.sleep(0.05)
    return None


def lock_owner(data_dir: Path) -> LockOwner | None:
    """Who holds the data dir right now, or None when nobody does (a stale file does not count)."""
    path = Path(data_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return read_owner_record(path) or LockOwner(pid=0, command="(unknown)")
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
