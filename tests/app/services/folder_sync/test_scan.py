"""The folder scan of `blendrag sync`: what is listed, hashed, left out and held, on real files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services.folder_sync.scan import FolderError, scan_folder

EXTENSIONS = ("md", "txt")
NOBODY = 65534


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_files_are_listed_hashed_and_named_relative_to_the_folder(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "deep.md").write_text("deep\n")
    (tmp_path / "top.txt").write_text("top\n")
    (tmp_path / "image.png").write_bytes(b"png")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.md").write_text("x\n")
    scan = scan_folder(tmp_path, EXTENSIONS, 1 << 20)
    assert [(f.source, f.sha256) for f in scan.files] == [("a/b/deep.md", sha("deep\n")), ("top.txt", sha("top\n"))]
    assert (scan.git, scan.skipped, scan.num_unsupported) == (False, [], 1)


def test_a_git_work_tree_leaves_out_what_git_ignores(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("build/\n*.log.md\n")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "out.md").write_text("generated\n")
    (tmp_path / "notes.log.md").write_text("ignored\n")
    (tmp_path / "kept.md").write_text("kept\n")  # untracked, not ignored: listed
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("guide\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "docs/guide.md"], check=True)
    scan = scan_folder(tmp_path, EXTENSIONS, 1 << 20)
    assert scan.git is True
    assert [f.source for f in scan.files] == ["docs/guide.md", "kept.md"]
    sub = scan_folder(tmp_path / "docs", EXTENSIONS, 1 << 20)  # a folder inside a work tree: relative to it
    assert [f.source for f in sub.files] == ["guide.md"]


def test_large_files_are_held_with_their_reason(tmp_path: Path) -> None:
    (tmp_path / "big.md").write_text("x" * 2048)
    scan = scan_folder(tmp_path, EXTENSIONS, 1024)
    assert [(s.source, s.reason, s.held) for s in scan.skipped] == [
        ("big.md", "2048 bytes, over ingest.max_file_bytes (1024)", True)
    ]
    assert scan.held == ["big.md"]


def test_a_missing_path_a_file_or_an_unreadable_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FolderError, match=r"^.*/missing: no such folder$"):
        scan_folder(tmp_path / "missing", EXTENSIONS, 1024)
    (tmp_path / "f.md").write_text("f")
    with pytest.raises(FolderError, match=r"f\.md: not a folder"):
        scan_folder(tmp_path / "f.md", EXTENSIONS, 1024)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder another user can reach (pytest's tmp_path is the owner's alone)."""
    path = Path(tempfile.mkdtemp(prefix="blendrag-scan-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for p in path.rglob("*"):
            if not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(path)


def test_unreadable_files_and_folders_are_held_for_a_user_chmod_binds(shared_dir: Path) -> None:
    """chmod 000 binds every user but root: the scan runs as `nobody` when the tests run as root."""
    root = shared_dir / "docs"
    (root / "closed").mkdir(parents=True)
    (root / "open.md").write_text("open\n")
    (root / "secret.md").write_text("secret\n")
    (root / "closed" / "inside.md").write_text("inside\n")
    (root / "secret.md").chmod(0o000)
    (root / "closed").chmod(0o000)
    if os.geteuid() != 0 and os.access(root / "secret.md", os.R_OK):
        pytest.skip("chmod 000 does not bind this user")
    files, skipped = json.loads(_scan_as_nobody(root))
    assert files == ["open.md"]
    assert skipped == [
        ["closed/", "folder not readable: Permission denied", True],
        ["secret.md", "permission denied", True],
    ]


def _scan_as_nobody(root: Path) -> str:
    """The scan's files and skipped entries (JSON), from a child process that dropped root to `nobody`."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: scan, write, leave at once
        code = 1
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            scan = scan_folder(root, ("md",), 1 << 20)
            out = [[f.source for f in scan.files], [[k.source, k.reason, k.held] for k in scan.skipped]]
            os.write(write_end, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return data.decode()
