"""Crash-safe file writes: a reader sees the old file or the new one, never a torn one."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not possible on every platform/filesystem, hence best effort.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, fsync it, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    fsync_directory(path.parent)
