"""`blendrag ingest` says, before it starts, how many tokens the model will read and how long that takes at
this machine's measured prefill rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.cli.ingest_estimate import IngestEstimate, count_tokens, stored_rate
from app.settings import load_settings

ZORBLAT = "# Zorblat\n\nQuintaro is the capital of Zorblat.\n"
BREAD = "Sourdough needs flour, water, salt and a starter.\n"


def test_the_message_says_tokens_time_and_where_the_rate_comes_from() -> None:
    measured = IngestEstimate(19, 90_412, True, 68.0, "the server's")
    assert measured.message() == (
        "19 file(s), 90,412 tokens: the model reads every token once (KV precompute), about 22 min 10 s at 68 "
        "tokens/s (the server's measured prefill rate)"
    )
    unmeasured = IngestEstimate(2, 1_200, False, None, "this data dir's")
    assert unmeasured.message() == (
        "2 file(s), about 1,200 tokens: the model reads every token once (KV precompute); this data dir's "
        "prefill rate is not measured yet, so no time estimate"
    )


@pytest.fixture
def docs(tmp_path: Path) -> list[Path]:
    (tmp_path / "docs").mkdir()
    paths = [tmp_path / "docs" / "zorblat.md", tmp_path / "docs" / "bread.txt", tmp_path / "docs" / "broken.json"]
    for path, text in zip(paths, [ZORBLAT, BREAD, "[{"], strict=True):
        path.write_text(text)
    return paths


def test_tokens_are_counted_by_the_models_tokenizer(tiny_llama_dir: Path, tmp_path: Path, docs: list[Path]) -> None:
    settings = load_settings(data_dir=tmp_path / "data", engine={"model": str(tiny_llama_dir)})
    assert count_tokens(docs[:2], settings) == (32, True)
    # A file that does not parse counts by its size (3 bytes // 4 = 0 tokens) and makes the count "about".
    assert count_tokens(docs, settings) == (32, False)
    # A model not ready here (a catalogue model never converted into this cache): characters / 4.
    bare = load_settings(data_dir=tmp_path / "data", engine={"model": "qwen2.5-coder-1.5b"}, models_dir=tmp_path)
    assert count_tokens(docs[:2], bare) == ((len(ZORBLAT) - 1) // 4 + (len(BREAD) - 1) // 4, False)


def test_ingest_prints_the_estimate_at_the_data_dirs_rate_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, tiny_llama_dir: Path, tmp_path: Path, docs: list[Path], capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLENDRAG_ENGINE__MODEL", str(tiny_llama_dir))
    data = tmp_path / "data"
    docs[2].unlink()
    assert main(["ingest", str(docs[0].parent), "--data-dir", str(data)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (
        "2 file(s), 32 tokens: the model reads every token once (KV precompute); this data dir's prefill rate "
        "is not measured yet, so no time estimate"
    )
    (data / "prefill_rate.json").write_text(json.dumps({"model": "any", "tokens_per_s": 0.5}))
    assert stored_rate(data) == 0.5
    assert main(["ingest", str(docs[0].parent), "--data-dir", str(data)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "2 file(s), 32 tokens: the model reads every token once (KV precompute), about 1 min 4 s at 0.5 tokens/s "
        "(this data dir's measured prefill rate)"
    )
