"""fsio.atomic, the one atomic write every package uses: the content is replaced whole, a failure leaves the old
file and no temp file, concurrent writers (threads and processes) never interleave, temp names are unique."""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from atomic_writers import start_writers

import fsio.atomic as atomic
from fsio.atomic import atomic_path, is_temp_name, write_bytes_atomic, write_text_atomic, writer_is_gone


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_bytes_replace_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "data.bin"  # the directory is made
    write_bytes_atomic(target, b"a longer old content")
    write_bytes_atomic(target, memoryview(b"new"))
    assert target.read_bytes() == b"new"  # nothing of the longer old file is left after it
    assert _names(target.parent) == ["data.bin"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_text_is_encoded_and_mode_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "record.json"
    write_text_atomic(target, "{}\n")
    write_text_atomic(target, "naïve ✓\n", mode=0o600, fsync=False)
    assert target.read_bytes() == "naïve ✓\n".encode()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    write_text_atomic(target, "é", encoding="latin-1")
    assert target.read_bytes() == b"\xe9"


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failure_mid_write_leaves_the_old_file_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    target = tmp_path / "data.bin"
    write_bytes_atomic(target, b"old")
    real_write = atomic._os_write
    calls: list[int] = []

    def fails_after_part(fd: int, data: memoryview) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, data[:10])  # part of the new content lands in the temp file
        raise error

    monkeypatch.setattr(atomic, "_os_write", fails_after_part)
    with pytest.raises(type(error)):
        write_bytes_atomic(target, b"x" * 100)
    assert calls == [100, 90]
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["data.bin"]


def test_a_failure_inside_atomic_path_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "weights.safetensors"
    target.write_bytes(b"old")
    with pytest.raises(ValueError, match="hash mismatch"), atomic_path(target) as tmp:
        tmp.write_bytes(b"half of it")
        raise ValueError("hash mismatch")
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["weights.safetensors"]


def test_atomic_path_renames_what_the_writer_wrote_by_name(tmp_path: Path) -> None:
    target = tmp_path / "model.gguf"
    target.write_bytes(b"old")
    with atomic_path(target, mode=0o640) as tmp:
        assert tmp.parent == tmp_path and tmp.exists() and is_temp_name(tmp.name)
        with tmp.open("wb") as out:  # as a streamed join or safetensors' save_file writes it
            out.write(b"part one, ")
            out.write(b"part two")
        assert target.read_bytes() == b"old"  # not before the block ends
    assert target.read_bytes() == b"part one, part two"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert _names(tmp_path) == ["model.gguf"]


def test_temp_names_are_unique_even_for_two_writers_in_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old compute-dtype record used one fixed temp name: two writers at once wrote into one file. Here both
    writers hold their own temp file at the same moment, and each name says whose it is."""
    target = tmp_path / "compute_dtype.json"
    both_writing = threading.Barrier(2, timeout=30)
    seen: list[list[str]] = []
    real_write = atomic._os_write

    def write_together(fd: int, data: memoryview) -> int:
        written = real_write(fd, data)
        both_writing.wait()  # each writer's temp file exists and holds its bytes now
        seen.append([n for n in _names(tmp_path) if is_temp_name(n)])
        both_writing.wait()
        return written

    monkeypatch.setattr(atomic, "_os_write", write_together)
    writers = [threading.Thread(target=write_text_atomic, args=(target, text)) for text in ("a", "b")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=30)
    assert len(seen) == 2 and seen[0] == seen[1] and len(seen[0]) == 2
    pattern = re.compile(rf"^\.compute_dtype\.json\.{os.getpid()}\.[a-z0-9_]{{8}}\.tmp$")
    assert all(pattern.match(name) for name in seen[0])
    assert target.read_text() in ("a", "b")
    assert _names(tmp_path) == ["compute_dtype.json"]


def test_threads_writing_one_path_never_interleave(tmp_path: Path) -> None:
    target = tmp_path / "data.bin"
    contents = [bytes([value]) * (1 << 18) for value in (1, 2, 3)]
    write_bytes_atomic(target, contents[0], fsync=False)
    stop = threading.Event()
    torn: list[int] = []

    def read_while_written() -> None:
        while not stop.is_set():
            if target.read_bytes() not in contents:
                torn.append(1)

    def write_many(content: bytes) -> None:
        for _ in range(30):
            write_bytes_atomic(target, content, fsync=False)

    reader = threading.Thread(target=read_while_written)
    reader.start()
    writers = [threading.Thread(target=write_many, args=(content,)) for content in contents[1:]]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
    stop.set()
    reader.join(timeout=60)
    assert torn == []
    assert target.read_bytes() in contents[1:]
    assert _names(tmp_path) == ["data.bin"]


def test_processes_writing_one_path_never_interleave(tmp_path: Path) -> None:
    target = tmp_path / "data.bin"
    contents = {bytes([value]) * (1 << 18) for value in (1, 2)}
    sources = [tmp_path / f"source{n}" for n in (1, 2)]
    for source, content in zip(sources, sorted(contents), strict=True):
        source.write_bytes(content)
    procs = start_writers(target, sources)
    while any(proc.poll() is None for proc in procs):
        if target.exists():
            assert target.read_bytes() in contents
    assert [proc.wait(timeout=60) for proc in procs] == [0, 0]
    assert target.read_bytes() in contents
    assert _names(tmp_path) == ["data.bin", "source1", "source2"]


def test_writer_is_gone_reads_the_pid_in_the_name(tmp_path: Path) -> None:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    assert writer_is_gone(f".k.safetensors.{dead_pid}.abcd1234.tmp") is True
    assert writer_is_gone(f".k.safetensors.{os.getpid()}.abcd1234.tmp") is False  # this process: still writing
    # not a name these writes make: kept until old (the scan's age rule), never an error
    assert writer_is_gone(".k.safetensors.140234567890123456789.abcd1234.tmp") is False
    assert writer_is_gone(".upload-abc.tmp") is False
    assert is_temp_name(".k.safetensors.1.abcd1234.tmp") and not is_temp_name("k.safetensors")
