"""`blendrag ingest` says, before it starts, how many tokens the model will read and how long that takes at
this machine's measured prefill rate."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.cli import main
from app.cli.ingest_estimate import IngestEstimate, TokenCount, chunk_share, count_tokens, stored_rate
from app.settings import load_settings

ZORBLAT = "# Zorblat\n\nQuintaro is the capital of Zorblat.\n"
BREAD = "Sourdough needs flour, water, salt and a starter.\n"


def test_the_message_says_tokens_of_text_and_of_chunks_time_and_where_the_rate_comes_from() -> None:
    measured = IngestEstimate(19, TokenCount(82_650, 90_311, True), 68.0, "the server's", 64)
    assert measured.message() == (
        "19 file(s), 82,650 tokens of text, 90,311 in its chunks (each repeats up to 64 tokens of the one before): "
        "the model reads every chunk token once (KV precompute), about 22 min 8 s at 68 tokens/s (the server's "
        "measured prefill rate)"
    )  # the time is the chunks' (90,311 / 68 s), not the text's
    unmeasured = IngestEstimate(2, TokenCount(1_200, 1_371, False), None, "this data dir's", 64)
    assert unmeasured.message() == (
        "2 file(s), about 1,200 tokens of text, about 1,371 in its chunks (each repeats up to 64 tokens of the one "
        "before): the model reads every chunk token once (KV precompute); this data dir's prefill rate is not "
        "measured yet, so no time estimate"
    )


def test_uncounted_chunks_take_the_overlaps_share() -> None:
    from ingest.config import IngestSettings

    assert chunk_share(1_200, IngestSettings()) == 1_371  # 1,200 × 512 / (512 - 64)
    assert chunk_share(1_200, IngestSettings(chunk_overlap=0)) == 1_200


@pytest.fixture
def docs(tmp_path: Path) -> list[Path]:
    (tmp_path / "docs").mkdir()
    paths = [tmp_path / "docs" / "zorblat.md", tmp_path / "docs" / "bread.txt", tmp_path / "docs" / "broken.json"]
    for path, text in zip(paths, [ZORBLAT, BREAD, "[{"], strict=True):
        path.write_text(text)
    return paths


def test_tokens_are_counted_by_the_models_tokenizer(tiny_llama_dir: Path, tmp_path: Path, docs: list[Path]) -> None:
    settings = load_settings(data_dir=tmp_path / "data", engine={"model": str(tiny_llama_dir)})
    # One chunk each: its text's tokens and the separator that closes it ("\n\n", one token).
    assert count_tokens(docs[:2], settings) == TokenCount(32, 34, True)
    # A file that does not parse counts by its size (3 bytes // 4 = 0 tokens) and makes the count "about".
    assert count_tokens(docs, settings) == TokenCount(32, 34, False)
    # A model not ready here (a catalogue model never converted into this cache): characters / 4, and the chunks
    # the overlap's share more.
    bare = load_settings(data_dir=tmp_path / "data", engine={"model": "qwen2.5-coder-1.5b"}, models_dir=tmp_path)
    by_characters = [(len(ZORBLAT) - 1) // 4, (len(BREAD) - 1) // 4]
    assert count_tokens(docs[:2], bare) == TokenCount(
        sum(by_characters), sum(chunk_share(n, bare.ingest) for n in by_characters), False
    )


def test_ingest_prints_the_estimate_at_the_data_dirs_rate_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, tiny_llama_dir: Path, tmp_path: Path, docs: list[Path], capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLENDRAG_ENGINE__MODEL", str(tiny_llama_dir))
    data = tmp_path / "data"
    docs[2].unlink()
    assert main(["ingest", str(docs[0].parent), "--data-dir", str(data)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # The chunk tokens announced are the ones the KV cache then stores, said in the same words.
    [stored] = [line for line in lines if line.startswith("KV cache:")]
    assert re.fullmatch(r"KV cache: \+\S+ \S+ for 34 chunk tokens new to the store \(overlap included\), .+", stored)
    first = lines[0]
    assert first == (
        "2 file(s), 32 tokens of text, 34 in its chunks (each repeats up to 64 tokens of the one before): the model "
        "reads every chunk token once (KV precompute); this data dir's prefill rate is not measured yet, so no "
        "time estimate"
    )
    (data / "prefill_rate.json").write_text(json.dumps({"model": "any", "tokens_per_s": 0.5}))
    assert stored_rate(data) == 0.5
    assert main(["ingest", str(docs[0].parent), "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "2 file(s), 32 tokens of text, 34 in its chunks (each repeats up to 64 tokens of the one before): the model "
        "reads every chunk token once (KV precompute), about 1 min 8 s at 0.5 tokens/s (this data dir's measured "
        "prefill rate)"
    )
    # What the KV cache stored is said in the same unit: chunk tokens (none new: both chunks were stored before).
    assert [line for line in out if line.startswith("KV cache:")] == [
        "KV cache: +0 B for 0 chunk tokens new to the store (overlap included)"
    ]
