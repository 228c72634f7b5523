"""A user's own GGUF file as engine.model: converted once under models/ exactly as a catalogue model is,
named by its GGUF header, and reused at the next start."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from engine.builtin import builtin_gguf_path
from engine.models.convert import ConversionError
from engine.models.resolve import resolve_model

pytestmark = pytest.mark.slow


def test_a_gguf_file_converts_once_to_the_same_weights_as_the_catalogue_model(
    tmp_path: Path, smollm2_dir: Path
) -> None:
    gguf = tmp_path / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.parent.mkdir()
    shutil.copy(builtin_gguf_path(), gguf)
    resolved = resolve_model(str(gguf), tmp_path / "models")
    assert resolved.path.parent == tmp_path / "models" and resolved.path.name.startswith("gguf-SmolLM2-135M")
    identity = resolved.identity
    assert (identity.name, identity.source, identity.architecture, identity.origin_quantisation) == (
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gguf",
        "llama",
        "Q4_1",
    )
    assert identity.display_name == "Smollm2 135M 8k Lc100K Mix1 Ep2"  # general.name of its header
    ours, theirs = load_file(resolved.path / "model.safetensors"), load_file(smollm2_dir / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)
    mtime = (resolved.path / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(str(gguf), tmp_path / "models").path == resolved.path  # converted once
    assert (resolved.path / "model.safetensors").stat().st_mtime_ns == mtime


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf file at all")
    with pytest.raises(ConversionError, match="model.gguf is not a readable GGUF file"):
        resolve_model(str(fake), tmp_path / "models")
    assert not any((tmp_path / "models").glob("gguf-*/config.json"))
