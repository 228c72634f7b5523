"""The data-dir lock: one owner at a time, its record names it, a dead owner frees it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.datadir_lock import LOCK_FILE, DataDirBusy, DataDirLock, LockOwner, lock_owner, server_url

REPO = Path(__file__).resolve().parents[2]


def test_owner_is_recorded_and_a_second_taker_is_refused_with_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert lock_owner(data) is None
    with DataDirLock(data) as lock:
        lock.acquire("serve", url="http://127.0.0.1:8123")
        owner = lock_owner(data)
        assert owner is not None
        assert (owner.pid, owner.command, owner.url) == (os.getpid(), "serve", "http://127.0.0.1:8123")
        with pytest.raises(DataDirBusy) as caught:
            DataDirLock(data).acquire("ingest")
        assert caught.value.owner == owner
        assert str(caught.value) == (
            f"data dir {data} is in use by `blendrag serve` at http://127.0.0.1:8123 (pid {os.getpid()})"
        )
    assert lock_owner(data) is None
    assert (data / LOCK_FILE).read_text() == ""  # no stale address left behind
    DataDirLock(data).acquire("ingest")  # free again


def test_a_stale_record_without_a_holder_does_not_count(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 999999, "command": "serve", "url": "http://x:1"}))
    assert lock_owner(tmp_path) is None
    lock = DataDirLock(tmp_path)
    assert lock.acquire("doctor").command == "doctor"
    lock.release()


def test_a_killed_owner_frees_the_data_dir(tmp_path: Path) -> None:
    code = (
        "import sys, time; from app.datadir_lock import DataDirLock; "
        "lock = DataDirLock(sys.argv[1]); lock.acquire('ingest'); print('locked', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        assert lock_owner(tmp_path) == LockOwner(
            pid=proc.pid, command="ingest", url=None, started_at=lock_owner(tmp_path).started_at
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while lock_owner(tmp_path) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock_owner(tmp_path) is None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("127.0.0.1", "http://127.0.0.1:8000"),
        ("::", "http://[::1]:8000"),
        ("example.org", "http://example.org:8000"),
    ],
)
def test_server_url(host: str, url: str) -> None:
    assert server_url(host, 8000) == url
