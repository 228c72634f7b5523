"""`blendrag ingest/ask/cache/doctor` next to a running server (a real `blendrag serve` subprocess on
127.0.0.1): the work goes to the server over HTTP, or the command refuses and says what to do."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.cli import EXIT_BUSY, main
from app.cli.progress import STAGE_ORDER as STAGES
from app.datadir_lock import DataDirLock, lock_owner

pytestmark = pytest.mark.slow  # the real MiniLM embedder in a second process

REPO = Path(__file__).resolve().parents[3]
API_KEY = "k3y"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tiny_llama_dir: Path, tmp_path: Path) -> dict[str, str]:
    env = {
        "BLENDRAG_ENGINE__MODEL": str(tiny_llama_dir),
        "BLENDRAG_ENGINE__MAX_NEW_TOKENS": "4",
        "BLENDRAG_SERVER__API_KEY": API_KEY,
    }
    monkeypatch.chdir(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


class Server:
    def __init__(self, data_dir: Path, env: dict[str, str], cwd: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = cwd / "server.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port), "--data-dir", str(data_dir)],
            cwd=cwd,
            env={**os.environ, **env, "PYTHONPATH": str(REPO)},
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"server not ready: {self.log.read_text()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


@pytest.fixture
def server(cli_env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data", cli_env, tmp_path)
    try:
        yield srv
    finally:
        srv.stop()


def test_cli_sends_its_work_to_the_running_server(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    log = server.log.read_text()
    # Start-up is logged step by step and ends with the address, only once /ready answers 200.
    steps = [
        "start-up: loading the model",
        "start-up: model loaded",
        "start-up: loading the embedder",
        "start-up: embedder loaded",
        f"ready at {server.url}",
    ]
    positions = [log.find(step) for step in steps]
    assert -1 not in positions and positions == sorted(positions), log
    owner = lock_owner(data)
    assert owner is not None and (owner.pid, owner.command, owner.url) == (server.proc.pid, "serve", server.url)

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "zorblat.md").write_text("# Zorblat\n\nQuintaro is the capital of Zorblat.\n")
    (docs / "guide").mkdir()
    (docs / "guide" / "bread.txt").write_text("Sourdough needs flour, water, salt and a starter.\n")
    (docs / "logo.png").write_bytes(b"\x89PNG\r\n")
    (docs / "CNAME").write_text("docs.example.org\n")
    assert main(["ingest", str(docs), "--data-dir", str(data)]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"succeeded; 2 of 2 file\(s\) ingested in \d+\.\d s\n", out), out
    # Before it starts: the text's and the chunks' token counts (chunks repeat some text), and the time at the
    # server's rate (a new server measures one at start-up).
    assert out.splitlines()[0].startswith(
        "2 file(s), 32 tokens of text, 34 in its chunks (each repeats up to 64 tokens of the one before): the model "
        "reads every chunk token once (KV precompute)"
    )
    assert "the server's" in out.splitlines()[0]
    assert f"the server at {server.url} owns {data}: sending the work to it" in err
    # Without a terminal: one plain line per stage, each at its total, then the files left out.
    stage_lines = [line.strip() for line in err.splitlines() if line.strip().split(":")[0] in STAGES]
    assert [line.split(":")[0] for line in stage_lines] == list(STAGES), err
    for line in stage_lines:
        done, total = line.split(": ")[1].split("/")
        assert done == total and int(total) > 0, line
    assert "\r" not in err
    assert err.splitlines()[-1].startswith("skipped 2 file(s): unsupported type (ingestible: ")
    assert err.splitlines()[-1].endswith(": CNAME, logo.png")

    # The server itself knows the documents and retrieves them (before, the CLI wrote behind its back).
    auth = {"Authorization": f"Bearer {API_KEY}"}
    listed = httpx.get(f"{server.url}/documents", headers=auth).json()
    assert sorted((d["title"], d["source"], d["status"]) for d in listed["documents"]) == [
        ("Zorblat", "zorblat.md", "ready"),
        ("bread.txt", "guide/bread.txt", "ready"),  # the path relative to the folder ingested
    ]
    answer = httpx.post(
        f"{server.url}/ask",
        json={"question": "What is the capital of Zorblat?", "top_k": 1, "stream": False},
        timeout=60,
    ).json()
    assert [s["title"] for s in answer["sources"]] == ["Zorblat"]

    first = ["ask", "What is the capital of Zorblat?", "--conversation", "new", "--top-k", "1"]
    assert main([*first, "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert "Sources:\n  [1] Zorblat (score" in out
    assert "mode blend" in out and "KV hits 1, misses 0" in out
    conversation = next(line for line in out.splitlines() if line.startswith("conversation ")).split()[1]
    args = ["ask", "And its rivers?", "--conversation", conversation, "--top-k", "1", "--data-dir", str(data)]
    assert main(args) == 0
    assert "history: 1 earlier turn(s)" in capsys.readouterr().out  # the server continued it
    # The CLI sent the settings' key: the conversation is that key's.
    assert httpx.get(f"{server.url}/conversations/{conversation}", headers=auth, timeout=10).json()["num_turns"] == 2
    assert httpx.get(f"{server.url}/conversations/{conversation}", timeout=10).status_code == 404

    # cache stats shows the server's tiers (its memory tier holds the two entries it just wrote), readable.
    assert main(["cache", "stats", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"KV cache tiers (server at {server.url})"
    rows = {line.split()[0]: line.split() for line in out[2:]}
    # Disk: the two chunks and the answered turns. The first question was asked twice with the same (greedy)
    # answer: one turn, one entry, found by content; plus the follow-up's turn.
    assert rows["memory"][1] == "2" and rows["history_memory"][1] == "2" and rows["disk"][1] == "4"
    assert rows["memory"][3] == "KiB" and rows["memory"][5] == "MiB"  # "NN.N KiB" of a "64.0 MiB" budget
    assert int(rows["memory"][6]) >= 1  # the ask above hit it

    # Failed documents are purged by the server too.
    bad = httpx.post(f"{server.url}/ingest", headers=auth, json={"documents": [{"title": "t", "text": "x"}]})
    assert bad.status_code == 202
    httpx.post(
        f"{server.url}/ingest", headers=auth, files=[("files", ("broken.json", b"[{", "application/json"))]
    ).raise_for_status()
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.url}/documents", headers=auth, params={"status": "failed"}).json()["total"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert main(["purge-failed", "--data-dir", str(data)]) == 0
    assert capsys.readouterr().out == "deleted 1 failed document(s)\n"
    httpx.delete(f"{server.url}/documents/{bad.json()['document_ids'][0]}", headers=auth).raise_for_status()

    # What cannot go over HTTP is refused, naming the owner and what to do.
    for argv, then in (
        (["doctor", "--repair"], "blendrag doctor --repair"),
        (["doctor"], "blendrag doctor"),
        (["cache", "verify"], "blendrag cache verify"),
    ):
        assert main([*argv, "--data-dir", str(data)]) == EXIT_BUSY
        assert capsys.readouterr().err == (
            f"error: data dir {data} is in use by `blendrag serve` at {server.url} (pid {server.proc.pid}): "
            f"stop the server first (or use another --data-dir), then run `{then}` again\n"
        )
    assert main(["serve", "--port", "1", "--data-dir", str(data)]) == EXIT_BUSY
    assert "is in use by `blendrag serve`" in capsys.readouterr().err

    # Another data dir on the server's port: refused at once, naming the port and what holds it, before any
    # model is loaded (nothing is written under the new data dir).
    other = tmp_path / "other"
    assert main(["serve", "--port", str(server.port), "--data-dir", str(other)]) == EXIT_BUSY
    assert capsys.readouterr().err == (
        f"error: port {server.port} on 127.0.0.1 is already in use by a blendrag server ({server.url}) "
        "(use --port to pick another)\n"
    )
    assert not (other / "models").exists()

    # `blendrag ask` from a folder whose data dir was never used finds the server on the configured port
    # instead of creating an empty data dir and answering from nothing.
    monkeypatch.setenv("BLENDRAG_SERVER__PORT", str(server.port))
    assert main(["ask", "What is the capital of Zorblat?", "--top-k", "1", "--data-dir", str(other)]) == 0
    out, err = capsys.readouterr()
    assert f"{other} holds no catalog; sending the work to the blendrag server at {server.url}" in err
    assert "Sources:\n  [1] Zorblat (score" in out
    assert not (other / "catalog.db").exists()
    monkeypatch.delenv("BLENDRAG_SERVER__PORT")

    # Stopped, the server saved an index that agrees with the catalog; the data dir is free again.
    server.stop()
    assert lock_owner(data) is None
    assert main(["doctor", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert "2 documents, 2 committed chunks" in out
    assert "committed chunks missing from the index: 0 found" in out


def test_a_port_held_by_another_process_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert main(["serve", "--port", str(port), "--data-dir", str(tmp_path / "data")]) == EXIT_BUSY
    name = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    assert capsys.readouterr().err == (
        f"error: port {port} on 127.0.0.1 is already in use by process {os.getpid()} ({name}) "
        "(use --port to pick another)\n"
    )


def test_a_data_dir_busy_with_another_cli_command_is_refused(
    cli_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    docs = tmp_path / "a.txt"
    docs.write_text("text\n")
    with DataDirLock(data) as lock:
        lock.acquire("ingest")
        for argv, then in (
            (["ingest", str(docs)], "blendrag ingest"),
            (["ask", "why?"], "blendrag ask"),
            (["cache", "stats"], "blendrag cache stats"),
        ):
            assert main([*argv, "--data-dir", str(data)]) == EXIT_BUSY
            assert capsys.readouterr().err == (
                f"error: data dir {data} is in use by `blendrag ingest` (pid {os.getpid()}): "
                f"wait for it to finish, then run `{then}` again\n"
            )


def test_cli_in_another_folder_finds_the_announced_server_and_sends_its_own_key(
    cli_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trial: `make serve PORT=18400 DATA=../somewhere`, then `blendrag ask` in the checkout. The server
    announces itself; the CLI finds it on its random port and data dir, and sends `--api-key` /
    `BLENDRAG_API_KEY` (the client's key), not `server.api_key` (which this shell does not set)."""
    elsewhere = tmp_path / "somewhere"
    server = Server(elsewhere, cli_env, tmp_path)
    try:
        checkout = tmp_path / "checkout"
        checkout.mkdir()
        monkeypatch.chdir(checkout)
        monkeypatch.delenv("BLENDRAG_SERVER__API_KEY")
        doc = checkout / "zorblat.md"
        doc.write_text("# Zorblat\n\nQuintaro is the capital of Zorblat.\n")
        assert main(["ingest", str(doc)]) == 1
        assert "server answered 401" in capsys.readouterr().err
        assert main(["ingest", str(doc), "--api-key", API_KEY]) == 0
        out, err = capsys.readouterr()
        assert f"sending the work to the blendrag server at {server.url} (data dir {elsewhere})" in err
        assert re.search(r"succeeded; 1 of 1 file\(s\) ingested in \d+\.\d s\n", out), out
        monkeypatch.setenv("BLENDRAG_API_KEY", API_KEY)
        assert main(["ask", "What is the capital of Zorblat?", "--top-k", "1"]) == 0
        out, err = capsys.readouterr()
        assert "Sources:\n  [1] Zorblat (score" in out and f"at {server.url}" in err
        assert not (checkout / "data").exists()  # a question never creates a data dir
        # Named explicitly (no announcement to find): --server, then BLENDRAG_URL.
        monkeypatch.setenv("BLENDRAG_RUNTIME_DIR", str(tmp_path / "empty-runtime"))
        assert main(["ask", "What is the capital of Zorblat?", "--top-k", "1", "--server", server.url]) == 0
        assert "Sources:\n  [1] Zorblat (score" in capsys.readouterr().out
        monkeypatch.setenv("BLENDRAG_URL", server.url)
        assert main(["ask", "What is the capital of Zorblat?", "--top-k", "1"]) == 0
        assert "Sources:\n  [1] Zorblat (score" in capsys.readouterr().out
        assert not (checkout / "data").exists()
    finally:
        server.stop()


def test_with_two_servers_on_other_data_dirs_the_cli_asks_the_one_its_folder_started(
    cli_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trial: the checkout's server ran with `make serve DATA=/elsewhere`; `blendrag ask` there found no
    catalog in ./data and asked the newest server announced on the machine, another data dir's (an answer about
    Java, "Sources: none"). Now, from a folder neither was started in, the CLI lists both and exits non-zero;
    from the checkout, it asks the checkout's server, though the other one started later."""
    checkout, java, third = tmp_path / "checkout", tmp_path / "java-checkout", tmp_path / "third"
    for folder in (checkout, java, third):
        folder.mkdir()
    elsewhere, java_data = tmp_path / "elsewhere", tmp_path / "java-data"
    ours = Server(elsewhere, cli_env, checkout)
    try:
        newest = Server(java_data, cli_env, java)
        try:
            auth = {"Authorization": f"Bearer {API_KEY}"}
            doc = {"title": "Zorblat", "text": "Quintaro is the capital of Zorblat."}
            accepted = httpx.post(f"{ours.url}/ingest", headers=auth, json={"documents": [doc]}, timeout=30)
            assert accepted.status_code == 202, accepted.text
            job = f"{ours.url}/ingest/jobs/{accepted.json()['job_id']}"
            deadline = time.monotonic() + 60
            while httpx.get(job, headers=auth, timeout=10).json()["status"] != "succeeded":
                assert time.monotonic() < deadline
                time.sleep(0.1)

            monkeypatch.chdir(third)
            assert main(["ask", "What is the capital of Zorblat?", "--top-k", "1"]) == EXIT_BUSY
            assert capsys.readouterr().err == (
                f"error: data holds no catalog and 2 blendrag servers are running, none started from {third}; "
                "name one with --server URL (or BLENDRAG_URL), or run the command from the folder its "
                "`make serve` ran in:\n"
                f"  {newest.url}  data dir {java_data}  pid {newest.proc.pid}\n"
                f"  {ours.url}  data dir {elsewhere}  pid {ours.proc.pid}\n"
            )

            monkeypatch.chdir(checkout)
            assert main(["ask", "What is the capital of Zorblat?", "--top-k", "1"]) == 0
            out, err = capsys.readouterr()
            assert err.startswith(
                f"data holds no catalog; sending the work to the blendrag server at {ours.url} (data dir "
                f"{elsewhere}, started from this folder)\n"
            )
            assert "Sources:\n  [1] Zorblat (score" in out
            assert [(f / "data").exists() for f in (checkout, java, third)] == [False, False, False]
        finally:
            newest.stop()
    finally:
        ours.stop()
