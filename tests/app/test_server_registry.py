"""Servers announce themselves in a per-user runtime file; the CLI never creates a data dir for a question."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import EXIT_BUSY, NO_SERVER, main
from app.server_registry import SERVERS_FILE, announce, announced, withdraw


def test_announce_lists_live_servers_newest_first_and_withdraw_removes_them(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    first = announce(runtime, "http://127.0.0.1:18400", tmp_path / "a")
    assert announced(runtime) == [first] and first.data_dir == str((tmp_path / "a").resolve())
    assert (runtime.stat().st_mode & 0o777) == 0o700
    # A server that died without withdrawing (its pid is gone) is skipped, and dropped at the next write.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ghost = first.__class__("http://127.0.0.1:1", "/nowhere", int(dead.stdout), first.started_at + 1)
    (runtime / SERVERS_FILE).write_text(json.dumps([dataclasses.asdict(first), dataclasses.asdict(ghost)]))
    assert announced(runtime) == [first]
    second = announce(runtime, "http://127.0.0.1:18401", tmp_path / "b")
    assert "18401" in second.url and len(announced(runtime)) == 1  # same pid: the newer entry replaces it
    withdraw(runtime, second)
    assert announced(runtime) == [] and "nowhere" not in (runtime / SERVERS_FILE).read_text()
    (runtime / SERVERS_FILE).write_text("not json")
    assert announced(runtime) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_question_with_no_server_and_no_catalog_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trial: `blendrag ask` next to a server on another port created ./data (518 MB), loaded the model
    for 36 s and answered from nothing. Now it says how to start or name a server, and writes nothing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLENDRAG_RUNTIME_DIR", str(tmp_path / "empty-runtime"))
    monkeypatch.setenv("BLENDRAG_SERVER__PORT", str(_free_port()))  # nothing listens on the configured port
    monkeypatch.delenv("BLENDRAG_URL", raising=False)
    assert main(["ask", "What is the capital of Zorblat?"]) == EXIT_BUSY
    assert capsys.readouterr().err == f"error: {NO_SERVER}; data holds no catalog to answer from\n"
    assert os.listdir(tmp_path) == []
    # A named server that does not answer: said so, nothing created either.
    port = _free_port()
    assert main(["ask", "q", "--server", f"http://127.0.0.1:{port}"]) == EXIT_BUSY
    assert capsys.readouterr().err == (
        f"error: no blendrag server answers at http://127.0.0.1:{port} (check --server / BLENDRAG_URL)\n"
    )
    monkeypatch.setenv("BLENDRAG_URL", f"http://127.0.0.1:{port}/")
    assert main(["ask", "q"]) == EXIT_BUSY
    assert "no blendrag server answers at" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()
