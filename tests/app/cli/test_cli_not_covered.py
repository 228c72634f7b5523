"""`blendrag ask` says when the documents do not cover a question (the relevance floor at its shipped value for
the real MiniLM embedder), and lists the sources of one they cover."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main


def test_ask_says_the_documents_do_not_cover_the_question(
    monkeypatch: pytest.MonkeyPatch, tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLENDRAG_ENGINE__MODEL", str(tiny_llama_dir))
    monkeypatch.setenv("BLENDRAG_ENGINE__MAX_NEW_TOKENS", "2")
    monkeypatch.setenv("BLENDRAG_RETRIEVAL__RELEVANCE_FLOOR", "auto")
    data = ["--data-dir", str(tmp_path / "data")]
    (tmp_path / "zorblat.md").write_text("# Zorblat\n\nQuintaro is the capital of the planet Zorblat.\n")
    assert main(["ingest", str(tmp_path / "zorblat.md"), *data]) == 0
    capsys.readouterr()
    assert main(["ask", "How many calories are in a banana?", *data]) == 0
    out = capsys.readouterr().out
    assert "\nSources: none (the documents do not cover this question: the answer comes from the model alone)\n" in out
    assert main(["ask", "What is the capital of the planet Zorblat?", *data]) == 0
    assert "Sources:\n  [1] Zorblat" in capsys.readouterr().out
