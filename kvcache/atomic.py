"""Atomic file writes: temp file in the same directory, write, fsync, `os.replace`, fsync the dir.

Readers see either the old file, no file, or the complete new file, never a torn one, even with
concurrent writers of the same path (each writes its own uniquely named temp file; the last rename
wins and both contents are complete). On any error the temp file is removed and the error re-raised.

Temp files are named `.<final name>.<pid>.<thread>.<random>.tmp` so a directory scan can recognise
(and, once old, remove) the leftovers of a writer that crashed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from pathlib import Path

TMP_SUFFIX = ".tmp"

# Module attribute (not `os.write` inline) so tests can simulate a full disk for our writes only.
_os_write = os.write


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


def writer_is_gone(name: str) -> bool:
    """Whether the process that wrote temp file `name` (its pid is in the name) no longer runs on this host:
    its temp file will never be renamed (a killed `cache convert` left 8 MiB nothing removed). A pid that
    runs again (reused) keeps the file until it is old enough to go anyway."""
    parts = name[: -len(TMP_SUFFIX)].rsplit(".", 3)
    if len(parts) != 4 or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's): not ours to judge
        return False
    return False


def write_file_atomic(path: Path, data: bytes | bytearray | memoryview, *, fsync: bool = True) -> None:
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{path.name}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}{TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            view = memoryview(data).cast("B")
            done = 0
            while done < len(view):
                done += _os_write(fd, view[done:])
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if fsync:
        _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable; best effort (some filesystems refuse fsync on a directory)."""
    try:
        dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
