"""What a synced folder holds: every ingestible file with the SHA-256 of its bytes, and what was left out and why.

Runs where the folder is (the CLI's machine). A file is named by its POSIX path relative to the folder, the
same source path `blendrag ingest FOLDER` gives it, so a folder ingested before is synced without being read
again. Hidden files and folders are left out; in a git work tree so is what git ignores (`git ls-files`).
A file that cannot be read now (permission, a symlink loop, a change while it was read, an unreadable
folder) is *held*: its stored documents are kept as they are, since its absence from the scan says nothing
about its content.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import subprocess
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.services.text_checks import is_valid_utf8

logger = logging.getLogger(__name__)

READ_BLOCK = 1 << 20
GIT_TIMEOUT_S = 60.0


class FolderError(ValueError):
    """The path cannot be synced at all (missing, not a folder, unreadable): nothing was changed."""


@dataclass(frozen=True)
class FileState:
    """What a file's stat says about its content: a change of either means new bytes."""

    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileState:
        return cls(st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class ScannedFile:
    source: str  # POSIX path relative to the folder: the document's source path
    path: Path
    sha256: str
    state: FileState


@dataclass(frozen=True)
class SkippedFile:
    source: str  # a file's relative path, or a folder's with a trailing "/"
    reason: str
    held: bool = True  # its stored documents stay as they are (it may still hold what they were made from)


@dataclass
class FolderScan:
    root: Path
    git: bool  # listed by `git ls-files` (ignored files left out)
    files: list[ScannedFile] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    num_unsupported: int = 0  # files of a type no loader reads (not held: they never had documents)

    @property
    def held(self) -> list[str]:
        """Sources (a trailing "/": every source under a folder) whose stored documents are kept as they are."""
        return [s.source for s in self.skipped if s.held]

    def by_source(self) -> dict[str, ScannedFile]:
        return {f.source: f for f in self.files}


def scan_folder(root: Path, extensions: Collection[str], max_file_bytes: int) -> FolderScan:
    """Every file under `root` a loader reads (`extensions`: lower case, no dot), hashed; FolderError when
    `root` is no readable folder."""
    try:
        st = root.stat()
    except FileNotFoundError as exc:
        raise FolderError(f"{root}: no such folder") from exc
    except OSError as exc:
        raise FolderError(f"{root}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise FolderError(
            f"{root}: not a folder (sync keeps a collection equal to a folder; `blendrag ingest` takes files)"
        )
    if not os.access(root, os.R_OK | os.X_OK):
        raise FolderError(f"{root}: permission denied")
    scan = FolderScan(root=root, git=False)
    listed = _git_files(root)
    if listed is not None:
        scan.git = True
        candidates: Iterator[str] = iter(listed)
    else:
        candidates = _walk(root, scan)
    wanted = {e.lower() for e in extensions}
    for source in candidates:
        if any(part.startswith(".") for part in source.split("/")):
            continue
        if not is_valid_utf8(source):  # no source path can name it (the catalog and the API take Unicode)
            scan.skipped.append(
                SkippedFile(
                    source.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
                    "file name is not valid UTF-8",
                    held=False,
                )
            )
            continue
        if Path(source).suffix.lower().lstrip(".") not in wanted:
            scan.num_unsupported += 1
            continue
        _scan_file(root / source, source, max_file_bytes, scan)
    scan.files.sort(key=lambda f: f.source)
    scan.skipped.sort(key=lambda s: s.source)
    return scan


def _git_files(root: Path) -> list[str] | None:
    """The files of a git work tree under `root`, relative to it, ignored ones left out; None when `root` is
    not in a work tree (or git is missing)."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.info("not listing %s with git (%s): walking it instead", root, exc)
        return None
    if listed.returncode != 0:
        logger.info("git ls-files failed in %s: %s", root, listed.stderr.decode(errors="replace").strip())
        return None
    # Paths come relative to root; a file both in the index and deleted is listed and found missing below.
    names = {os.fsdecode(name) for name in listed.stdout.split(b"\0") if name}
    return sorted(names)


def _walk(root: Path, scan: FolderScan) -> Iterator[str]:
    """Relative POSIX paths of the files under `root`, hidden folders and symlinked folders not entered (a
    symlink loop cannot be followed forever); an unreadable folder is held."""

    def unreadable(exc: OSError) -> None:
        where = Path(exc.filename) if exc.filename else root
        rel = where.relative_to(root).as_posix() if where != root else ""
        scan.skipped.append(SkippedFile(f"{rel}/" if rel else "./", f"folder not readable: {exc.strerror or exc}"))

    for directory, subdirectories, filenames in os.walk(root, onerror=unreadable, followlinks=False):
        base = Path(directory)
        kept = []
        for name in subdirectories:
            if name.startswith("."):
                continue
            if (base / name).is_symlink():
                rel = (base / name).relative_to(root).as_posix()
                scan.skipped.append(SkippedFile(f"{rel}/", "symlinked folder: not followed", held=False))
                continue
            kept.append(name)
        subdirectories[:] = sorted(kept)
        for name in sorted(filenames):
            yield (base / name).relative_to(root).as_posix()


def _scan_file(path: Path, source: str, max_file_bytes: int, scan: FolderScan) -> None:
    try:
        before = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            scan.skipped.append(SkippedFile(source, "broken symlink", held=False))
        return  # deleted since it was listed: it is not in the folder
    except OSError as exc:
        reason = "symlink loop" if exc.errno == errno.ELOOP else f"cannot read: {exc.strerror or exc}"
        scan.skipped.append(SkippedFile(source, reason))
        return
    if not stat.S_ISREG(before.st_mode):
        scan.skipped.append(SkippedFile(source, "not a regular file", held=False))
        return
    if before.st_size > max_file_bytes:
        reason = f"{before.st_size} bytes, over ingest.max_file_bytes ({max_file_bytes})"
        scan.skipped.append(SkippedFile(source, reason))
        return
    try:
        digest = file_sha256(path)
        after = path.stat()
    except FileNotFoundError:
        return
    except PermissionError:
        scan.skipped.append(SkippedFile(source, "permission denied"))
        return
    except OSError as exc:
        scan.skipped.append(SkippedFile(source, f"cannot read: {exc.strerror or exc}"))
        return
    if FileState.of(before) != FileState.of(after):
        scan.skipped.append(SkippedFile(source, "changed while it was read: taken at the next sync"))
        return
    scan.files.append(ScannedFile(source, path, digest, FileState.of(after)))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def current_state(path: Path) -> FileState | None:
    """The file's state now (None: gone or unreadable)."""
    try:
        return FileState.of(path.stat())
    except OSError:
        return None
