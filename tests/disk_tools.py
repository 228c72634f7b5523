"""A real full disk for fault tests: a small tmpfs (root only; the `small_fs` fixture of tests/app/conftest.py)
and `fill_disk`, which writes a file until that file system has no space left."""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path


def fill_disk(directory: Path) -> Path:
    """Write a file until the file system is full; returns it (delete it to free the space)."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
        for block in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    with contextlib.suppress(OSError):
        Path(directory / "probe").write_bytes(b"x" * 4096)
    return filler
