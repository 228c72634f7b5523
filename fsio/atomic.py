"""Atomic file writes: a temp file in the same directory, written, fsynced, renamed over the target, the
directory fsynced.

Readers see the old file, no file, or the complete new file, never a torn one, even with concurrent writers of
the same path: each writes its own uniquely named temp file (tempfile.mkstemp, O_EXCL), the last rename wins and
whichever content is left is whole. On any error, a KeyboardInterrupt included, the temp file is removed and the
error re-raised; the old file is untouched.

Temp files are named `.<final name>.<pid>.<random>.tmp`, so a directory scan can recognise them
(`is_temp_name`) and remove the leftovers of a writer that was killed (`writer_is_gone`, the disk tier's
rescan) or that are old.

    write_bytes_atomic(path, data)              # the KV disk tier, the retriever's snapshot files
    write_text_atomic(path, text)               # JSON records (calibration, compute dtype, server registry)
    with atomic_path(path) as tmp:              # a writer that wants a file name (safetensors' save_file)
        save_file(tensors, tmp)                 #   or streams its output (a joined GGUF)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

TMP_SUFFIX = ".tmp"
# Readable by all, as the files these writes replace were under the usual umask; mkstemp alone gives 0o600.
DEFAULT_MODE = 0o644

# Module attribute (not `os.write` inline) so tests can simulate a full disk for these writes only.
_os_write = os.write


def is_temp_name(name: str) -> bool:
    """Whether `name` is one of these writes' temp files (a leftover once its writer is gone)."""
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


def writer_is_gone(name: str) -> bool:
    """Whether the process that wrote temp file `name` (its pid is in the name) no longer runs on this host: its
    temp file will never be renamed (a killed `cache convert` left 8 MiB nothing removed). A pid that runs again
    (reused), or a name this module did not make, keeps the file until it is old enough to go anyway."""
    parts = name[: -len(TMP_SUFFIX)].rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # it exists (another user's), or the field is no pid: not ours to judge
        return False
    return False


def fsync_directory(directory: Path) -> None:
    """Make a rename (or an unlink) in `directory` durable; best effort, as some filesystems refuse to fsync a
    directory."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _temp_beside(path: Path) -> tuple[int, Path]:
    """A new, uniquely named temp file in `path`'s directory (created exclusively), its fd open."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=TMP_SUFFIX)
    return fd, Path(name)


def _commit(tmp: Path, path: Path, *, fsync: bool) -> None:
    os.replace(tmp, path)
    if fsync:
        fsync_directory(path.parent)


def write_bytes_atomic(
    path: Path, data: bytes | bytearray | memoryview, *, mode: int = DEFAULT_MODE, fsync: bool = True
) -> None:
    """Replace `path` with `data` whole; `mode` is the new file's permissions. `fsync=False` skips both fsyncs
    (the rename is still atomic for readers, only not durable across a power cut)."""
    fd, tmp = _temp_beside(path)
    try:
        try:
            view = memoryview(data).cast("B")
            done = 0
            while done < len(view):
                done += _os_write(fd, view[done:])
            os.fchmod(fd, mode)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        _commit(tmp, path, fsync=fsync)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(
    path: Path, text: str, *, encoding: str = "utf-8", mode: int = DEFAULT_MODE, fsync: bool = True
) -> None:
    """Replace `path` with `text` whole (see `write_bytes_atomic`)."""
    write_bytes_atomic(path, text.encode(encoding), mode=mode, fsync=fsync)


@contextlib.contextmanager
def atomic_path(path: Path, *, mode: int = DEFAULT_MODE, fsync: bool = True) -> Iterator[Path]:
    """A temp file beside `path` for a writer that needs a file name or streams what it writes: renamed over
    `path` when the block ends, removed (and `path` untouched) when it raises."""
    fd, tmp = _temp_beside(path)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, mode)
        if fsync:
            with open(tmp, "rb") as written:  # the writer may have closed its own handle without an fsync
                os.fsync(written.fileno())
        _commit(tmp, path, fsync=fsync)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
