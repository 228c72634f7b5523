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
from app.remote import SeveralServers
from app.server_registry import SERVERS_FILE, Announced, announce, announced, choose, started_here, withdraw


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


def test_a_server_records_the_folder_it_was_started_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, checkout = tmp_path / "runtime", tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    entry = announce(runtime, "http://127.0.0.1:18400", tmp_path / "elsewhere")  # `make serve DATA=../elsewhere`
    assert (entry.started_in, entry.data_dir) == (str(checkout.resolve()), str((tmp_path / "elsewhere").resolve()))
    assert announced(runtime) == [entry]
    # An entry written before the folder was recorded reads as "not recorded".
    old = {k: v for k, v in dataclasses.asdict(entry).items() if k != "started_in"}
    (runtime / SERVERS_FILE).write_text(json.dumps([old]))
    assert announced(runtime) == [dataclasses.replace(entry, started_in=None)]


def test_the_cli_asks_the_server_started_from_its_folder_never_the_newest_of_several(tmp_path: Path) -> None:
    """The trial: the checkout's server ran with `make serve DATA=/elsewhere`, the CLI there found no catalog in
    ./data and asked the newest server on the machine, another data dir's (an answer about Java, no sources)."""
    checkout, other = tmp_path.resolve() / "checkout", tmp_path.resolve() / "other"
    ours = Announced("http://127.0.0.1:18400", "/elsewhere", 101, 1.0, str(checkout))
    newer = Announced("http://127.0.0.1:18401", "/java-docs", 102, 2.0, str(other))
    unrecorded = Announced("http://127.0.0.1:18402", "/old", 103, 3.0)
    newest_first = [unrecorded, newer, ours]
    assert choose(newest_first, checkout) == ours and started_here(newest_first, checkout) == [ours]
    # Several, none started here (or two started here): none chosen, for the CLI to list them.
    assert choose(newest_first, tmp_path) is None
    assert choose([ours, dataclasses.replace(newer, started_in=str(checkout))], checkout) is None
    # One running: that one, wherever it was started (`blendrag ask` in another folder finds the user's server).
    assert choose([newer], checkout) == newer and choose([], checkout) is None
    assert str(SeveralServers([unrecorded, newer], checkout)) == (
        f"2 blendrag servers are running, none started from {checkout}; name one with --server URL (or "
        "BLENDRAG_URL), or run the command from the folder its `make serve` ran in:\n"
        "  http://127.0.0.1:18402  data dir /old  pid 103\n"
        "  http://127.0.0.1:18401  data dir /java-docs  pid 102"
    )


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
