"""Uploaded files: the name each is shown and stored under, and where it is kept.

`blendrag ingest ./docs` sends each file as its path relative to the folder it was found under
(`advanced/timeouts.md`), so sources and the catalog say where a passage came from. That path
(`upload_source_path`) is the name shown and used as the document's identity for re-ingest (the same
path with new content replaces the old document); the stored copy's file name is its base name,
checked by `check_upload_name`.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path, PurePosixPath

from app.services.text_checks import is_valid_utf8

MAX_FILENAME_BYTES = 255  # what common file systems store in one path component


class UploadNameError(ValueError):
    """An upload's file name that no file system can store (HTTP 422)."""


def upload_source_path(filename: str) -> str:
    """A client's upload name as a relative POSIX path: backslashes as separators, no drive, no root,
    no `.` or `..` parts (a name can only say where a file sat in the client's folder, never point
    outside it). Falls back to "upload" for a name with nothing left."""
    parts = [p for p in PurePosixPath(filename.replace("\\", "/")).parts if p not in ("", ".", "..", "/")]
    if parts and len(parts[0]) == 2 and parts[0][1] == ":":  # a Windows drive ("C:")
        parts = parts[1:]
    return "/".join(parts) or "upload"


def check_upload_name(filename: str) -> str:
    """The base name an upload is stored under; UploadNameError for one no file system can store."""
    name = Path(filename.replace("\\", "/")).name
    if "\x00" in filename:
        raise UploadNameError(f"file name {filename!r} contains a NUL character")
    if len(name.encode("utf-8", errors="surrogatepass")) > MAX_FILENAME_BYTES:
        raise UploadNameError(f"file name {name[:40]!r}… is longer than {MAX_FILENAME_BYTES} bytes")
    if not is_valid_utf8(name):
        raise UploadNameError(f"file name {name!r} is not valid Unicode")
    return name or "upload"


def save_upload(uploads_dir: Path, job_hint: str, index: int, filename: str, data_path: Path) -> Path:
    """Move an uploaded temp file under the data dir so the job can be re-run after a restart.

    Each file of a request gets its own directory (`<batch>/<index>/<name>`): two files with the same name
    in one request are two uploads, never one overwriting the other, and each keeps its own name.
    """
    target_dir = uploads_dir / job_hint / str(index)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / check_upload_name(filename)
    try:
        shutil.move(str(data_path), target)
    except BaseException:
        data_path.unlink(missing_ok=True)
        raise
    return target


def drop_unqueued(batch_dir: Path, queued_paths: set[str]) -> None:
    """Delete the files of an upload batch that its job does not read (duplicates of stored content were
    answered at submit), then the batch directories left empty; the rest goes when the job ends."""
    if not batch_dir.is_dir():
        return
    for path in sorted(batch_dir.rglob("*"), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            if path.is_file() and str(path) not in queued_paths:
                path.unlink()
            elif path.is_dir():
                path.rmdir()  # only once empty
    with contextlib.suppress(OSError):
        batch_dir.rmdir()
