"""The `blendrag` command line, in-process, on the tiny model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.cli import main


@pytest.fixture
def tiny_env(monkeypatch: pytest.MonkeyPatch, tiny_llama_dir: Path, tmp_path: Path) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLENDRAG_ENGINE__MODEL", str(tiny_llama_dir))
    monkeypatch.setenv("BLENDRAG_ENGINE__MAX_NEW_TOKENS", "4")
    return tmp_path / "data"


def test_ingest_ask_cache_doctor(tiny_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "zorblat.md").write_text("# Zorblat\n\nQuintaro is the capital of Zorblat.\n")
    (docs / "sub" / "bread.txt").write_text("Sourdough needs flour, water, salt and a starter.\n")
    (docs / ".hidden.txt").write_text("never ingested\n")

    assert main(["ingest", str(docs), "--data-dir", str(tiny_env)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"succeeded; 2 of 2 file\(s\) ingested in \d+\.\d s\n", out), out

    assert main(["ask", "What is the capital of Zorblat?", "--top-k", "1", "--data-dir", str(tiny_env)]) == 0
    out = capsys.readouterr().out
    assert "Sources:\n  [1] Zorblat" in out
    assert "mode blend" in out and "KV hits 1, misses 0" in out
    assert "\n[answer cut off at 4 tokens (raise it with --max-tokens)]\n" in out  # the random model never stops
    assert "conversation " not in out  # a one-off question is not stored

    first = ["ask", "What is the capital of Zorblat?", "--conversation", "new", "--top-k", "1"]
    assert main([*first, "--data-dir", str(tiny_env)]) == 0
    out = capsys.readouterr().out
    conversation = next(line for line in out.splitlines() if line.startswith("conversation ")).split()[1]

    # A follow-up in the same conversation: the first turn is in the prompt, from stored KV.
    args = ["ask", "And its rivers?", "--conversation", conversation, "--top-k", "1", "--data-dir", str(tiny_env)]
    assert main(args) == 0
    out = capsys.readouterr().out
    history = next(line for line in out.splitlines() if line.startswith("history: "))
    turn_tokens = int(history.split()[4])
    assert history == f"history: 1 earlier turn(s), {turn_tokens} tokens, {turn_tokens} from stored KV"
    assert f"conversation {conversation} " in out
    assert main(["ask", "q", "--conversation", "nope", "--data-dir", str(tiny_env)]) == 2
    assert capsys.readouterr().err == "error: --conversation: no conversation 'nope'\n"

    assert main(["cache", "stats", "--data-dir", str(tiny_env)]) == 0
    out = capsys.readouterr().out
    disk_line = next(line for line in out.splitlines() if line.startswith("disk"))
    assert disk_line.split()[1] == "4"  # two chunks and the two answered turns

    assert main(["doctor", "--data-dir", str(tiny_env)]) == 0
    assert "committed chunks without fresh KV: 0" in capsys.readouterr().out

    # losing an entry is found by doctor and repaired
    from app.catalog import Catalog

    catalog = Catalog(f"sqlite:///{tiny_env / 'catalog.db'}")
    key = catalog.iter_chunks()[0].kv_key  # a chunk's entry (the turns' entries are no chunk's)
    catalog.close()
    (tiny_env / "kv" / key[:2] / f"{key}.safetensors").unlink()
    assert main(["doctor", "--data-dir", str(tiny_env)]) == 1
    assert "committed chunks without fresh KV: 1 found" in capsys.readouterr().out
    assert main(["doctor", "--repair", "--data-dir", str(tiny_env)]) == 0
    assert main(["doctor", "--data-dir", str(tiny_env)]) == 0
    assert "committed chunks without fresh KV: 0" in capsys.readouterr().out


def test_errors_exit_non_zero_with_a_message(
    tiny_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["ingest", str(tmp_path / "missing"), "--data-dir", str(tiny_env)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["ask", "  ", "--data-dir", str(tiny_env)]) == 2
    assert "question must not be empty" in capsys.readouterr().err
    assert main(["ask", "q", "--ratio", "2", "--data-dir", str(tiny_env)]) == 2
    assert capsys.readouterr().err == "error: --ratio: Input should be less than or equal to 1\n"
    monkeypatch.setenv("BLENDRAG_ENGINE__MODE", "turbo")
    assert main(["ask", "q", "--data-dir", str(tiny_env)]) == 2
    assert "engine.mode" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["ask"])
    assert exc.value.code == 2


def test_ingest_shows_the_kv_bill_and_cache_convert_shrinks_it(
    tiny_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import human_bytes

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "zorblat.md").write_text("# Zorblat\n\nQuintaro is the capital of Zorblat.\n")
    (docs / "bread.txt").write_text("Sourdough needs flour, water, salt and a starter.\n")
    assert main(["ingest", str(docs), "--data-dir", str(tiny_env)]) == 0
    out = capsys.readouterr().out
    files = sorted((tiny_env / "kv").rglob("*.safetensors"))
    int4_bytes = sum(p.stat().st_size for p in files)
    line = next(x for x in out.splitlines() if x.startswith("KV cache: +"))
    assert line.startswith(f"KV cache: +{human_bytes(int4_bytes)} for ")

    # a store written in another format (as by an earlier version with fp16 entries) ...
    assert main(["cache", "convert", "--to", "fp16", "--data-dir", str(tiny_env)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("converted 2 entries to fp16")
    assert "set it to fp16" in captured.err  # new entries are still written in int4
    assert sorted((tiny_env / "kv").rglob("*.safetensors")) == files  # in place: same keys, same files
    fp16_bytes = sum(p.stat().st_size for p in files)
    assert fp16_bytes > int4_bytes
    # ... is still read as it is: the answer finds its KV (no recompute)
    assert main(["ask", "What is the capital of Zorblat?", "--top-k", "1", "--data-dir", str(tiny_env)]) == 0
    assert "KV hits 1, misses 0" in capsys.readouterr().out
    # ... and converted back in place; a rerun resumes with nothing left to do
    assert main(["cache", "convert", "--to", "int4", "--data-dir", str(tiny_env)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("converted 2 entries to int4") and captured.err == ""
    assert sum(p.stat().st_size for p in files) < fp16_bytes
    assert main(["cache", "convert", "--to", "int4", "--data-dir", str(tiny_env)]) == 0
    assert "converted 0 entries to int4" in capsys.readouterr().out
    assert main(["ask", "What is the capital of Zorblat?", "--top-k", "1", "--data-dir", str(tiny_env)]) == 0
    assert "KV hits 1, misses 0" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["cache", "convert", "--to", "int3", "--data-dir", str(tiny_env)])


def test_collections_and_keys(
    tiny_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ingest --collection`, `ask --collection` (repeatable) and `keys create|list|revoke`."""
    for team, text in (
        ("team-a", "Quintaro is the capital of Zorblat, say A."),
        ("team-b", "Zorblat: Quintaro, say B."),
    ):
        folder = tmp_path / team
        folder.mkdir()
        (folder / "zorblat.txt").write_text(text + "\n")  # the same source name in both: no replacement
        assert main(["ingest", str(folder), "--collection", team, "--data-dir", str(tiny_env)]) == 0
    capsys.readouterr()
    ask = ["ask", "What is the capital of Zorblat?", "--top-k", "4", "--data-dir", str(tiny_env)]
    assert main([*ask, "--collection", "team-b"]) == 0
    out = capsys.readouterr().out
    sources = [line for line in out.splitlines() if line.startswith("  [")]
    assert len(sources) == 1  # top-k 4, but only one document is in team-b
    assert main([*ask, "--collection", "team-a", "--collection", "team-b"]) == 0
    assert len([line for line in capsys.readouterr().out.splitlines() if line.startswith("  [")]) == 2
    assert main(["ingest", str(tmp_path / "team-a"), "--collection", "bad name", "--data-dir", str(tiny_env)]) == 2
    assert "--collection: collection 'bad name'" in capsys.readouterr().err

    keys = ["keys", "create", "team A", "--collection", "team-a", "--ingest", "--data-dir", str(tiny_env)]
    assert main(keys) == 2  # no admin key: a first collection key would lock the open server
    assert "set server.api_key" in capsys.readouterr().err
    monkeypatch.setenv("BLENDRAG_SERVER__API_KEY", "admin-secret")
    assert main(keys) == 0
    out = capsys.readouterr().out
    key_id = out.split()[1]
    assert out.splitlines()[0] == f"key {key_id} (team A): read and ingest team-a"
    assert out.splitlines()[1].startswith("secret (shown once, stored only as a hash): brk_")
    assert main(["keys", "list", "--data-dir", str(tiny_env)]) == 0
    listed = capsys.readouterr().out
    assert (
        listed.startswith(f"{key_id}  team A  collections=team-a  ingest=yes  created=") and "last_used=never" in listed
    )
    assert main(["keys", "revoke", key_id, "--data-dir", str(tiny_env)]) == 0
    assert main(["keys", "revoke", key_id, "--data-dir", str(tiny_env)]) == 1
    assert main(["keys", "list", "--data-dir", str(tiny_env)]) == 0
    assert capsys.readouterr().out.endswith("no collection keys\n")
