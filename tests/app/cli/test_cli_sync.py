"""`blendrag sync` in-process on the tiny model, owning the data dir (through a server: test_api_syncs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.cli import main
from app.cli.sync import collection_for


@pytest.fixture
def tiny_env(monkeypatch: pytest.MonkeyPatch, tiny_llama_dir: Path, tmp_path: Path) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLENDRAG_ENGINE__MODEL", str(tiny_llama_dir))
    return tmp_path / "data"


SUMMARY = re.compile(r"^synced (?P<root>.+) into collection '(?P<collection>[^']+)': (?P<counts>.*) in \d+\.\d s$")


def counts(out: str) -> str:
    line = next(line for line in out.splitlines() if line.startswith("synced "))
    match = SUMMARY.match(line)
    assert match is not None, line
    return match["counts"]


def test_sync_keeps_the_collection_equal_to_the_folder(
    tiny_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "My Docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "zorblat.md").write_text("# Zorblat\n\nQuintaro is the capital of Zorblat.\n")
    (docs / "sub" / "bread.txt").write_text("Sourdough needs flour, water, salt and a starter.\n")
    (docs / "loop.md").symlink_to(docs / "loop.md")
    args = ["sync", str(docs), "--data-dir", str(tiny_env)]

    assert main(args) == 0
    captured = capsys.readouterr()
    assert f"synced {docs.resolve()} into collection 'My-Docs': " in captured.out
    assert counts(captured.out) == "2 added, 0 changed, 0 removed, 0 unchanged, 0 failed, 1 skipped"
    assert re.search(r"^KV: 2 of 2 chunk\(s\) computed in \d+\.\d\d s", captured.out, re.M), captured.out
    assert captured.err.endswith("\n  skipped loop.md: symlink loop\n")  # after the embedder's loading bar

    (docs / "zorblat.md").write_text("# Zorblat\n\nQuintaro is the capital of Zorblat. Its rivers are purple.\n")
    (docs / "sub" / "bread.txt").unlink()
    (docs / "loop.md").unlink()
    assert main(args) == 0
    assert counts(capsys.readouterr().out) == "0 added, 1 changed, 1 removed, 0 unchanged, 0 failed, 0 skipped"

    assert main(["ask", "What is the capital of Zorblat?", "--top-k", "1", "--data-dir", str(tiny_env)]) == 0
    assert "Sources:\n  [1] Zorblat" in capsys.readouterr().out
    assert main(["doctor", "--data-dir", str(tiny_env)]) == 0
    assert "committed chunks without fresh KV: 0" in capsys.readouterr().out


def test_bad_paths_and_collections_are_clear_errors(
    tiny_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sync", str(tmp_path / "missing"), "--data-dir", str(tiny_env)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'missing'}: no such folder\n"
    (tmp_path / "one.md").write_text("# One\n")
    assert main(["sync", str(tmp_path / "one.md"), "--data-dir", str(tiny_env)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'one.md'}: not a folder (`blendrag ingest` takes files)\n"
    folder = tmp_path / "notes"
    folder.mkdir()
    assert main(["sync", str(folder), "--collection", "no/slash", "--data-dir", str(tiny_env)]) == 2
    assert capsys.readouterr().err.startswith("error: --collection: collection 'no/slash': use 1-64 letters")
    assert not tiny_env.exists()  # refused before the data dir was touched


def test_the_default_collection_is_named_after_the_folder(tmp_path: Path) -> None:
    assert collection_for(tmp_path / "My Docs") == "My-Docs"
    assert collection_for(tmp_path / "notes.v2") == "notes.v2"
    assert collection_for(tmp_path / "___") == "folder"
    assert collection_for(tmp_path / ("x" * 80)) == "x" * 64
